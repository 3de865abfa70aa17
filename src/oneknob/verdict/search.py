"""Where an outcome flips along an ordered axis: the grid, then bisection of every change.

The axis is prompt length for a job's search, and positions 0..N-1 of a knob's ordered values for a sweep's
bisection (oneknob.study.bisect: grid [0, N-1], outcomes any comparable labels, only the first change wanted).

The search measures nothing itself. `wanted(grid, verdicts, ...)` says which
lengths it needs next, given the verdicts known so far: unprobed grid lengths
first, then the midpoint of every verdict change not yet narrowed to adjacent
lengths. The caller measures them (from the cache or an engine) and asks
again until nothing is wanted; `result(...)` then lists every transition.

A transition is a pair of adjacent probed lengths `lo|hi` whose verdicts
differ, with its direction; it is resolved when hi = lo + 1, else the probe
budget ran out (or bisection was off) and the flip lies somewhere in lo+1..hi.

What a search cannot see: flips that cancel out between two neighbouring grid
points (an even number of them), such as a one-length island. `suspects(...)`
adds the lengths where such an island is likely: every candidate threshold q
inside the grid's range (a quantity of the resolved config, the model's config
or a knob's value), q - 1 and q + 1; they count against the probe budget.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

POLLUTED, CLEAN = "polluted", "clean"

VERDICTS = (POLLUTED, CLEAN)
DOWN, UP = "polluted->clean", "clean->polluted"  # the seed's shape is DOWN: polluted up to lo, clean from hi


@dataclass(frozen=True)
class Transition:
    lo: int
    hi: int
    direction: str  # DOWN or UP

    @property
    def resolved(self) -> bool:
        return self.hi == self.lo + 1

    @property
    def sign(self) -> int:
        """+1 for polluted->clean, -1 for clean->polluted (MLflow metric boundary_direction)."""
        return 1 if self.direction == DOWN else -1

    @property
    def text(self) -> str:
        return f"{self.lo}|{self.hi}" if self.resolved else f"{self.lo}..{self.hi}"

    def describe(self) -> str:
        before, after = self.direction.split("->")
        if not self.resolved:
            return f"{self.direction} somewhere in {self.lo + 1}..{self.hi} (unresolved: last {before} " \
                   f"{self.lo}, first {after} {self.hi})"
        return f"{self.direction} at {self.lo}|{self.hi} (last {before} {self.lo}, first {after} {self.hi})"

    def relations(self) -> dict[str, int]:
        """Each side by what it is: {"last_polluted": lo, "first_clean": hi} for DOWN, "last_clean" and
        "first_polluted" for UP. Exact only when resolved; else the flip lies somewhere in lo+1..hi."""
        before, after = self.direction.split("->")
        return {f"last_{before}": self.lo, f"first_{after}": self.hi}

    @property
    def clean_side(self) -> int:
        return self.hi if self.direction == DOWN else self.lo

    @property
    def polluted_side(self) -> int:
        return self.lo if self.direction == DOWN else self.hi

    def as_dict(self) -> dict:
        return {"lo": self.lo, "hi": self.hi, "direction": self.direction, "resolved": self.resolved}

    @classmethod
    def from_dict(cls, data: dict) -> Transition:
        return cls(int(data["lo"]), int(data["hi"]), data["direction"])


def relation_text(relation: str) -> str:
    """"last_polluted" -> "last polluted"."""
    return relation.replace("_", " ")


def transitions(verdicts: dict[int, str]) -> list[Transition]:
    lengths = sorted(verdicts)
    return [Transition(lo, hi, f"{verdicts[lo]}->{verdicts[hi]}")
            for lo, hi in itertools.pairwise(lengths) if verdicts[lo] != verdicts[hi]]


def polluted_spans(verdicts: dict[int, str]) -> list[tuple[int, int]]:
    """Maximal stretches of probed polluted lengths, as (first, last) probed lengths."""
    spans: list[tuple[int, int]] = []
    first = last = None
    for length in sorted(verdicts):
        if verdicts[length] == POLLUTED:
            first, last = length if first is None else first, length  # position 0 is a position
        elif first is not None:
            spans.append((first, last))
            first = None
    return spans + ([(first, last)] if first is not None else [])


def check_grid(grid: list[int], lowest: int = 1) -> list[int]:
    """The grid, sorted; `lowest` is the smallest position the axis allows (prompt lengths 1; neighbours and
    positions on a knob's ordered values 0)."""
    lengths = sorted(set(grid))
    if not lengths:
        raise ValueError("grid is empty: give at least one prompt length to probe")
    bad = [L for L in lengths if isinstance(L, bool) or not isinstance(L, int) or L < lowest]
    if bad:
        raise ValueError(f"grid has invalid prompt lengths {bad}: lengths must be positive integers" if lowest == 1
                         else f"grid has invalid positions {bad}: positions must be integers >= {lowest}")
    return lengths


def wanted(grid: list[int], verdicts: dict[int, str], *, max_probes: int | None = None,
           bisect: bool = True, first_only: bool = False) -> list[int]:
    """The points the search needs next, ascending; [] when it is done or out of probes. `verdicts` may hold
    any labels compared by equality. `first_only`: bisect only the first change (a sweep's bisection asks
    where the outcome first differs from the first end: ceil(log2 N) probes after the two ends)."""
    left = len(grid) + 10**9 if max_probes is None else max_probes - len(verdicts)
    if left <= 0:
        return []
    missing = [L for L in grid if L not in verdicts]
    if missing:
        return missing[:left]
    if not bisect:
        return []
    changes = transitions(verdicts)[:1] if first_only else transitions(verdicts)
    return [(t.lo + t.hi) // 2 for t in changes if not t.resolved][:left]


def wanted_each(grid: list[int], by_oracle: dict[str, dict[int, str]], *, max_probes: int | None = None,
                bisect: bool = True) -> list[int]:
    """What every oracle's search needs next, on shared probes (one measurement gives each oracle its verdict,
    so every oracle has probed the same lengths): the union of each one's `wanted`, within the budget."""
    probed = len(next(iter(by_oracle.values()), {}))
    left = len(grid) + 10**9 if max_probes is None else max_probes - probed
    union = sorted({L for verdicts in by_oracle.values()
                    for L in wanted(grid, verdicts, max_probes=max_probes, bisect=bisect)})
    return union[:max(left, 0)]


def combined(by_oracle: dict[str, dict[int, str]]) -> dict[int, str]:
    """Polluted where any oracle says so: the run's verdict at each probed length."""
    lengths = sorted({L for verdicts in by_oracle.values() for L in verdicts})
    return {L: POLLUTED if any(v.get(L) == POLLUTED for v in by_oracle.values()) else CLEAN for L in lengths}


def results(grid: list[int], by_oracle: dict[str, dict[int, str]], **kwargs) -> tuple[SearchResult,
                                                                                        dict[str, SearchResult]]:
    """The combined result (polluted where any oracle is) and each oracle's own, over the same probes."""
    return (result(grid, combined(by_oracle), **kwargs),
            {name: result(grid, verdicts, **kwargs) for name, verdicts in by_oracle.items()})


def suspects(grid: list[int], candidates: dict[str, int]) -> dict[int, list[str]]:
    """{length: why} for the suspect lengths not already in the grid: each candidate threshold q (name -> value)
    with lo <= q < hi of the grid gives q - 1 ("<name> - 1", the last length of an L < q edge), q ("<name>") and
    q + 1 ("<name> + 1"), so a one-length island at either side of a threshold is probed whatever the grid."""
    lo, hi = min(grid), max(grid)
    found: dict[int, list[str]] = {}
    for name, q in candidates.items():
        if isinstance(q, bool) or not isinstance(q, int) or not lo <= q < hi:
            continue
        for length, why in ((q - 1, f"{name} - 1"), (q, name), (q + 1, f"{name} + 1")):
            if length not in grid and length >= lo:
                found.setdefault(length, []).append(why)
    return dict(sorted(found.items()))


def suspects_text(found: dict[int, list[str]], said: Callable[[str], str] = str) -> str:
    """"257 (max_capture_size + 1), 300 (model.sliding_window)"; each reason through `said` (a reader's label)."""
    return ", ".join(f"{L} ({', '.join(said(w) for w in why)})" for L, why in found.items())


@dataclass(frozen=True)
class SearchResult:
    grid: list[int]
    verdicts: dict[int, str]  # every probed length -> verdict, ascending
    transitions: list[Transition]  # ascending by length
    probes: int
    max_probes: int | None
    bisect: bool

    @property
    def unprobed(self) -> list[int]:
        return [L for L in self.grid if L not in self.verdicts]

    @property
    def unresolved(self) -> list[Transition]:
        return [t for t in self.transitions if not t.resolved]

    @property
    def budget_hit(self) -> bool:
        return bool(self.unprobed) or (self.bisect and bool(self.unresolved))

    @property
    def monotone(self) -> bool:
        return len(self.transitions) <= 1

    def shape(self) -> str:
        """The transitions in words: all clean / all polluted over the measured span, one transition, or
        non-monotone with each one listed."""
        measured = list(self.verdicts)  # only measured lengths: an unprobed grid end is no part of "all clean"
        span = (f"{measured[0]}..{measured[-1]} ({len(measured)} measured length{'s' if len(measured) != 1 else ''})"
                if measured else "")
        if not self.transitions:
            return f"all {next(iter(self.verdicts.values()))} over {span}" if self.verdicts else "nothing probed"
        if len(self.transitions) == 1:
            return self.transitions[0].describe()
        listed = ", ".join(f"{t.direction} at {t.text}" for t in self.transitions)
        return f"non-monotone: {len(self.transitions)} transitions: {listed}"

    def describe(self) -> str:
        """One plain-English line."""
        return self.shape() + self.budget_text()

    def budget_text(self) -> str:
        """Why the search stopped short, if it did ("" when it finished)."""
        text = ""
        if self.budget_hit:
            text += f"; probe budget search.max_probes={self.max_probes} spent before the search finished"
            if self.unprobed:
                text += f" (unprobed grid lengths {', '.join(map(str, self.unprobed))})"
            text += ": raise search.max_probes to resolve every transition"
        elif self.unresolved:
            text += "; bisection is off (search.bisect=false), so transitions are as wide as the grid"
        return text


def headline(combined_result: SearchResult, by_oracle: dict[str, SearchResult]) -> str:
    """A run's line over every oracle: one shape when the oracles agree at every probed length (or only one was
    asked), else each oracle's ("nll: all clean over ...; greedy: clean->polluted at 316|317 (...)"): "all
    clean" only when every oracle is clean everywhere. The budget's words once, from the oracle it stopped."""
    groups: dict[str, list[str]] = {}
    for name, found in by_oracle.items():
        groups.setdefault(repr(found.verdicts), []).append(name)
    if len(groups) <= 1:
        text = combined_result.shape()
        if len(by_oracle) > 1:
            text += f" (oracles {', '.join(by_oracle)} agree)"
    else:
        text = "; ".join(f"{'/'.join(names)}: {by_oracle[names[0]].shape()}" for names in groups.values())
    short = next((found for found in by_oracle.values() if found.budget_hit or found.unresolved), combined_result)
    return text + short.budget_text()


def result(grid: list[int], verdicts: dict[int, str], *, max_probes: int | None = None,
           bisect: bool = True, lowest: int = 1) -> SearchResult:
    verdicts = dict(sorted(verdicts.items()))
    return SearchResult(check_grid(grid, lowest), verdicts, transitions(verdicts), len(verdicts), max_probes, bisect)


def find_boundaries(grid: list[int], verdict_of: Callable[[int], str], max_probes: int | None = None,
                    bisect: bool = True, *, outcomes: tuple[str, ...] | None = VERDICTS, lowest: int = 1,
                    first_only: bool = False) -> SearchResult:
    """Drive the whole search with a verdict function (tests, benchmarks). `outcomes=None` takes any label
    (a bisection's outcomes), `lowest=0` allows position 0."""
    lengths = check_grid(grid, lowest)
    if max_probes is not None and max_probes < 1:
        raise ValueError(f"max_probes={max_probes}: must be >= 1, or None for no limit")
    verdicts: dict[int, str] = {}
    while todo := wanted(lengths, verdicts, max_probes=max_probes, bisect=bisect, first_only=first_only):
        for length in todo:
            verdict = verdict_of(length)
            if outcomes is not None and verdict not in outcomes:
                raise ValueError(f"verdict_of({length}) returned {verdict!r}; expected 'polluted' or 'clean'")
            verdicts[length] = verdict
    return result(lengths, verdicts, max_probes=max_probes, bisect=bisect, lowest=lowest)
