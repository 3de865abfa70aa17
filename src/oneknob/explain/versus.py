"""What a variant did to the baseline's transitions: moved, flattened, appeared or unchanged.

The seed's decisive experiment was the same sweep before and after the fix:
the 512|513 discontinuity went from 8x (15.878 -> 1.939 mean NLL) to 0.008 %
(1.94532 -> 1.94516), "flattened, not moved". `versus_baseline` says that for
every variant: the relation, and the jump across the baseline's first
transition in both runs (mean NLL on each side, and the relative change), read
from the lengths both runs measured (a variant's job also probes the
baseline's transition lengths, so they are there). Pure functions over run
dicts (compare.load_run).
"""

from __future__ import annotations

from typing import Any


def _pairs(run: dict) -> list[tuple[int, int, str]]:
    return [(t["lo"], t["hi"], t["direction"]) for t in run["transitions"]]


def _text(pairs: list[tuple[int, int, str]]) -> str:
    return ", ".join(f"{lo}|{hi}" if hi == lo + 1 else f"{lo}..{hi}" for lo, hi, _ in pairs) or "none"


def jump(run: dict, lo: int, hi: int) -> dict[str, Any] | None:
    """Mean NLL at lo and at hi in this run, and the change across them, relative to the NLL at hi."""
    nll = {p["length"]: p["nll"] for p in run["points"]}
    if lo not in nll or hi not in nll:
        return None
    ratio = nll[lo] / nll[hi] if nll[hi] else None
    return {"lo": lo, "hi": hi, "nll_lo": nll[lo], "nll_hi": nll[hi], "ratio": ratio,
            "relative": (nll[lo] - nll[hi]) / nll[hi] if nll[hi] else None}


def jump_text(found: dict | None) -> str:
    if found is None:
        return "not measured at both lengths"
    change = f"{100 * found['relative']:+.3g} %" if found["relative"] is not None else "n/a"
    return f"{found['nll_lo']:.5g} -> {found['nll_hi']:.5g} ({change})"


def versus_baseline(run: dict, baseline: dict) -> dict[str, Any] | None:
    """The variant's transitions against the baseline's; None for the baseline itself or without points."""
    if run is baseline or not run["points"] or not baseline["points"]:
        return None
    before, after = _pairs(baseline), _pairs(run)
    if before and not after:
        relation = "flattened"
    elif after and not before:
        relation = "appeared"
    elif before == after:
        relation = "unchanged"
    else:
        relation = "moved"
    result: dict[str, Any] = {"relation": relation, "from": _text(before), "to": _text(after), "jump": None}
    text = {"flattened": f"flattened: the baseline's {_text(before)} is gone, no transition remains",
            "appeared": f"appeared: {_text(after)}, where the baseline has none",
            "unchanged": f"unchanged: {_text(before)}" if before else "unchanged: no transition in either run",
            "moved": f"moved: {_text(before)} -> {_text(after)}"}[relation]
    if before:
        lo, hi, _ = before[0]
        found = {"baseline": jump(baseline, lo, hi), "variant": jump(run, lo, hi)}
        result["jump"] = found
        text += (f"; across the baseline's {lo}|{hi}: baseline {jump_text(found['baseline'])}, "
                 f"this run {jump_text(found['variant'])}")
    result["text"] = text
    return result
