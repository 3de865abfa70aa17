"""Engine starts per sweep of the seed's study, and a rerun of the finished sweep.

    python run.py -m experiment=mtp_prompt_logprobs engine=E  (twice, same paths.root)

Counted, not assumed: engine starts are the "start" events of paths.cache/workers.jsonl (one per worker
process the executor spawns, by role); distinct resolved configs are read back from what the engines
reported: each job dir's resolved_config.json (the configs measured) and the point cache's meta.json
files (every config an engine resolved, including a variant's unpinned config that single_variable's
pin policy started to see its side effects, and then replaced by the pinned one).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import PYTHON, load, run_timed, tmpdir
from oneknob.record import store


def _starts(root: Path) -> list[dict]:
    return [r for r in store.read_jsonl(root / ".cache" / "oneknob" / "workers.jsonl") if r["event"] == "start"]


def _canonical(resolved: dict) -> str:
    return json.dumps(resolved, sort_keys=True)


def _sweep(engine: str, root: Path, sweep_dir: Path, extra: list[str]) -> dict:
    before = len(_starts(root))
    load_before = load()
    wall, _ = run_timed([PYTHON, "run.py", "-m", "experiment=mtp_prompt_logprobs",
                         f"engine={engine}", f"paths.root={root}", f"hydra.sweep.dir={sweep_dir}", *extra],
                        root / "sweeps.log")
    starts = _starts(root)[before:]
    job_dirs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit())
    results = [json.loads((d / "result.json").read_text()) for d in job_dirs if (d / "result.json").exists()]
    measured = {_canonical(json.loads((d / "resolved_config.json").read_text()))
                for d in job_dirs if (d / "resolved_config.json").exists()}
    seen = {_canonical(json.loads(m.read_text())["resolved"])
            for m in (root / ".cache" / "oneknob" / "points").glob("*/meta.json")}
    return {"wall_s": wall, "load": load_before, "jobs": len(job_dirs),
            "statuses": [r.get("status") for r in results],
            "starts": len(starts), "starts_reference": sum(s["role"] == "reference" for s in starts),
            "starts_job": sum(s["role"] == "job" for s in starts),
            "distinct_measured": len(measured), "distinct_resolved_seen": len(seen),
            "points_measured": sum(r.get("points_measured", 0) for r in results),
            "points_cached": sum(r.get("points_cached", 0) for r in results),
            "boundaries": {f"{r.get('knob')}={r.get('value')}" if r.get("knob") else "baseline":
                           f"{r.get('last_polluted')}|{r.get('first_clean')}" for r in results}}


def bench(engine: str, extra: list[str] | None = None, log=print) -> dict:
    root = tmpdir(f"sweep-{engine}")
    first = _sweep(engine, root, root / "sweep1", extra or [])
    log(f"  sweep {engine}: {first['starts']} starts ({first['starts_reference']} reference), "
        f"{first['distinct_measured']} distinct measured configs, {first['wall_s']:.1f} s")
    rerun = _sweep(engine, root, root / "sweep2", extra or [])
    log(f"  rerun {engine}: {rerun['starts']} starts, {rerun['wall_s']:.1f} s")
    return {"engine": engine, "extra": extra or [], "root": str(root), "first": first, "rerun": rerun}


def markdown(results: list[dict]) -> str:
    lines = ["| engine | sweep | jobs (status) | engine starts: all = job + reference | distinct resolved configs: "
             "measured / all engines reported | points measured / cached | wall | load before |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for name in ("first", "rerun"):
            s = r[name]
            statuses = ", ".join(f"{n} {st}" for st in sorted(set(s["statuses"]))
                                 for n in [s["statuses"].count(st)])
            lines.append(f"| {r['engine']} | {name} | {s['jobs']} ({statuses}) | **{s['starts']}** = "
                         f"{s['starts_job']} + {s['starts_reference']} | {s['distinct_measured']} / "
                         f"{s['distinct_resolved_seen']} | {s['points_measured']} / {s['points_cached']} | "
                         f"{s['wall_s']:.1f} s | {s['load']} |")
    return "\n".join(lines)
