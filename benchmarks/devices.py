"""Engines side by side on devices: the seed's study with an engine start of S seconds on 1, 2, 4 and 8 devices.

    python run.py -m experiment=mtp_prompt_logprobs engine=synthetic engine.fault.start_delay_s=S devices=N \
        samples=1 explain.followups=0

The study starts 8 engines: the reference, the baseline and 6 variants (spec.k=0's pin is predicted, so it starts
once). On N devices (logical ones here: each worker's CUDA_VISIBLE_DEVICES is set and recorded, no GPU needed;
oneknob.run.devices) the physical limit is ceil(8 / N) rounds of engine starts, ceil(8 / N) x S. `engines` is
the engines' phase: from the first device lease to the last release (the sweep's placement.json); it holds every
engine start and every measurement, and not what does not depend on N (the command's planning, its comparison
and report), which `command` adds. The target: `engines` within 1.15x of the limit at every N. What is left
over the limit is each job's measurement (a variant's waits for the baseline's transitions) and the launch of the
next job on a freed device.
"""

from __future__ import annotations

import json
import math

from benchmarks.common import PYTHON, load, run_timed, tmpdir

ENGINES = 8
TARGET = 1.15


def _sweep(devices: int, start_s: float, log=print) -> dict:
    root = tmpdir(f"devices-{devices}")
    wall, _ = run_timed([PYTHON, "run.py", "-m", "experiment=mtp_prompt_logprobs", "engine=synthetic",
                         f"engine.fault.start_delay_s={start_s:g}", f"devices={devices}", "samples=1",
                         "explain.followups=0", f"paths.root={root}", f"hydra.sweep.dir={root}/sweep"],
                        root / "sweep.log")
    placement = json.loads((root / "sweep" / "placement.json").read_text())
    leases = placement["leases"]
    engines = max(lease["released"] for lease in leases) - min(lease["acquired"] for lease in leases)
    starts = [json.loads(line) for line in (root / ".cache" / "oneknob" / "workers.jsonl").read_text().splitlines()
              if '"start"' in line]
    limit = math.ceil(ENGINES / devices) * start_s
    summary = json.loads((root / "sweep" / "summary.json").read_text())
    transitions = {r["name"]: [f"{t['lo']}|{t['hi']}" for t in r["transitions"]] for r in summary["runs"]}
    log(f"  {devices} device(s), start {start_s:g} s: engines {engines:.1f} s, limit {limit:g} s "
        f"({engines / limit:.2f}x), command {wall:.1f} s, {len(starts)} engine starts")
    return {"devices": devices, "start_s": start_s, "engines_s": engines, "limit_s": limit, "command_s": wall,
            "starts": len(starts), "most_at_once": placement["most_at_once"], "transitions": transitions,
            "load": load()}


def bench(start_s: float = 40.0, counts=(1, 2, 4, 8), log=print) -> list[dict]:
    return [_sweep(n, start_s, log) for n in counts]


def markdown(results: list[dict]) -> str:
    same = len({json.dumps(r["transitions"], sort_keys=True) for r in results}) == 1
    lines = ["| devices | engine start S | engine starts | most at once | limit ceil(8/N) x S | engines (first lease "
             "to last release) | ratio (target <= 1.15) | command wall | load after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ratio = r["engines_s"] / r["limit_s"]
        lines.append(f"| {r['devices']} | {r['start_s']:g} s | {r['starts']} | {r['most_at_once']} | "
                     f"{r['limit_s']:g} s | {r['engines_s']:.1f} s | {ratio:.2f}x"
                     f"{'' if ratio <= TARGET else ' (over)'} | {r['command_s']:.1f} s | {r['load']} |")
    lines += ["", f"- every run's transitions {'the same' if same else 'NOT the same'} at every device count"]
    return "\n".join(lines)
