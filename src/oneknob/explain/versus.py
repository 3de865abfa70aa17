"""What a variant did to the baseline's verdicts: cleared, appeared, spread, shrank, moved or unchanged.

The seed's decisive experiment was the same sweep before and after the fix:
the 512|513 discontinuity went from 8x (15.878 -> 1.939 mean NLL) to 0.008 %
(1.94532 -> 1.94516), "flattened, not moved" (here: `cleared`, polluted somewhere -> clean everywhere,
"...flattened, not moved"). `versus_baseline` compares the polluted sets of the lengths both runs measured
(`unchanged` only when they are equal; a run polluted everywhere against a baseline clean everywhere is
`appeared`, never `unchanged`), and says the relation, the lengths that differ, and the jump across the baseline's first
transition in both runs (mean NLL on each side, and the relative change), read
from the lengths both runs measured (a variant's job also probes the
baseline's transition lengths, so they are there). Pure functions over run
dicts (compare.load_run).
"""

from __future__ import annotations

from typing import Any

from oneknob.explain.numbers import nll, percent


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
    return f"{nll(found['nll_lo'])} -> {nll(found['nll_hi'])} ({percent(found['relative'])})"


def lengths_text(lengths) -> str:
    """Measured lengths in words: every one when few, else the first three, the last and the count."""
    lengths = sorted(lengths)
    if len(lengths) <= 6:
        return ", ".join(map(str, lengths)) + f" ({len(lengths)} length{'s' if len(lengths) != 1 else ''})"
    return f"{', '.join(map(str, lengths[:3]))}, ..., {lengths[-1]} ({len(lengths)} measured lengths)"


def polluted_sets(run: dict, baseline: dict) -> tuple[list[int], set[int], set[int]]:
    """(the lengths both runs measured, the baseline's polluted ones among them, the run's)."""
    mine = {p["length"]: bool(p["polluted"]) for p in run["points"]}
    theirs = {p["length"]: bool(p["polluted"]) for p in baseline["points"]}
    common = sorted(set(mine) & set(theirs))
    return common, {L for L in common if theirs[L]}, {L for L in common if mine[L]}


def _relation(before, after, common, was, now) -> str:
    if was != now:
        if not now:
            return "cleared"
        if not was:
            return "appeared"
        if before and after and [d for *_, d in before] == [d for *_, d in after]:
            return "moved"  # the same shape of flips at other lengths (the seed's capture=256)
        return "spread" if now > was else "shrank" if now < was else "moved"
    # the same verdicts wherever both measured: the transitions may still differ between lengths only one measured
    if before == after:
        return "unchanged"
    return "flattened" if before and not after else "appeared" if after and not before else "moved"


def versus_baseline(run: dict, baseline: dict) -> dict[str, Any] | None:
    """The variant's verdicts against the baseline's, on the lengths both measured (cleared, appeared, spread,
    shrank, moved; unchanged only when the polluted sets are equal), with both runs' transitions; None for the
    baseline itself or without points."""
    if run is baseline or not run["points"] or not baseline["points"]:
        return None
    before, after = _pairs(baseline), _pairs(run)
    common, was, now = polluted_sets(run, baseline)
    relation = _relation(before, after, common, was, now)
    result: dict[str, Any] = {"relation": relation, "from": _text(before), "to": _text(after), "jump": None,
                              "polluted_baseline": sorted(was), "polluted": sorted(now), "compared": common}
    everywhere = f"every length both runs measured ({len(common)})"
    if relation == "cleared":
        text = f"cleared: polluted at {lengths_text(was)} in the baseline, clean here at {everywhere}"
        text += f"; the baseline's {_text(before)} flattened, not moved" if before else ""
    elif relation == "appeared":
        text = f"appeared: {_text(after)}, where the baseline has none; " if after and not before else "appeared: "
        text += f"polluted at {lengths_text(now)}, clean in the baseline"
    elif relation == "spread":
        text = f"spread: polluted at {lengths_text(now - was)} too, clean in the baseline"
        text += f" (transitions {_text(before)} -> {_text(after)})" + (
            f"; polluted at {everywhere}" if now == set(common) else "")
    elif relation == "shrank":
        text = f"shrank: clean at {lengths_text(was - now)}, polluted in the baseline (transitions " \
               f"{_text(before)} -> {_text(after)})"
    elif relation == "moved":
        text = f"moved: {_text(before)} -> {_text(after)}"
        if was - now:
            text += f"; clean now at {lengths_text(was - now)}"
        if now - was:
            text += f"; polluted now at {lengths_text(now - was)}"
    elif relation == "flattened":
        text = f"flattened: the baseline's {_text(before)} is gone, no transition remains"
    elif before:
        text = f"unchanged: {_text(before)}"
    else:
        text = f"unchanged: {'polluted' if now else 'clean'} at {everywhere}, no transition in either run"
    if before:
        lo, hi, _ = before[0]
        found = {"baseline": jump(baseline, lo, hi), "variant": jump(run, lo, hi)}
        result["jump"] = found
        text += (f"; across the baseline's {lo}|{hi}: baseline {jump_text(found['baseline'])}, "
                 f"this run {jump_text(found['variant'])}")
    result["text"] = text
    return result
