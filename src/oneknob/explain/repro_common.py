"""The part of repro.py that does not depend on how vLLM is run: the prompts, the study's verdict, the output,
the command line. Each configuration is scored in a process of its own (the script run again with --score NAME):
its environment must be set before vLLM is imported, and nothing of one engine (a CUDA graph pool, an emulated
one, a server) may outlive it into the next.

oneknob.explain.repro writes repro.py as one study's data (in place of the placeholders above the marker), the
engine's `score` (repro_offline.py or repro_server.py) and this file's code from the marker on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CONFIGS: dict = {}  # name -> {"run": the run it comes from, ...: how the engine is built}
ORDER = ("polluted", "clean")  # the configuration under test, then the one it is judged against (--configs)
SIDES: dict = {}  # {"polluted": L, "clean": L'}: the boundary's two sides, in prompt tokens
TOLERANCE: dict = {}  # {"nll": nats, "rtol": fraction}: the study's verdict
EMULATION: dict = {}  # the variables that turn on oneknob's CUDA-graph-pool emulation (vLLM's CPU build), or {}
PROMPTS = "repro_prompts.json"  # beside this script: {"samples": [[token id, ...], ...]}

# --- code ---
MARK = "repro-result: "


def prompts() -> list[list[int]]:
    path = Path(__file__).with_name(PROMPTS)
    if not path.is_file():
        sys.exit(f"{path}: not found. It holds the prompts' token ids; it is written beside repro.py (and is an "
                 "artifact of the sweep's parent run in MLflow).")
    return json.loads(path.read_text())["samples"]


def differs(nll_value: float, against: float) -> bool:
    """The study's verdict: polluted when |NLL - NLL of the other| is over both tolerances."""
    gap = abs(nll_value - against)
    return gap > TOLERANCE["nll"] and gap > TOLERANCE["rtol"] * abs(against)


def judge(results: dict[str, dict[str, list[float]]], names: list[str]) -> bool:
    """Print each configuration's mean NLL per length and whether the boundary reproduced: at the polluted side
    the tested configuration differs from the other beyond the study's tolerance (in any sample: the study counts
    a length polluted when any sample is), at the clean side it does not (in no sample)."""
    tested, against = names
    heads = [f"{name}: {CONFIGS[name]['run']}" for name in names]
    width = max(len(h) for h in heads)
    count = len(results[tested][str(SIDES["polluted"])])
    print(f"mean NLL per prompt length ({count} sample{'s' if count != 1 else ''})")
    print(f"{'prompt tokens':>13}  {heads[0]:>{width}}  {heads[1]:>{width}}  {'|difference|':>12}  verdict")
    verdicts = {}
    for side in ("polluted", "clean"):
        length = str(SIDES[side])
        mine, theirs = results[tested][length], results[against][length]
        verdicts[side] = any(differs(a, b) for a, b in zip(mine, theirs))
        gap = max(abs(a - b) for a, b in zip(mine, theirs))
        print(f"{length:>13}  {sum(mine) / len(mine):>{width}.3f}  {sum(theirs) / len(theirs):>{width}.3f}  "
              f"{gap:>12.3f}  {'differs' if verdicts[side] else 'agrees'} (the study: {side} here)")
    print(f"differs: |NLL - NLL of {against}| > {TOLERANCE['nll']} nats and > {100 * TOLERANCE['rtol']:g} % of it "
          "in some sample (the study's verdict)")
    return verdicts["polluted"] and not verdicts["clean"]


def emulation_ready() -> str | None:
    """Why the CUDA-graph-pool emulation cannot run here, or None: it is oneknob's vLLM plugin."""
    if not EMULATION:
        return None
    from importlib import metadata

    if not any(e.name == "oneknob" for e in metadata.entry_points(group="vllm.general_plugins")):
        return ("vLLM's CPU build runs no CUDA graphs: this reproduction needs oneknob's emulation of their output "
                "pool (the vllm.general_plugins entry point 'oneknob'), which is not installed in this Python. Run "
                "it with the study's Python (oneknob's .venv), or on a GPU with the study's LLM(...) arguments.")
    return None


def main(argv: list[str], score) -> int:
    """`score(name, samples)`: the engine's, run in the child process."""
    if argv[:1] == ["--score"]:
        print(MARK + json.dumps(score(argv[1], prompts())), flush=True)
        return 0
    names = list(ORDER)
    if argv[:1] == ["--configs"] and len(argv) == 3 and all(n in CONFIGS for n in argv[1:]):
        names = argv[1:]
    elif argv:
        print(f"usage: python {Path(__file__).name} [--configs TESTED AGAINST], each one of {', '.join(CONFIGS)}",
              file=sys.stderr)
        return 2
    if (why := emulation_ready()) is not None:
        print(why, file=sys.stderr)
        return 2
    results = {}
    for name in dict.fromkeys(names):
        print(f"{name}: starting {CONFIGS[name]['run']}'s engine", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, __file__, "--score", name], stdout=subprocess.PIPE, text=True)
        found = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
        if done.returncode or not found:
            sys.stderr.write(done.stdout)
            print(f"{name}: the engine failed (exit {done.returncode}); its log is above", file=sys.stderr)
            return 1
        results[name] = json.loads(found[-1][len(MARK):])
    print("REPRODUCED" if judge(results, names) else "NOT REPRODUCED")
    return 0
