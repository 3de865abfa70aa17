"""Find where a verdict flips along prompt length: a grid sweep, then bisection.

Engine-agnostic: `find_boundaries(grid, verdict_of)` only needs a function from
a prompt length to "polluted" or "clean". Every grid length is probed, then
every pair of neighbouring lengths whose verdicts differ is bisected down to
adjacent integers (L, L+1). Each length is evaluated at most once.

What a search cannot see: flips that cancel out between two neighbouring grid
points (an even number of them). An odd number between two points shows as the
one transition bisection lands on. A denser grid is the only cure.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

POLLUTED = "polluted"
CLEAN = "clean"
VERDICTS = (POLLUTED, CLEAN)


@dataclass(frozen=True)
class Transition:
    """Verdict changes between prompt lengths `before` and `after` (before < after).

    Resolved when after == before + 1; otherwise the probe budget ran out and
    the change lies somewhere in (before, after].
    """

    kind: str  # "polluted->clean" or "clean->polluted"
    before: int
    after: int

    @property
    def resolved(self) -> bool:
        return self.after == self.before + 1

    @property
    def last_polluted(self) -> int | None:
        return self.before if self.kind == "polluted->clean" else None

    @property
    def first_clean(self) -> int | None:
        return self.after if self.kind == "polluted->clean" else None

    @property
    def last_clean(self) -> int | None:
        return self.before if self.kind == "clean->polluted" else None

    @property
    def first_polluted(self) -> int | None:
        return self.after if self.kind == "clean->polluted" else None

    def describe(self) -> str:
        if not self.resolved:
            return f"{self.kind} somewhere in {self.before}..{self.after} (unresolved)"
        start, end = self.kind.split("->")
        return f"boundary {self.before}|{self.after} (last {start} {self.before}, first {end} {self.after})"


@dataclass(frozen=True)
class SearchResult:
    grid: list[int]  # the requested grid, sorted and de-duplicated
    verdicts: dict[int, str]  # every length probed -> verdict, ascending
    transitions: list[Transition]  # ascending by length
    probes: int  # distinct lengths evaluated
    budget_hit: bool = False
    budget_message: str | None = None
    unprobed: list[int] = field(default_factory=list)  # grid lengths never probed (budget hit)

    @property
    def monotone(self) -> bool:
        return len(self.transitions) <= 1

    @property
    def first_boundary(self) -> Transition | None:
        """The first polluted->clean transition, or None."""
        return next((t for t in self.transitions if t.kind == "polluted->clean"), None)

    @property
    def unresolved(self) -> list[Transition]:
        return [t for t in self.transitions if not t.resolved]

    @property
    def all_clean(self) -> bool:
        return bool(self.verdicts) and all(v == CLEAN for v in self.verdicts.values())

    @property
    def all_polluted(self) -> bool:
        return bool(self.verdicts) and all(v == POLLUTED for v in self.verdicts.values())

    def describe(self) -> str:
        """One plain-English line."""
        if self.budget_hit:
            return self.budget_message or "probe budget hit"
        span = f"{self.grid[0]}..{self.grid[-1]} ({len(self.grid)} lengths)"
        if self.all_clean:
            return f"all clean over {span}"
        if self.all_polluted:
            return f"all polluted over {span}"
        if len(self.transitions) == 1:
            return self.transitions[0].describe()
        listed = ", ".join(f"{t.kind} at {t.before}|{t.after}" for t in self.transitions)
        return f"non-monotone: {len(self.transitions)} transitions: {listed}"


def _transitions(verdicts: dict[int, str]) -> list[Transition]:
    lengths = sorted(verdicts)
    return [
        Transition(f"{verdicts[lo]}->{verdicts[hi]}", lo, hi)
        for lo, hi in itertools.pairwise(lengths)
        if verdicts[lo] != verdicts[hi]
    ]


def _check_grid(grid: list[int]) -> list[int]:
    lengths = sorted(set(grid))
    if not lengths:
        raise ValueError("grid is empty: give at least one prompt length to probe")
    bad = [
        length for length in lengths if isinstance(length, bool) or not isinstance(length, int) or length < 1
    ]
    if bad:
        raise ValueError(f"grid has invalid prompt lengths {bad}: lengths must be positive integers")
    return lengths


def _budget_message(max_probes: int, verdicts: dict[int, str], unprobed: list[int]) -> str:
    parts = [f"probe budget {max_probes} hit before the search finished"]
    unresolved = [t for t in _transitions(verdicts) if not t.resolved]
    if unresolved:
        pairs = ", ".join(f"{t.before}..{t.after}" for t in unresolved)
        parts.append(f"unresolved pairs {pairs}")
    if unprobed:
        parts.append(f"unprobed grid lengths {', '.join(map(str, unprobed))}")
    resolved = [t for t in _transitions(verdicts) if t.resolved]
    if resolved:
        parts.append("resolved: " + ", ".join(f"{t.kind} at {t.before}|{t.after}" for t in resolved))
    return "; ".join(parts)


def find_boundaries(
    grid: list[int],
    verdict_of: Callable[[int], str],
    max_probes: int | None = None,
) -> SearchResult:
    """Probe every grid length, then bisect each verdict change to adjacent lengths.

    Uses at most len(grid) + sum(ceil(log2(after - before))) probes over the
    grid pairs that differ. With `max_probes`, stops when the budget is spent
    and keeps what it found; the result lists unresolved pairs and unprobed
    grid lengths.
    """
    lengths = _check_grid(grid)
    if max_probes is not None and max_probes < 1:
        raise ValueError(f"max_probes={max_probes}: must be >= 1, or None for no limit")
    verdicts: dict[int, str] = {}
    budget_hit = False

    def budget_left() -> bool:
        return max_probes is None or len(verdicts) < max_probes

    def probe(length: int) -> str:
        if length not in verdicts:
            verdict = verdict_of(length)
            if verdict not in VERDICTS:
                raise ValueError(f"verdict_of({length}) returned {verdict!r}; expected 'polluted' or 'clean'")
            verdicts[length] = verdict
        return verdicts[length]

    for length in lengths:
        if not budget_left():
            budget_hit = True
            break
        probe(length)

    # Bisect each differing pair of neighbouring grid points, lowest first.
    for pair in _transitions(verdicts):
        before, after = pair.before, pair.after
        while after - before > 1:
            if not budget_left():
                budget_hit = True
                break
            middle = (before + after) // 2
            if probe(middle) == verdicts[before]:
                before = middle
            else:
                after = middle
        if budget_hit:
            break

    verdicts = dict(sorted(verdicts.items()))
    unprobed = [length for length in lengths if length not in verdicts]
    return SearchResult(
        grid=lengths,
        verdicts=verdicts,
        transitions=_transitions(verdicts),
        probes=len(verdicts),
        budget_hit=budget_hit,
        budget_message=_budget_message(max_probes, verdicts, unprobed) if budget_hit else None,
        unprobed=unprobed,
    )
