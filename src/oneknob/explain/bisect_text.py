"""A bisection's answer in words (report.md, the terminal): `sentences(summary["bisect"])`.

Every number in these lines is in summary.json's `bisect` (the sweep run's tag oneknob.bisect), which
oneknob.study.bisect.answer builds; this module only renders it, so a report rebuilt from MLflow says the same.
"""

from __future__ import annotations

import json

from oneknob.verdict import search


def sentences(found: dict) -> list[str]:
    """The answer in words (report.md, the terminal); every number is in summary.json's `bisect`."""
    knob, crit, cost = found["knob"], found["criterion"], (
        f"{found['jobs']} job(s), {found['engine_starts']} engine start(s) (bound {found['bound']} for "
        f"{found['candidates']} values), reference starts {found['reference_starts']}")
    shown = lambda v: (str(v)[:12] if knob == "vllm.commit" else json.dumps(v))  # noqa: E731
    if found.get("stopped"):
        lines = [f"bisect {knob} stopped: {found['stopped']}"]
    elif found["first_different"] is None:
        lines = [f"bisect {knob}: the two ends agree ({crit}: "
                 f"{(found.get('probes') or [{}])[0].get('outcome')}); nothing to search between "
                 f"{shown(found['first_end'])} and {shown(found['last_end'])}"]
    else:
        ev = found["evidence"]
        same, diff = ev["last_same"], ev["first_different"]
        where = "" if found["resolved"] else f" (unresolved: {found['between']} value(s) between them unmeasured)"
        if crit.startswith("polluted_at:") and isinstance(found["first_different"], (int, float)):
            at = crit.split(":")[1]
            state = "that still pollutes" if same["outcome"] == search.POLLUTED else "still clean"
            lines = [f"bisect {knob}: largest value {state} at {at}: {shown(found['last_same'])}; "
                     f"from {shown(found['first_different'])} {diff['outcome']}{where}"]
        else:
            lines = [f"bisect {knob}: first value that differs from the first end {shown(found['first_end'])}: "
                     f"{shown(found['first_different'])} (last same: {shown(found['last_same'])}){where}"]
        first_clause = lambda ev_side: (ev_side.get("describe") or "").split(";")[0]  # noqa: E731 (the search's line)
        lines += [f"  at {shown(found['last_same'])}: {same['outcome']} ({first_clause(same)})",
                  f"  at {shown(found['first_different'])}: {diff['outcome']} ({first_clause(diff)})"]
        for side, ev_side in (("last same", same), ("first different", diff)):
            fields = {k: v for k, v in ev_side["resolved"].items() if k in RESOLVED_SHOWN}
            if fields:
                lines.append(f"  resolved at {side}: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in fields.items()))
    if commit := found.get("commit"):
        lines.append(f"  first commit: {commit['hash']} \"{commit['subject']}\" ({commit['date']}, "
                     f"{commit['author']}): {commit['stat']}")
    if found.get("note"):
        lines.append(f"  {found['note']}")
    return lines + [f"  cost: {cost}"]


RESOLVED_SHOWN = ("build", "max_num_seqs", "max_capture_size", "cudagraph_mode", "spec_k", "enforce_eager",
                  "max_num_batched_tokens")
