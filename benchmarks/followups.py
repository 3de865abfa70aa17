"""What a follow-up run costs (explain.followups): when its prediction holds, and when it does not.

    python run.py -m cudagraph.enforce_eager=false,true engine=E explain.followups=1     # holds: 512|513 -> 384|385
    python run.py -m ... engine.fault.edge=twice_seqs_x_query_len engine.fault.edge_offset=-600 explain.followups=2

Each sweep runs twice from a fresh root: with explain.followups=0 (the configured jobs alone) and with the
follow-ups, so the difference in wall time is what they added. Per follow-up: its engine starts (paths.cache's
workers.jsonl, role job, after the configured jobs' starts), its probes (the run's MLflow metric `probes`) and its
MLflow run's duration. The target: one engine start and at most 4 probes when the prediction holds. In the second
sweep the edge follows 2 x max_num_seqs x (K+1) - 600, so the first follow-up (the capture size) finds it stayed
(4 probes settle it), and the second (max_num_seqs, which moves both of its multiples) finds it neither where the
prediction put it nor where it was: the full search over the grid.
"""

from __future__ import annotations

import json

from benchmarks.common import PYTHON, load, run_timed, tmpdir

HOLDS = ["cudagraph.enforce_eager=false,true"]
FAILS = ["cudagraph.enforce_eager=false,true", "engine.fault.edge=twice_seqs_x_query_len",
         "engine.fault.edge_offset=-600"]


def _sweep(engine: str, overrides: list[str], followups: int, log=print) -> dict:
    from mlflow.tracking import MlflowClient

    root = tmpdir(f"followups-{engine}")
    wall, _ = run_timed([PYTHON, "run.py", "-m", f"engine={engine}", *overrides, f"explain.followups={followups}",
                         "samples=1", f"paths.root={root}", f"hydra.sweep.dir={root}/sweep"], root / "sweep.log")
    summary = json.loads((root / "sweep" / "summary.json").read_text())
    client = MlflowClient(f"sqlite:///{root}/mlruns/mlflow.db")
    runs = {r["name"]: r for r in summary["runs"]}
    found = []
    for name, run in runs.items():
        if not run.get("followup"):
            continue
        info = client.get_run(run["run_id"]).info
        starts = [json.loads(line) for line in (root / ".cache" / "oneknob" / "workers.jsonl").read_text()
                  .splitlines() if '"start"' in line]
        found.append({"name": name, "probes": run["probes"], "seconds": (info.end_time - info.start_time) / 1000,
                      "starts": sum(1 for s in starts if s.get("role") == "job"
                                    and info.start_time <= s.get("time", 0) * 1000 <= info.end_time),
                      "transitions": [f"{t['lo']}|{t['hi']}" for t in run["transitions"]],
                      "predicted": "{}|{}".format(*run["followup_of"]["predicted"])})
    conclusion = summary["conclusions"][0]["text"] if summary["conclusions"] else ""
    log(f"  {engine} followups={followups}: {wall:.1f} s, {len(found)} follow-up(s)")
    return {"wall_s": wall, "followups": found, "conclusion": conclusion, "load": load()}


def bench(engine: str = "synthetic", log=print) -> list[dict]:
    results = []
    for case, overrides, budget in (("holds", HOLDS, 1), ("does not hold", FAILS, 2)):
        alone = _sweep(engine, overrides, 0, log)
        with_followups = _sweep(engine, overrides, budget, log)
        results.append({"case": case, "engine": engine, "alone": alone, "with": with_followups})
    return results


def markdown(results: list[dict]) -> str:
    lines = ["| case | follow-up | predicted | found | engine starts | probes | its run | sweep wall: without / with "
             "follow-ups |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for f in r["with"]["followups"]:
            lines.append(f"| {r['case']} ({r['engine']}) | {f['name']} | {f['predicted']} | "
                         f"{', '.join(f['transitions']) or 'none'} | {f['starts']} | {f['probes']} | "
                         f"{f['seconds']:.1f} s | {r['alone']['wall_s']:.1f} s / {r['with']['wall_s']:.1f} s |")
    lines += [""] + [f"- {r['case']}: {r['with']['conclusion']}" for r in results]
    return "\n".join(lines)
