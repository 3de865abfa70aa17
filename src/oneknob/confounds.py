"""What a boundary tracks: candidate quantities, coincidences and the next experiment.

A boundary is the last polluted prompt length (512 when lengths <= 512 are
polluted). In the seed study 512 is at once the resolved max capture size,
max_num_seqs x (K+1) and max_num_batched_tokens / (K+1); one boundary cannot
tell them apart. This module names the candidates a resolved config offers
(`derived_quantities`), lists those equal to a boundary (`coinciding`), says
whether one candidate follows the boundary across the runs of a knob sweep
(`tracks`), and picks the single-knob change predicted to move exactly one
coinciding candidate (`suggest`). Pure functions over resolved-config dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oneknob import knobs
from oneknob.resolution import DEFAULT_CAPTURE_CEILING, GRID_STRIDE_EDGE, graphs_on

# id -> label, in the order they are listed and preferred.
CANDIDATES: dict[str, str] = {
    "max_capture_size": "resolved max capture size",
    "seqs_x_query_len": "max_num_seqs x (K+1)",
    "twice_seqs_x_query_len": "2 x max_num_seqs x (K+1)",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "batched_tokens_per_query_len": "max_num_batched_tokens / (K+1)",
    "default_capture_ceiling": "vLLM's default capture ceiling",
    "grid_stride_edge": "capture-grid stride edge (steps of 8 below it, 16 from it)",
    "power_of_two": "a power of two",
}
# Not a quantity of the config but a property of the boundary: it is listed when
# it coincides, never claimed as what a boundary tracks, and a suggestion avoids it.
POWER_OF_TWO = "power_of_two"

# Knobs a suggestion may turn, most informative first. Eager mode and the runner
# switch the mechanism rather than move a quantity, so they are not offered.
SUGGESTION_KNOBS = ("cudagraph.capture", "sched.max_num_seqs", "spec.k")


def label(candidate: str) -> str:
    return CANDIDATES.get(candidate, candidate)


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def derived_quantities(resolved: dict[str, Any]) -> dict[str, int]:
    """Candidate quantities of one resolved config, by id (see CANDIDATES).

    max_num_batched_tokens / (K+1) is floored: a per-request-slot share of a
    token budget is an integer division in a scheduler. It is left out when
    K = 0, where it would only repeat max_num_batched_tokens. Graph-only
    quantities are left out when no graphs run (eager, CPU).
    """
    query_len = 1 + (resolved.get("spec_k") or 0)
    max_num_seqs = resolved["max_num_seqs"]
    max_num_batched_tokens = resolved["max_num_batched_tokens"]
    quantities: dict[str, int] = {}
    max_capture = resolved.get("max_capture_size")
    if isinstance(max_capture, int) and max_capture > 0:
        quantities["max_capture_size"] = max_capture
    quantities["seqs_x_query_len"] = max_num_seqs * query_len
    quantities["twice_seqs_x_query_len"] = 2 * max_num_seqs * query_len
    quantities["max_num_batched_tokens"] = max_num_batched_tokens
    if query_len > 1:
        quantities["batched_tokens_per_query_len"] = max_num_batched_tokens // query_len
    if graphs_on(resolved):
        # Constants of vLLM's capture logic (resolution.py): a fixed boundary at
        # one of them would not move with any knob.
        quantities["default_capture_ceiling"] = DEFAULT_CAPTURE_CEILING
        quantities["grid_stride_edge"] = GRID_STRIDE_EDGE
    return quantities


def coinciding(last_polluted: int, resolved: dict[str, Any]) -> list[str]:
    """Ids of the candidates equal to the boundary (the last polluted length)."""
    quantities = derived_quantities(resolved)
    found = [c for c in CANDIDATES if quantities.get(c) == last_polluted]
    if is_power_of_two(last_polluted):
        found.append(POWER_OF_TWO)
    return found


def _arrow(values: list[Any]) -> str:
    return " -> ".join("null" if v is None else str(v) for v in values)


def tracks(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Which single quantity equals the boundary in every run of one knob's sweep.

    Each run is {"value": knob value, "last_polluted": int | None, "resolved": {...}}.
    A claim needs at least two runs with a boundary and the boundary must move.
    Always returns a dict: "quantity" is the id (None when there is no claim),
    "reason" says why not ("too_few_boundaries", "never_moved", "ambiguous",
    "unexplained"), "candidates" lists every quantity consistent with all runs,
    "text" says it in one line.
    """
    with_boundary = [run for run in runs if run.get("last_polluted") is not None]
    boundaries = [run["last_polluted"] for run in with_boundary]
    result: dict[str, Any] = {
        "quantity": None,
        "label": None,
        "values": boundaries,
        "knob_values": [run.get("value") for run in with_boundary],
        "candidates": [],
        "reason": None,
        "caveat": None,
        "text": "",
    }
    skipped = len(runs) - len(with_boundary)
    note = f" ({skipped} run{'s' if skipped != 1 else ''} without a boundary not counted)" if skipped else ""

    if len(with_boundary) < 2:
        result["reason"] = "too_few_boundaries"
        result["text"] = f"no claim: {len(with_boundary)} run(s) with a boundary, at least 2 are needed{note}"
        return result
    per_run = [derived_quantities(run["resolved"]) for run in with_boundary]
    consistent = [
        c for c in CANDIDATES if c != POWER_OF_TWO and all(q.get(c) == b for q, b in zip(per_run, boundaries))
    ]
    result["candidates"] = consistent
    if len(set(boundaries)) == 1:
        stayed = ", ".join(label(c) for c in consistent) or "no candidate"
        result["reason"] = "never_moved"
        result["text"] = (
            f"no claim: the boundary stayed at {boundaries[0]} in every run (it equals {stayed}){note}"
        )
        return result
    if len(consistent) > 1:
        result["reason"] = "ambiguous"
        result["text"] = (
            f"ambiguous: boundary {_arrow(boundaries)} equals each of "
            f"{', '.join(label(c) for c in consistent)} in every run{note}"
        )
        return result
    if not consistent:
        result["reason"] = "unexplained"
        result["text"] = (
            f"no single candidate quantity equals the boundary {_arrow(boundaries)} in every run{note}"
        )
        return result

    quantity = consistent[0]
    result.update(quantity=quantity, label=label(quantity))
    result["text"] = (
        f"boundary tracks the {label(quantity)}: {_arrow(boundaries)} "
        f"(knob values {_arrow(result['knob_values'])}){note}"
    )
    if all(is_power_of_two(b) for b in boundaries):
        result["caveat"] = (
            "every boundary is also a power of two; a run whose predicted value is not "
            "a power of two would rule out a power-of-two origin"
        )
    return result


def _trial_values(knob_key: str, baseline_knobs: dict[str, Any], resolved: dict[str, Any]) -> list[Any]:
    """A small deterministic set of values to try for one knob."""
    if knob_key == "spec.k":
        current = baseline_knobs.get("spec.k", resolved.get("spec_k", 0))
        return [k for k in range(4) if k != current]
    field = "max_capture_size" if knob_key == "cudagraph.capture" else "max_num_seqs"
    base = resolved.get(field) or baseline_knobs.get(knob_key)
    if not base:
        return []
    stride = 16 if base >= GRID_STRIDE_EDGE else 8
    three_quarters = (base * 3 // 4) // stride * stride  # off the powers of two, on the grid
    values = [three_quarters, base // 2, base * 2]
    return [v for v in dict.fromkeys(values) if v > 0 and v != base]


def _trials(baseline_knobs, baseline_resolved, quantities, predict):
    """Every (knob, value, predicted quantities) that moves exactly one candidate."""
    baseline = derived_quantities(baseline_resolved)
    for rank, knob_key in enumerate(k for k in SUGGESTION_KNOBS if k in knobs.KNOBS):
        for order, value in enumerate(_trial_values(knob_key, baseline_knobs, baseline_resolved)):
            trial_knobs = {**baseline_knobs, knob_key: value}
            try:
                predicted_resolved = predict(trial_knobs)
            except ValueError:  # KnobError included: a value no engine would start with
                continue
            if predicted_resolved["cudagraph_mode"] != baseline_resolved["cudagraph_mode"]:
                continue  # turning graphs on or off changes the mechanism, not a quantity
            predicted = derived_quantities(predicted_resolved)
            moved = [q for q in quantities if predicted.get(q) != baseline.get(q)]
            if len(moved) != 1:
                continue
            new_value = predicted.get(moved[0])
            others = {v for q, v in predicted.items() if q != moved[0]}
            collides = new_value is None or new_value in others or is_power_of_two(new_value)
            score = (moved[0] != "max_capture_size", rank, collides, order)
            yield score, knob_key, value, moved[0], {q: predicted.get(q) for q in quantities}


def suggest(
    baseline_knobs: dict[str, Any],
    baseline_resolved: dict[str, Any],
    candidates: list[str],
    predict: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any] | None:
    """The single-knob change predicted to move exactly one of `candidates`.

    `predict` maps knob values to a resolved config: resolution.predict with the
    study's settings bound (functools.partial). Prefers moving the max capture
    size, then a value whose new figure is not a power of two and does not
    equal another candidate (so the answer cannot coincide again). None when
    no tried value moves exactly one candidate.
    """
    quantities = [c for c in candidates if c != POWER_OF_TWO]
    if not quantities:
        return None
    found = sorted(_trials(baseline_knobs, baseline_resolved, quantities, predict), key=lambda t: t[0])
    if not found:
        return None
    _, knob_key, value, moved, predicted = found[0]
    baseline = {q: derived_quantities(baseline_resolved).get(q) for q in quantities}
    kept = [f"{label(q)} ({baseline[q]})" for q in quantities if q != moved]
    text = f"set {knob_key}={value}: predicted {label(moved)} {baseline[moved]} -> {predicted[moved]}"
    if kept:
        text += f", while {', '.join(kept)} stay"
    if predicted[moved] is not None:
        text += (
            f"; a boundary at {predicted[moved]}|{predicted[moved] + 1} would mean it tracks the "
            f"{label(moved)}"
        )
    return {
        "knob": knob_key,
        "value": value,
        "moves": moved,
        "baseline": baseline,
        "predicted": predicted,
        "alternatives": [{"knob": k, "value": v, "moves": m} for _, k, v, m, _ in found[1:]],
        "text": text,
    }


def confound_report(
    baseline_knobs: dict[str, Any],
    baseline_resolved: dict[str, Any],
    last_polluted: int | None,
    predict: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Coinciding candidates at one boundary, whether that is ambiguous, and what to run next."""
    if last_polluted is None:
        return {
            "coinciding": [],
            "ambiguous": False,
            "suggestion": None,
            "text": "no boundary, nothing coincides",
        }
    found = coinciding(last_polluted, baseline_resolved)
    suggestion = suggest(baseline_knobs, baseline_resolved, found, predict)
    values = derived_quantities(baseline_resolved)
    listed = ", ".join(f"{label(c)} ({values.get(c, last_polluted)})" for c in found) or "no candidate"
    text = f"last polluted {last_polluted} coincides with {listed}"
    if len(found) > 1:
        text += "; ambiguous"
    if suggestion:
        text += f"; next: {suggestion['text']}"
    return {"coinciding": found, "ambiguous": len(found) > 1, "suggestion": suggestion, "text": text}
