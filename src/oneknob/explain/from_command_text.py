"""The reporter's line in words (report.md's first section, the terminal's last lines).

Every value here is in summary.json's `from_command` (the sweep run's tag oneknob.from_command, built by
oneknob.study.flag_reduction.answer); `complete` adds `each` (what resetting each flag did: the variant's
versus_baseline relation, cleared / moved / spread / shrank / unchanged / appeared) from the runs of the sweep,
so a report rebuilt from MLflow says the same.
"""

from __future__ import annotations

import json
from typing import Any


def complete(found: dict, runs: list[dict]) -> dict:
    by_id = {r["run_id"]: r for r in runs}
    each, transitions = {}, {}
    for name in found.get("ablated", []):
        run = by_id.get((found.get("runs") or {}).get(name))
        if run is None:
            continue
        versus = run.get("versus_baseline")
        each[name] = versus["relation"] if versus else (
            "no-op" if run.get("status") == "noop" else run.get("status") or "not measured")
        transitions[name] = _transitions(run)
    baseline = next((r for r in runs if r["knob"] is None), None)
    return found | {"each": each, "each_transitions": transitions,
                    "baseline_transitions": _transitions(baseline) if baseline else None}


def _transitions(run: dict) -> str:
    found = [f"{t['lo']}|{t['hi']}" if t.get("resolved") else f"{t['lo']}..{t['hi']}" for t in run.get("transitions")
             or []]
    return ", ".join(found) or "none"


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text.replace("|", "\\|")


def lines(found: dict) -> list[str]:
    """report.md's section: the flags table, the minimal line, the cost."""
    reader = "`vllm serve` parser" if found.get("kind") == "serve" else "EngineArgs"
    out = [f"Reporter's line (read by vLLM {found['vllm_version']}'s own {reader}): `{found['line']}`", "",
           f"Baseline: the line's configuration ({found.get('baseline') or 'not measured'}; transitions "
           f"{found.get('baseline_transitions') or 'none'}).", ""]
    out += ["| flag | reporter's value | vLLM default | resetting it | transitions |", "|---|---|---|---|---|"]
    for name, flag in found["flags"].items():
        if flag["status"] == "ablated":
            did = found["each"].get(name, "not run (drop=each runs one variant per flag)")
            moved = found.get("each_transitions", {}).get(name, "")
        else:
            did = {"default": "not ablated: vLLM's default", "setting": f"not ablated: {flag['why']}"}.get(
                flag["status"], f"not carried: {flag['why']}")
            moved = ""
        out.append(f"| `{flag['option']}` | {_shown(flag['value'])} | {_shown(flag['default'])} | {did} | {moved} |")
    out.append("")
    out += [f"- {line}" for line in sentences(found)]
    return out


def sentences(found: dict) -> list[str]:
    """The answer (report.md, and the terminal's last lines)."""
    said = []
    if found.get("stopped"):
        said.append(f"from_command stopped: {found['stopped']}")
    if found["drop"] == "each" and found["each"]:
        mattered = [n for n, r in found["each"].items() if r not in ("unchanged", "no-op")]
        said.append(f"resetting {', '.join(mattered) or 'no flag'} changed the result; "
                    f"{', '.join(n for n in found['each'] if n not in mattered) or 'none'} did not")
    if found["drop"] == "minimal" and found.get("minimal") is not None:
        if not found["minimal"]:
            said.append("minimal set: no flag: the line with every flag at vLLM's default gives the baseline's "
                        f"result too ({found['criterion']}: {found.get('baseline')})")
        else:
            said.append(f"minimal set ({found['criterion']}: {found.get('baseline')}): "
                        f"{', '.join(found['minimal'])}")
        said.append(f"minimal line: {found['minimal_line']}")
    defaults = [f["option"] for f in found["flags"].values() if f["status"] == "default"]
    if defaults:
        said.append(f"equal to vLLM's default, not ablated: {', '.join(defaults)}")
    said += found.get("notes", [])
    cost = f"{found['jobs']} job(s), {found['engine_starts']} engine start(s)"
    if "bound" in found:
        cost += f" (bound {found['bound']} = 2 + n (ceil(log2 n) + 1) for n = {len(found['ablated'])} flags)"
    return said + [f"cost: {cost}, reference starts {found['reference_starts']}"]


def closing(found: dict) -> list[str]:
    """The terminal's last lines: the answer, the cost, and the minimal `vllm serve` line last."""
    said = sentences(found)
    last = [line for line in said if line.startswith("minimal line:")]
    return [line for line in said if line not in last] + last
