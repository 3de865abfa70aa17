"""oneknob's own work per measured length, between two engine requests (judge, journal, cache, MLflow).

    python -m benchmarks.bookkeeping [--turns 5] [--engine synthetic] [--trail both|true|false]

A real job (run_job, in this process, as Hydra's launcher runs it) measures the seed's 11 lengths x 2 samples
against a reference (the default one), with cache=false so every length is measured. Two clocks are kept by
wrapping the job's own methods, nothing else changed: the time spent in `Job._points` and `Job._record_length`
(one length: its requests, judging, the point cache; the journal, the metrics to MLflow, the progress line) and
the time spent in the engine session's `score` (the request: the pipe to the worker and the engine). Bookkeeping
per length is their difference (and the measuring thread's own CPU time, time.thread_time, the same way: less
sensitive to a shared machine's load than wall time); it is on the measurement's critical path (nothing else runs
between two requests). The reference is measured before the first length (prefetch), so it is in neither clock. `--trail
true` is a one-job run on a local store (MLflow in an uploader of its own), `false` a job as sweeps run it
(MLflow in-process, metrics batched). Prints per turn the per-length median and max and the per-request mean;
then the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks.common import REPO, load, tmpdir


def one_run(engine: str, trail: bool, root) -> dict:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import oneknob.config.schema  # noqa: F401  (registers the structured schema)
    from oneknob.plan import jobs as planning
    from oneknob.run import executor
    from oneknob.study import job as job_module

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={root}", f"hydra.run.dir={root}/run", f"engine={engine}",
                                           "experiment=mtp_prompt_logprobs", "cache=false", "search.bisect=false",
                                           "search.suspects=false", "engine.emulate_cuda_graphs=false",
                                           f"tracking.trail={str(trail).lower()}"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    plan = planning.plan_job(cfg)
    per_length, scored = [], []
    points, record, score = job_module.Job._points, job_module.Job._record_length, executor.EngineSession.score
    clocks: dict[int, list[float]] = {}  # length -> [wall, engine wall, requests, CPU outside the engine]

    def timed(method, length, *args):
        before = len(scored)
        started, cpu = time.perf_counter(), time.thread_time()
        result = method(length, *args)
        clock = clocks.setdefault(length, [0.0, 0.0, 0, 0.0])
        clock[0] += time.perf_counter() - started
        clock[1] += sum(s for s, _ in scored[before:])
        clock[2] += len(scored) - before
        clock[3] += time.thread_time() - cpu - sum(c for _, c in scored[before:])
        return result

    def timed_points(self, cache, length, measure):  # the requests of one length, judged, the cache written
        return timed(lambda *a: points(self, cache, *a), length, measure)

    def timed_record(self, length, judged):  # its journal records, metrics, progress line
        return timed(lambda *a: record(self, *a), length, judged)

    def timed_score(self, *args, **kwargs):
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return score(self, *args, **kwargs)
        finally:
            scored.append((time.perf_counter() - started, time.thread_time() - cpu))

    job_module.Job._points, job_module.Job._record_length = timed_points, timed_record
    executor.EngineSession.score = timed_score
    try:
        outcome = job_module.run_job(plan, root / "job")
    finally:
        job_module.Job._points, job_module.Job._record_length = points, record
        executor.EngineSession.score = score
    per_length = [tuple(clock) for clock in clocks.values() if clock[2]]  # measured here, not the reference's
    assert outcome["status"] == "ok", outcome
    own = [total - engine_s for total, engine_s, _, _ in per_length]
    requests = sum(n for _, _, n, _ in per_length)
    return {"lengths": len(per_length), "requests": requests, "median_ms": statistics.median(own) * 1e3,
            "max_ms": max(own) * 1e3, "per_request_ms": sum(own) / max(requests, 1) * 1e3,
            "cpu_ms": statistics.median(c for *_, c in per_length) * 1e3,
            "engine_ms_per_length": statistics.median(e for _, e, _, _ in per_length) * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--engine", default="synthetic")
    parser.add_argument("--trail", default="both", choices=["both", "true", "false"])
    args = parser.parse_args(argv)
    modes = [True, False] if args.trail == "both" else [args.trail == "true"]
    rows: dict[bool, list[dict]] = {mode: [] for mode in modes}
    for turn in range(args.turns):
        for mode in (modes if turn % 2 == 0 else modes[::-1]):
            before = load()
            found = one_run(args.engine, mode, tmpdir("bookkeeping"))
            rows[mode].append(found)
            print(f"turn {turn} trail={mode}: per length median {found['median_ms']:.2f} ms, max "
                  f"{found['max_ms']:.2f} ms, per request {found['per_request_ms']:.2f} ms, measuring thread's CPU "
                  f"per length {found['cpu_ms']:.2f} ms ({found['lengths']} "
                  f"lengths, {found['requests']} requests, engine {found['engine_ms_per_length']:.1f} ms per "
                  f"length); load before {before}", flush=True)
    for mode, found in rows.items():
        medians = [f["median_ms"] for f in found]
        print(f"trail={mode}: bookkeeping per length, median of {len(found)} turns {statistics.median(medians):.2f} "
              f"ms (turn medians {min(medians):.2f}..{max(medians):.2f}); largest single length "
              f"{max(f['max_ms'] for f in found):.2f} ms; per request "
              f"{statistics.median(f['per_request_ms'] for f in found):.2f} ms; the measuring thread's CPU per "
              f"length (median) {statistics.median(f['cpu_ms'] for f in found):.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
