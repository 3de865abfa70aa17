"""Malformed answers as a job records them: one line per job, a tag that fits MLflow, means that skip NaN.

A malformed answer (oneknob.engines.answers) is judged polluted by the oracles that read its malformed part
(verdict.judge.MALFORMED_FIELDS), with the reason; the job keeps, per length, how many of its samples were and
why (`{length: {"samples", "of", "reasons": {oracle: reason}}}`), in result.json, the run's tag
`oneknob.malformed` and the summary (oneknob.explain.compare).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

TAG_CHARS = 7000  # MLflow caps a tag's value; result.json keeps every length


def finite_mean(values: list[float | None], reduce: Callable | None = None) -> float:
    """The mean (or `reduce`) of the finite values; NaN when there is none (a point with nothing readable)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return math.nan
    return reduce(finite) if reduce is not None else math.fsum(finite) / len(finite)


def count(malformed: dict) -> int:
    """How many points (length x sample) were malformed."""
    return sum(int(entry.get("samples", 0)) for entry in malformed.values())


def malformed_text(malformed: dict) -> str:
    """"2 malformed answer(s), judged polluted: at 401 (nll: 1 of 400 rows lack the prompt's token), ..."."""
    shown = []
    for length, entry in sorted(malformed.items(), key=lambda item: int(item[0]))[:3]:
        reasons = "; ".join(f"{o}: {r.removeprefix('malformed: ')}" for o, r in entry["reasons"].items())
        shown.append(f"{length} ({reasons[:200]})")
    more = len(malformed) - len(shown)
    return (f"{count(malformed)} malformed answer(s), judged polluted: at " + ", ".join(shown)
            + (f" and {more} more length(s) (result.json lists them)" if more > 0 else ""))


def fitting_malformed(malformed: dict, limit: int = TAG_CHARS) -> str:
    """The record as JSON that fits an MLflow tag: the longest lengths' left out, and reasons shortened, if need be
    ("count" always says how many points were)."""
    entries = {str(L): m for L, m in sorted(malformed.items(), key=lambda item: int(item[0]))}
    total = count(malformed)
    while True:
        text = json.dumps({"count": total, "lengths": entries}, separators=(",", ":"))
        if len(text) <= limit or not entries:
            return text
        if any(len(r) > 120 for m in entries.values() for r in m["reasons"].values()):
            entries = {L: m | {"reasons": {o: r[:120] for o, r in m["reasons"].items()}} for L, m in entries.items()}
        else:
            entries.pop(next(reversed(entries)))
