"""Overhead: the same requests measured by oneknob's CLI and by the hand-written loop, in turns.

Both run in fresh processes, one after the other, each turn in another order (loop, oneknob, then oneknob, loop;
with vLLM's three runs, the 6 orders of them in 6 turns: each runs first, second and last equally often, and right
after each of the others; a rotation let one run follow the same other one in most turns), so drift in the
machine's load and what one run leaves to the next hit all alike. What is timed:

* measurement phase: from "engine ready" to "NLL of the last length known". Hand loop: from `LLM(...)`
  returning to its last NLL. oneknob: from the worker reporting ready (JobProgress.engine_ready) to the
  last length measured, judged, journaled (fsync), cached and logged to MLflow (JobProgress.point).
  oneknob's part includes its per-run setup after the start (MLflow params, resolved_config.json).
* the same without the first length (the first request carries vLLM's warm-up: seconds on CPU).
* end to end: the process's wall time, imports, engine start and shutdown included (oneknob's also
  includes Hydra, the corpus, the tiny model's fingerprint and the job's files). A one-job run leaves MLflow
  to an uploader trailing its journal (oneknob.record.trail), so the command does not wait for the store;
  the bench waits for that upload before the next turn (so it never competes with it) and reports when
  MLflow held the whole run.

oneknob runs as `run.py experiment=mtp_prompt_logprobs reference=null cache=false search.bisect=false
search.suspects=false oracles=[nll]` (absolute mode, no cache, the grid only, without the suspect lengths the
resolution rules add beside it, each prompt's own logprobs without the top-k oracle's top-5 per position
(`benchmarks.oracles` measures what that costs): the exact requests of the loop, no reference run; on vLLM with
`engine.emulate_cuda_graphs=false`, as the loop's engine has no emulation), in a fresh
paths.root each time. The NLLs of both are compared: same engine, same prompts, same numbers.

On vLLM, oneknob runs twice per turn: as a rerun of a configuration vLLM has already checked on this machine
(its check cached in ~/.cache/oneknob/vllm-checks: the "oneknob" column), and as the first run of a new
configuration (`oneknob, check not cached`: the machine cache of a machine that ran oneknob before, without any of
vLLM's checks, so vLLM's config check runs: in the job's worker, which imports vLLM once for the check and its
engine). vLLM's own cache (its model-class inspection) is the machine's in both. What a machine pays once, whatever
the configuration (oneknob's template of an empty MLflow store, per MLflow version: without it the command opens
MLflow itself, about 3 s more), is in neither; RESULTS.md gives it apart.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from benchmarks.common import PYTHON, fmt, last_json, load, median, run_timed, spread, tmpdir

LENGTHS = [128, 200, 256, 257, 300, 480, 512, 513, 600, 768, 1024]  # experiments/mtp_prompt_logprobs.yaml
SAMPLES = 2


def hand_loop(engine: str, root: Path) -> dict:
    wall, stdout = run_timed([PYTHON, "-m", "benchmarks.hand_loop", "--engine", engine,
                              "--lengths", ",".join(map(str, LENGTHS)), "--samples", str(SAMPLES)],
                             root / "hand_loop.log")
    record = last_json(stdout)
    after = record["after_length_s"]
    return {"measure_s": record["measure_s"], "after_first_s": after[-1] - after[0], "e2e_s": wall,
            "nll": {int(k): v for k, v in record["nll"].items()}}


def _overrides(engine: str, root: Path) -> list[str]:
    return ["experiment=mtp_prompt_logprobs", f"engine={engine}", "reference=null", "cache=false",
            "search.bisect=false", "search.suspects=false",  # the grid's lengths alone: the loop's requests
            # the prompt's own logprobs alone (prompt_logprobs=0), as the loop asks: the default oracles add the
            # top-5 per position (prompt_logprobs=5), more work in vLLM, measured apart (benchmarks.oracles)
            "oracles=[nll]",
            # the loop's engine has no emulated graphs: the same requests on the same engine
            *(["engine.emulate_cuda_graphs=false"] if engine == "vllm" else []),
            f"lengths=[{','.join(map(str, LENGTHS))}]", f"samples={SAMPLES}", f"paths.root={root}",
            f"hydra.run.dir={root}/run"]


def _machine_cache(root: Path) -> dict[str, str]:
    """A machine cache of oneknob's own (vLLM's checks) in `root`; vLLM's cache stays the machine's."""
    import os

    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return {"XDG_CACHE_HOME": str(root / "xdg"), "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT")
            or str(Path(home) / "vllm")}


def _first_run_cache(warm: Path, root: Path) -> Path:
    """`root`, holding the rerun's machine cache without vLLM's checks: a new configuration on a used machine."""
    import shutil

    shutil.copytree(warm / "xdg", root / "xdg", ignore=lambda _, names: [n for n in names if n == "vllm-checks"])
    return root


def oneknob(engine: str, root: Path, machine_cache: Path | None = None, extra: tuple[str, ...] = ()) -> dict:
    timing = root / "timing.json"
    wall, _ = run_timed([PYTHON, "-m", "benchmarks.oneknob_cli", *_overrides(engine, root), *extra],
                        root / "oneknob.log", env={"BENCH_TIMING": str(timing),
                                                   **(_machine_cache(machine_cache) if machine_cache else {})})
    import json
    import time

    from oneknob.record import trail

    waited = time.perf_counter()
    if trail.wait(f"sqlite:///{root}/mlruns/mlflow.db", timeout_s=600):
        raise RuntimeError(f"overhead/{engine}: the run's upload to MLflow did not finish; see {root}/run/upload.log")
    marks = json.loads(timing.read_text())
    (ready,), points = marks["ready"], marks["point"]
    if sorted(length for length, _, _ in points) != LENGTHS:  # the same requests as the loop, or no ratio
        raise RuntimeError(f"overhead/{engine}: oneknob measured lengths {[p[0] for p in points]}, not the loop's "
                           f"{LENGTHS}")
    return {"measure_s": points[-1][1] - ready, "after_first_s": points[-1][1] - points[0][1], "e2e_s": wall,
            "mlflow_s": wall + time.perf_counter() - waited, "nll": {length: nll for length, _, nll in points}}


def bench(engine: str, repeats: int, log=print) -> dict:
    if engine == "vllm":  # a fresh clone has no model yet; the hand loop reads it from models/tiny-mtp
        from benchmarks.hand_loop import MODEL
        from oneknob.provision import tiny_model

        tiny_model.ensure(Path(MODEL))
    runs: dict[str, list[dict]] = {"loop": [], "oneknob": [], **({"first": []} if engine == "vllm" else {})}
    warm = tmpdir(f"overhead-{engine}-machine-cache")
    if engine == "vllm":  # the "oneknob" runs are reruns: vLLM has checked this configuration on this machine
        run_timed([PYTHON, "-m", "benchmarks.oneknob_cli", *_overrides(engine, warm), "dry_run=true"],
                  warm / "warm-up.log", env=_machine_cache(warm))
        # and the machine has run this engine once (vLLM's compile cache under VLLM_CACHE_ROOT, the page cache): not
        # timed, else the first run of the first turn pays it (2.5 s more in the measurement, 20 s end to end, here)
        hand_loop(engine, tmpdir(f"overhead-{engine}-warm-up"))
    orders = list(itertools.permutations(runs))  # turn after turn: every order of the runs, then again
    for turn in range(repeats):
        order = orders[turn % len(orders)]
        for who in order:
            root = tmpdir(f"overhead-{engine}-{who}")
            before = load()
            result = hand_loop(engine, root) if who == "loop" else \
                oneknob(engine, root, warm if engine == "vllm" and who == "oneknob" else
                        _first_run_cache(warm, root) if who == "first" else None)
            result["load"] = before
            runs[who].append(result)
            log(f"  overhead {engine} turn {turn + 1}/{repeats} {who:7s}: measure {fmt(result['measure_s'])}, "
                f"w/o first {fmt(result['after_first_s'])}, e2e {fmt(result['e2e_s'])} (load {before})")
    nll_gap = max(abs(a["nll"][L] - b["nll"][L]) for a in runs["loop"] for who in runs if who != "loop"
                  for b in runs[who] for L in LENGTHS)
    if nll_gap > 1e-4:  # a ratio of timings means nothing unless both sides computed the same numbers
        raise RuntimeError(f"overhead/{engine}: oneknob and the loop disagree by {nll_gap:.3g} nats: they did not "
                           "run the same requests on the same engine")
    summary = {"engine": engine, "repeats": repeats, "requests": len(LENGTHS) * SAMPLES, "runs": runs,
               "max_nll_gap": nll_gap}
    for key in ("measure_s", "after_first_s", "e2e_s", *(["e2e_first_s"] if "first" in runs else [])):
        field, who = ("e2e_s", "first") if key == "e2e_first_s" else (key, "oneknob")
        loop = [r[field] for r in runs["loop"]]
        ok = [r[field] for r in runs[who]]
        summary[key] = {"loop": median(loop), "oneknob": median(ok), "loop_spread": spread(loop),
                        "oneknob_spread": spread(ok), "ratio": median(ok) / median(loop),
                        "ratios": [o / lp for o, lp in zip(ok, loop)]}
    return summary


def markdown(results: list[dict]) -> str:
    lines = ["| engine | what is timed | hand loop, median (min..max) | oneknob, median (min..max) | "
             "oneknob / loop (median; per turn) |", "|---|---|---|---|---|"]
    names = {"measure_s": "measurement phase (ready -> last NLL)", "after_first_s": "... without the first length",
             "e2e_s": "end to end (process wall)",
             "e2e_first_s": "end to end, first run of a new configuration (vLLM's check not cached)"}
    for summary in results:
        for key, name in names.items():
            if key not in summary:
                continue
            if key == "e2e_s" and "e2e_first_s" in summary:
                name = "end to end, a rerun (vLLM's check cached)"
            s = summary[key]
            per_turn = ", ".join(f"{r:.3f}" for r in s["ratios"])
            lines.append(f"| {summary['engine']} | {name} | {fmt(s['loop'])} ({s['loop_spread']} s) | "
                         f"{fmt(s['oneknob'])} ({s['oneknob_spread']} s) | **{s['ratio']:.3f}** ({per_turn}) |")
    lines.append("")
    for summary in results:
        loads = ", ".join(r["load"] for runs in summary["runs"].values() for r in runs)
        lines.append(f"- {summary['engine']}: {summary['repeats']} turns x {summary['requests']} requests "
                     f"({len(LENGTHS)} lengths x {SAMPLES} samples); largest NLL difference oneknob vs loop "
                     f"{summary['max_nll_gap']:.2g}; MLflow held oneknob's whole run (its uploader done) "
                     f"{fmt(median([r['mlflow_s'] for r in summary['runs']['oneknob']]))} after its command "
                     f"started (median); load (1/5/15 min) before each run: {loads}")
    return "\n".join(lines)
