"""Refusals: how long bad input takes to be refused (exit 2, nothing started, nothing recorded).

Each command is `run.py engine=synthetic <override>` in a fresh working directory, timed end to end (the
process's wall time: the interpreter, imports, Hydra and oneknob's checks). The commands cover each place a
refusal can come from: oneknob's checks of the command line before Hydra composes (`bisect=yes`), Hydra's own
composition (`nosuchkey=1`, with oneknob's "did you mean"), and oneknob's plan of the composed config
(`cudagraph.capture=-5`, `samples=0`). Every turn runs each command once, in a rotated order; the exit code
and the refusal's text are checked each time. The target is 0.5 s.
"""

from __future__ import annotations

import subprocess
import time

from benchmarks.common import PYTHON, REPO, load, median, spread, tmpdir

TARGET_S = 0.5
CASES = {  # override -> a piece of the refusal's text
    "bisect=yes": "bisect is true or false",
    "nosuchkey=1": "nothing was started and no run was recorded",
    "cudagraph.capture=-5": "cudagraph.capture=-5",
    "samples=0": "samples=0: need at least one prompt per length",
}


def refused(override: str, expected: str) -> float:
    root = tmpdir("refusal")
    started = time.perf_counter()
    done = subprocess.run([PYTHON, str(REPO / "run.py"), "engine=synthetic", override], cwd=root,
                          capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - started
    said = done.stdout + done.stderr
    if done.returncode != 2 or expected not in said:
        raise RuntimeError(f"run.py engine=synthetic {override}: exit {done.returncode}, expected 2 and "
                           f"{expected!r}:\n{said[-2000:]}")
    if (root / "mlruns").exists() or (root / ".cache").exists():
        left = sorted(p.name for p in root.iterdir())
        raise RuntimeError(f"run.py engine=synthetic {override}: refused, yet it left {left}")
    return wall


def bench(repeats: int, log=print) -> dict:
    walls: dict[str, list[float]] = {case: [] for case in CASES}
    before = load()
    refused("samples=0", CASES["samples=0"])  # warm the page cache once, as any second command finds it
    names = list(CASES)
    for turn in range(repeats):
        for case in names[turn % len(names):] + names[:turn % len(names)]:
            walls[case].append(refused(case, CASES[case]))
        log(f"refusals turn {turn + 1}/{repeats}: " + ", ".join(f"{c} {walls[c][-1]:.2f} s" for c in names))
    return {"walls": walls, "load": before}


def markdown(result: dict) -> str:
    rows = ["| command | median (s) | spread (s) | at the 0.5 s target |", "|---|---|---|---|"]
    for case, walls in result["walls"].items():
        rows.append(f"| `run.py engine=synthetic {case}` | {median(walls):.2f} | {spread(walls)} | "
                    f"{'yes' if median(walls) <= TARGET_S else 'no'} |")
    turns = len(next(iter(result["walls"].values())))
    return "\n".join(rows) + f"\n\nMedians of {turns} turns; load (1/5/15 min) before: {result['load']}."
