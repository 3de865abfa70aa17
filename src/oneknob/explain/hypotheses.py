"""What a boundary tracks, settled by runs: hypotheses "side = X + d" and what each comparable run says of them.

A resolved transition lo|hi has two sides (search.Transition.relations). For each candidate quantity X of its run
(run_edges.candidates: the resolved config's, the engine's scheduler / cache / compilation integers, the model's
config.json length fields, the knobs' values) the hypothesis "side = X + d" has d = side - X. The candidates of a
transition are those within 2 of a side (they coincide), and where none coincides the nearest few below and
above each side at any distance (nearest relative distance first); for a decode oracle also those within 2 of
the first divergent position.

A run R' is evidence on a transition of run R when the two differ in one knob (`comparable`). Under "side = X + d"
the edge of R' sits at X' + d, X' being X in R'. So each hypothesis is, by R':
- consistent, moved: X moved and the edge moved with it (the same d in both runs);
- consistent, unmoved: X did not move and neither did the edge;
- ruled out: X moved and the edge did not follow it (it stayed, or moved by another amount), or X stayed and
  the edge moved;
- unknown: R' has no resolved edge of that direction (the mechanism cleared, or the edge left the measured
  range) or one that might hold X' + d inside an unresolved range.
`conclude` gathers every comparable run's word into one record: "tracks X with offset d" only when X moved alone
(no other standing candidate moved with it in that run) and the edge followed; "does not track" for each ruled
out; "tracks none of those tried" when every candidate tested was ruled out. Pure functions over run dicts
(compare.load_run, with analysis's `explained`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from oneknob.config.quantities import POWER_OF_TWO, is_power_of_two, label, ordered
from oneknob.verdict.search import Transition, relation_text

COINCIDES = 2  # a side within this of a quantity coincides with it
NEAREST = 2  # where nothing coincides: this many distinct values below and above each side


@dataclass(frozen=True)
class Hypothesis:
    quantity: str  # the candidate's id (config.quantities.label names it)
    value: int  # its value in the run with the edge
    relation: str  # the side it is read from: last_polluted, first_clean, last_clean, first_polluted
    side: int  # that side's length
    offset: int  # side - value
    at_position: int | None = None  # a decode edge's first divergent position, when X is near it

    @property
    def coincides(self) -> bool:
        return abs(self.offset) <= COINCIDES or (self.at_position is not None
                                                 and abs(self.at_position - self.value) <= COINCIDES)

    def text(self) -> str:
        said = f"{relation_text(self.relation)} {self.side} = {label(self.quantity)}"
        return said + (f" ({self.value}) + {self.offset}" if self.offset > 0 else
                       f" ({self.value}) - {-self.offset}" if self.offset < 0 else "")


def hypotheses(record: dict, quantities: dict[str, int]) -> list[Hypothesis]:
    """The candidates of one resolved transition, in the order they are tried: those that coincide (exact first),
    else the nearest below and above each side by relative distance."""
    edge = Transition.from_dict(record)
    if not edge.resolved:
        return []
    sides = edge.relations()
    position = record.get("first_position")
    every = []
    for quantity in ordered(quantities):
        value = quantities[quantity]
        if quantity == POWER_OF_TWO or isinstance(value, bool) or not isinstance(value, int) or value < 1:
            continue
        relation = min(sides, key=lambda r: abs(sides[r] - value))  # the nearer side (the "last" one on a tie)
        near = position is not None and abs(position - value) <= COINCIDES
        every.append(Hypothesis(quantity, value, relation, sides[relation], sides[relation] - value,
                                position if near else None))
    rank = {q: i for i, q in enumerate(ordered(quantities))}
    coinciding = [h for h in every if h.coincides]
    if coinciding:
        return sorted(coinciding, key=lambda h: (_distance(h), rank[h.quantity]))
    chosen = []
    for side in sides.values():
        for below in (True, False):
            values = sorted({h.value for h in every if (h.value < side) == below and h.value != side},
                            key=lambda v: abs(side - v) / v)[:NEAREST]
            chosen += [h for h in every if h.value in values]
    unique = list(dict.fromkeys(chosen))
    return sorted(unique, key=lambda h: (abs(h.offset) / h.value, rank[h.quantity]))


def _distance(h: Hypothesis) -> int:
    """How far a coinciding candidate is from the edge: from its side, or from the first divergent position."""
    return abs(h.offset) if h.at_position is None else min(abs(h.offset), abs(h.at_position - h.value))


def changed_knobs(run: dict, other: dict) -> list[str]:
    """The knobs two runs were asked for differently, not counting a pin that set a knob to what the other
    resolved anyway (single_variable's pins keep a side effect where it was)."""
    mine, theirs = run.get("requested") or {}, other.get("requested") or {}
    pinned = set((run.get("check") or {}).get("pinned") or {}) | set((other.get("check") or {}).get("pinned") or {})
    return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k) and k not in pinned)


def comparable(run: dict, other: dict) -> bool:
    """Two runs one knob apart: what one of them shows is a single-variable test of the other's edges."""
    return other is not run and len(changed_knobs(run, other)) == 1


def _edges(run: dict, oracle: str | None, direction: str) -> tuple[list[Transition], list[Transition]]:
    """(resolved, unresolved) transitions of one direction, as this oracle (or the combined verdict) sees them."""
    records = ((run.get("oracles") or {}).get(oracle) or {}).get("transitions") if oracle else None
    found = [Transition.from_dict(t) for t in (records if records is not None else run.get("transitions") or [])]
    same = [t for t in found if t.direction == direction]
    return [t for t in same if t.resolved], [t for t in same if not t.resolved]


@dataclass(frozen=True)
class Word:
    """What one comparable run says of one hypothesis."""
    run: str
    status: str  # moved | unmoved | ruled_out | unknown
    value: int | None  # X in that run
    edge: str | None  # the edge that run has (lo|hi; several: comma-separated), if any
    kind: str = ""  # ruled_out: stayed (the edge moved, X stayed) | held (X moved, the edge stayed) | other
    predicted: int | None = None  # where the side would be there if it tracked X


def evidence(h: Hypothesis, oracle: str | None, direction: str, other: dict, quantities: dict[str, int]) -> Word:
    """What `other` (one knob from the run with the edge; `quantities` its candidates) says of `h`."""
    value = quantities.get(h.quantity)
    resolved, unresolved = _edges(other, oracle, direction)
    if value is None:
        return Word(other["name"], "unknown", None, None)
    predicted = value + h.offset
    at = next((t for t in resolved if t.relations()[h.relation] == predicted), None)
    if at is not None:
        return Word(other["name"], "moved" if value != h.value else "unmoved", value, at.text, predicted=predicted)
    if not resolved or any(t.lo < predicted <= t.hi for t in unresolved):
        return Word(other["name"], "unknown", value, None, predicted=predicted)
    stayed = next((t for t in resolved if t.relations()[h.relation] == h.side), None)
    kind = "stayed" if value == h.value else "held" if stayed is not None else "other"
    return Word(other["name"], "ruled_out", value, stayed.text if stayed else ", ".join(t.text for t in resolved),
                kind, predicted)


def conclude(candidates: list[Hypothesis], words: dict[str, list[Word]], side_values: dict[str, int]) -> dict:
    """One transition's tested record from every comparable run's word on each candidate (`words` by quantity;
    `side_values` the transition's relations). Untested candidates are left out of tracks and ruled_out."""
    order = {"held": 0, "other": 1, "stayed": 2}  # the direct test first: the run that moved X
    ruled = {q: sorted((w for w in ws if w.status == "ruled_out"), key=lambda w: order[w.kind])
             for q, ws in words.items()}
    standing = [h for h in candidates if not ruled.get(h.quantity)]
    tracks, offset, supporting, together = None, None, [], []
    for h in standing:
        moved = [w for w in words.get(h.quantity, []) if w.status == "moved"]
        for word in moved:  # moved alone: no other standing candidate moved with it in that run
            alongside = [o.quantity for o in standing if o is not h and any(
                w.run == word.run and w.status == "moved" for w in words.get(o.quantity, []))]
            if alongside:
                together = together or [h.quantity, *alongside]
                continue
            tracks, offset, supporting = h.quantity, h.offset, [word]
            break
        if tracks:
            break
    chosen = next((h for h in candidates if h.quantity == tracks), None)
    ruled_out = [h.quantity for h in candidates if ruled.get(h.quantity)]
    evidence_runs = list(dict.fromkeys([w.run for w in supporting] + [w.run for q in ruled_out for w in ruled[q]]))
    tested = {q for q, ws in words.items() if any(w.status in ("moved", "ruled_out") for w in ws)}
    return {"tracks": tracks, "offset": offset, "relation": chosen.relation if chosen else None,
            "ruled_out": ruled_out, "evidence": evidence_runs, "together": together if not tracks else [],
            "tested": sorted(tested, key=[h.quantity for h in candidates].index),
            "why": {q: asdict(ws[0]) for q, ws in ruled.items() if ws} | (
                {tracks: asdict(supporting[0])} if tracks else {}),
            "power_of_two": _power_of_two(side_values, words, tracks, chosen)}


def _power_of_two(side_values: dict[str, int], words: dict[str, list[Word]], tracks: str | None,
                  chosen: Hypothesis | None) -> str | None:
    """A side that is a power of two is a property, never a quantity: ruled out when the edge, moved, is not one."""
    if not any(is_power_of_two(v) for v in side_values.values()):
        return None
    if tracks and chosen is not None:
        moved = [w for w in words.get(tracks, []) if w.status == "moved"]
        if any(not is_power_of_two(w.value + chosen.offset) for w in moved if w.value is not None):
            return "ruled_out"
    return "coincides"


def as_dict(h: Hypothesis) -> dict[str, Any]:
    return asdict(h) | {"label": label(h.quantity), "coincides": h.coincides, "text": h.text()}
