"""What one job found, as it is recorded: transitions, samples that disagree, summary metrics and tags.

`found(search_result, points, verdict)` turns a finished search and the judged points into the outcome's
measured part (result.json); `summary(outcome)` into the run's summary metrics and tags (MLflow). Every
transition is kept, with how many samples its polluted side has and whether its clean side is clean by one
tolerance alone. `boundary_last_polluted`/`boundary_first_clean` are logged only for the seed's shape (one
resolved polluted->clean transition), the one shape where those names are true; `boundary_lo/hi/direction/
resolved` describe the first transition of any shape, and `transitions` counts them.
"""

from __future__ import annotations

import json
from typing import Any

from oneknob.config.schema import DECODE_ORACLES
from oneknob.verdict import search
from oneknob.verdict.decode import position
from oneknob.verdict.judge import Point, disagreeing, samples_text, tolerance_edge, tolerance_text

TRANSITIONS_TAG_CHARS = 7000  # MLflow caps a tag's value; result.json always has the full list


def transition_record(transition: search.Transition, points: dict[int, list[Point]], verdict) -> dict[str, Any]:
    """A transition as recorded: its polluted side's sample count, and a tolerance-only edge if it is one."""
    polluted = points[transition.polluted_side]
    record = transition.as_dict() | {"polluted_samples": sum(p.polluted for p in polluted), "samples": len(polluted)}
    edge = tolerance_edge(points[transition.clean_side], verdict)
    return record | ({"tolerance": edge} if edge else {})


def oracle_record(name: str, result: search.SearchResult, points: dict[int, list[Point]], verdict) -> dict[str, Any]:
    """One oracle's verdicts and transitions; for the decode oracles also where each polluted continuation first
    diverged, as a token position (a continuation after L tokens covers L .. L + N - 1)."""
    def flagged(p: Point) -> bool:
        return bool(getattr(p, f"{name}_polluted", None)) if getattr(p, f"{name}_polluted", None) is not None \
            else p.polluted

    transitions = []
    for t in result.transitions:
        side = points[t.polluted_side]
        record = t.as_dict() | {"polluted_samples": sum(flagged(p) for p in side), "samples": len(side)}
        if name in DECODE_ORACLES:
            record |= first_positions(name, t.polluted_side, side, verdict.greedy_tokens)
        elif name == "nll" and (edge := tolerance_edge(points[t.clean_side], verdict)):
            record["tolerance"] = edge
        transitions.append(record)
    return {"flagged": [L for L, v in result.verdicts.items() if v == search.POLLUTED],
            "verdicts": {str(L): v for L, v in result.verdicts.items()}, "transitions": transitions,
            "shape": result.shape(), "budget_hit": result.budget_hit}


def first_positions(name: str, length: int, points: list[Point], tokens: int) -> dict[str, Any]:
    """The positions a continuation after `length` covers, and its first divergent one (over the samples)."""
    offset = "greedy_first_divergence" if name == "greedy" else "decode_first_deviation"
    positions = [position(length, getattr(p, offset)) for p in points]
    first = min((x for x in positions if x is not None), default=None)
    return {"covers": [length, length + tokens - 1], **({"first_position": first} if first is not None else {})}


def found(result: search.SearchResult, points: dict[int, list[Point]], verdict,
          by_oracle: dict[str, search.SearchResult] | None = None) -> dict[str, Any]:
    """The measured part of a job's outcome: the combined verdicts (polluted where any oracle is) and each
    oracle's own."""
    by_oracle = by_oracle or {"nll": result}
    transitions = [transition_record(t, points, verdict) for t in result.transitions]
    split = [{"length": L, "polluted": sum(p.polluted for p in pts), "samples": len(pts)}
             for L, pts in sorted(points.items()) if disagreeing(pts)]
    only = result.transitions[0] if len(result.transitions) == 1 else None
    seed_shape = only is not None and only.resolved and only.direction == search.DOWN
    return {
        "describe": describe(result, transitions, split, by_oracle),
        "oracles": {name: oracle_record(name, r, points, verdict) for name, r in by_oracle.items()},
        "transitions": transitions,
        "last_polluted": only.lo if seed_shape else None,
        "first_clean": only.hi if seed_shape else None,
        "polluted_spans": [list(span) for span in search.polluted_spans(result.verdicts)],
        "verdicts": {str(L): v for L, v in result.verdicts.items()},  # every probed length (a bisection's criterion)
        "monotone": result.monotone, "budget_hit": any(r.budget_hit for r in (result, *by_oracle.values())),
        "probes": result.probes,
        "max_probes": result.max_probes, "unprobed": result.unprobed,
        "disagreements": split,
    }


def describe(result: search.SearchResult, transitions: list[dict], split: list[dict],
             by_oracle: dict[str, search.SearchResult]) -> str:
    """The search's line over every oracle, plus what it cannot see: tolerance-only edges and samples that
    disagree."""
    parts = [search.headline(result, by_oracle)]
    for record in transitions:
        if "tolerance" in record:
            parts.append(f"{search.Transition.from_dict(record).text} is {tolerance_text(record['tolerance'])}")
    if split:
        parts.append("samples disagree: " + ", ".join(f"{d['length']} ({samples_text(d['polluted'], d['samples'])})"
                                                      for d in split))
    return "; ".join(parts)


def summary(outcome: dict[str, Any]) -> tuple[list[tuple], dict[str, str]]:
    """(metrics at step 0, tags) for a finished job's run: the combined transitions, and each oracle's
    (`transitions_<oracle>`, tag `oneknob.transitions.<oracle>`)."""
    metrics: list[tuple] = []
    tags: dict[str, str] = {}
    for name, record in (outcome.get("oracles") or {}).items():
        metrics.append((f"transitions_{name}", len(record["transitions"]), 0))
        tags[f"oneknob.transitions.{name}"] = _fitting_json(record["transitions"], TRANSITIONS_TAG_CHARS)
    if "transitions" in outcome:
        transitions = outcome["transitions"]
        metrics += [("transitions", len(transitions), 0), ("probes", outcome["probes"], 0),
                    ("search_budget_hit", float(outcome["budget_hit"]), 0)]
        if transitions:
            first = search.Transition.from_dict(transitions[0])
            metrics += [("boundary_lo", first.lo, 0), ("boundary_hi", first.hi, 0),
                        ("boundary_direction", first.sign, 0), ("boundary_resolved", float(first.resolved), 0)]
        tags["oneknob.transitions"] = _fitting_json(transitions, TRANSITIONS_TAG_CHARS)
    if outcome.get("last_polluted") is not None:
        metrics += [("boundary_last_polluted", outcome["last_polluted"], 0),
                    ("boundary_first_clean", outcome["first_clean"], 0)]
    return metrics, tags


def _fitting_json(records: list[dict], limit: int) -> str:
    """As many records as fit in `limit` characters of JSON (a tag); compare reads the verdicts when cut."""
    for count in range(len(records), -1, -1):
        text = json.dumps(records[:count], separators=(",", ":"))
        if len(text) <= limit:
            return text
    return "[]"
