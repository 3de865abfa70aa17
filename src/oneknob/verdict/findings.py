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

from oneknob.verdict import search
from oneknob.verdict.judge import Point, disagreeing, samples_text, tolerance_edge, tolerance_text

TRANSITIONS_TAG_CHARS = 7000  # MLflow caps a tag's value; result.json always has the full list


def transition_record(transition: search.Transition, points: dict[int, list[Point]], verdict) -> dict[str, Any]:
    """A transition as recorded: its polluted side's sample count, and a tolerance-only edge if it is one."""
    polluted = points[transition.polluted_side]
    record = transition.as_dict() | {"polluted_samples": sum(p.polluted for p in polluted), "samples": len(polluted)}
    edge = tolerance_edge(points[transition.clean_side], verdict)
    return record | ({"tolerance": edge} if edge else {})


def found(result: search.SearchResult, points: dict[int, list[Point]], verdict) -> dict[str, Any]:
    """The measured part of a job's outcome."""
    transitions = [transition_record(t, points, verdict) for t in result.transitions]
    split = [{"length": L, "polluted": sum(p.polluted for p in pts), "samples": len(pts)}
             for L, pts in sorted(points.items()) if disagreeing(pts)]
    only = result.transitions[0] if len(result.transitions) == 1 else None
    seed_shape = only is not None and only.resolved and only.direction == search.DOWN
    return {
        "describe": describe(result, transitions, split),
        "transitions": transitions,
        "last_polluted": only.lo if seed_shape else None,
        "first_clean": only.hi if seed_shape else None,
        "polluted_spans": [list(span) for span in search.polluted_spans(result.verdicts)],
        "verdicts": {str(L): v for L, v in result.verdicts.items()},  # every probed length (a bisection's criterion)
        "monotone": result.monotone, "budget_hit": result.budget_hit, "probes": result.probes,
        "max_probes": result.max_probes, "unprobed": result.unprobed,
        "disagreements": split,
    }


def describe(result: search.SearchResult, transitions: list[dict], split: list[dict]) -> str:
    """The search's line, plus what it cannot see: tolerance-only edges and samples that disagree."""
    parts = [result.describe()]
    for record in transitions:
        if "tolerance" in record:
            parts.append(f"{search.Transition.from_dict(record).text} is {tolerance_text(record['tolerance'])}")
    if split:
        parts.append("samples disagree: " + ", ".join(f"{d['length']} ({samples_text(d['polluted'], d['samples'])})"
                                                      for d in split))
    return "; ".join(parts)


def summary(outcome: dict[str, Any]) -> tuple[list[tuple], dict[str, str]]:
    """(metrics at step 0, tags) for a finished job's run."""
    metrics: list[tuple] = []
    tags: dict[str, str] = {}
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
