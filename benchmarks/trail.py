"""The trailing uploader's share of a one-job run: MLflow trailing the journal in a process of its own
(tracking.trail=true, the default) against the command writing MLflow itself (tracking.trail=false), and both
against the hand-written loop, in turns (each turn starts with the next arm: drift hits all three).

    python -m benchmarks.trail [--turns 3] [--engine vllm]

The runs are benchmarks.overhead's: the same requests, the same clocks (measurement phase, the same without the
first length, end to end), vLLM's check cached. The uploader replays the journal into MLflow every 0.5 s while
the job runs, on the same cores as the engine: if it competed with the requests, trail=true would be the slower
arm. Prints every run, then the medians and their ratios to the loop's.
"""

from __future__ import annotations

import argparse

from benchmarks import overhead
from benchmarks.common import PYTHON, fmt, load, median, run_timed, tmpdir

ARMS = {"loop": None, "trail": (), "no trail": ("tracking.trail=false",)}
CLOCKS = ("measure_s", "after_first_s", "e2e_s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trail", description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--engine", default="vllm", choices=("vllm", "synthetic"))
    args = parser.parse_args(argv)
    warm = tmpdir(f"trail-{args.engine}-machine-cache")
    run_timed([PYTHON, "-m", "benchmarks.oneknob_cli", *overhead._overrides(args.engine, warm), "dry_run=true"],
              warm / "warm-up.log", env=overhead._machine_cache(warm))  # vLLM's check, cached for every arm
    names = list(ARMS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for turn in range(args.turns):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            root, before = tmpdir(f"trail-{args.engine}"), load()
            found = overhead.hand_loop(args.engine, root) if ARMS[name] is None else \
                overhead.oneknob(args.engine, root, warm, extra=ARMS[name])
            runs[name].append(found)
            print(f"turn {turn + 1}/{args.turns} {name:8s}: " + ", ".join(f"{key} {fmt(found[key])}" for key in CLOCKS)
                  + f" (load {before})", flush=True)
    loop = {key: median([r[key] for r in runs["loop"]]) for key in CLOCKS}
    for name in names:
        medians = {key: median([r[key] for r in runs[name]]) for key in CLOCKS}
        print(f"median {name:8s}: " + ", ".join(f"{key} {fmt(medians[key])} ({medians[key] / loop[key]:.3f}x)"
                                                 for key in CLOCKS), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
