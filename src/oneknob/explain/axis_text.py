"""What a run's axis means to the explanation: units, tokens per step, and the report's lines for it.

A run's transitions are in its axis's units (prompt tokens, neighbours, neighbour tokens, concurrent requests;
oneknob.plan.axis). The engine's thresholds (capture size, batched tokens, ...) are in tokens per step, which is
the prompt length on axis=length and probe + neighbours on axis=batch. `in_step_tokens(run)` restates a batch
run's transitions in tokens per step, so claims and confounds compare like with like; `edge_lines(run)` says
in words what the edge tracks.
"""

from __future__ import annotations

from typing import Any

from oneknob.explain import confounds
from oneknob.plan.axis import Axis
from oneknob.verdict.search import Transition


def axis_of(run: dict[str, Any]) -> Axis:
    return Axis.from_dict(run["axis_detail"]) if run.get("axis_detail") else Axis()


def in_step_tokens(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's transitions in tokens per step (unchanged on axis=length; [] on axis=repeat, which has none)."""
    axis = axis_of(run)
    if axis.name == "length":
        return run["transitions"]
    if axis.name != "batch":
        return []
    found = []
    for record in run["transitions"]:
        lo, hi = axis.step_tokens(record["lo"]), axis.step_tokens(record["hi"])
        # a resolved flip is resolved in tokens per step only when adjacent values are adjacent step sizes
        found.append(record | {"lo": lo, "hi": hi, "resolved": record["resolved"] and hi == lo + 1})
    return found


def series_view(run: dict[str, Any]) -> dict[str, Any]:
    """The run as claims and confounds should see it: transitions in tokens per step."""
    return run | {"transitions": in_step_tokens(run)}


def edge_lines(run: dict[str, Any]) -> list[str]:
    """axis=batch: per transition, what it is in tokens per step and which candidate equals a side of it."""
    axis = axis_of(run)
    if axis.name != "batch":
        return []
    lines = []
    for record, steps in zip(run["transitions"], in_step_tokens(run)):
        t, s = Transition.from_dict(record), Transition.from_dict(steps)
        text = (f"{run['name']}: {t.text} {axis.unit} is {s.text} tokens per step (probe {axis.probe_length} + "
                "neighbours)")
        found = [m for m in confounds.matches(steps, run.get("resolved") or {})
                 if m["quantity"] != confounds.POWER_OF_TWO]
        if found:
            text += f"; the edge tracks tokens per step: {confounds.matches_text(found)}"
        elif s.resolved:
            text += f"; no candidate quantity equals {s.lo} or {s.hi} tokens per step"
        lines.append(text)
    unscheduled = run.get("schedule_labels") or {}
    if unscheduled:
        lines.append(f"{run['name']}: not co-scheduled (judged, but the step was not what the point claims): "
                     + ", ".join(f"{v} ({label})" for v, label in unscheduled.items()))
    return lines


def agreement_cell(point: dict[str, Any]) -> str:
    """axis=repeat: identical | within tolerance (max d) | differs (max d), from the point's metrics."""
    if point.get("identical"):
        return "identical"
    deviation = point.get("max_abs_delta")
    said = "" if deviation is None else f" (max {deviation:.3g} nats)"
    return ("differs" if point.get("polluted") else "within tolerance") + said
