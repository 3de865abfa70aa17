"""What a transition coincides with: candidate quantities, the relation that holds, the next experiment.

A transition lo|hi has two sides, each named by what it is: for
polluted->clean, lo is the last polluted length and hi the first clean one;
for clean->polluted, lo is the last clean and hi the first polluted
(search.Transition.relations). In the seed study the last polluted length
512 is at once the resolved max capture size, max_num_seqs x (K+1) and
max_num_batched_tokens / (K+1); one transition cannot tell them apart. This
module names the candidates a resolved config offers (`derived_quantities`),
lists those equal to a side of a resolved transition and which relation holds
(`matches`), those inside an unresolved one (`inside`: never an exact match),
and picks the single-knob change predicted to move exactly one coinciding
candidate (`suggest`); a coinciding field of the model's config.json
(`model.<path>`) is moved by the knob `model.override.<path>`. What a
transition tracks across runs is claims.py.
Pure functions over resolved-config dicts and transition dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oneknob.config import knobs, model_override
from oneknob.config.resolution import GRID_STRIDE_EDGE
from oneknob.config.quantities import (  # noqa: F401 (the candidates, for callers of the confounds)
    CANDIDATES,
    POWER_OF_TWO,
    derived_quantities,
    is_power_of_two,
    label,
    ordered,
    overridden,
)
from oneknob.verdict.search import Transition, relation_text

# Knobs a suggestion may turn, most informative first. Eager mode and the runner
# switch the mechanism rather than move a quantity, so they are not offered. A
# coinciding model field's own knob (model.override.<path>) comes after the capture
# size and before the scheduler: it moves that field and nothing in the engine.
SUGGESTION_KNOBS = ("cudagraph.capture", "sched.max_num_seqs", "spec.k")


def _suggestion_knobs(quantities: list[str]) -> list[str]:
    fields = [model_override.PREFIX + q.removeprefix("model.") for q in quantities if q.startswith("model.")]
    return [SUGGESTION_KNOBS[0], *fields, *SUGGESTION_KNOBS[1:]]


def matches(transition: dict[str, Any], resolved: dict[str, Any]) -> list[dict[str, Any]]:
    """Candidates equal to a side of a resolved transition: [{quantity, relation, value}], relation being
    "last_polluted", "first_clean", "last_clean" or "first_polluted". [] for an unresolved transition."""
    found_transition = Transition.from_dict(transition)
    if not found_transition.resolved:
        return []
    quantities = derived_quantities(resolved)
    found = []
    for relation, length in found_transition.relations().items():
        found += [{"quantity": c, "relation": relation, "value": length} for c in ordered(quantities)
                  if quantities.get(c) == length]
        if is_power_of_two(length):
            found.append({"quantity": POWER_OF_TWO, "relation": relation, "value": length})
    return found


def inside(transition: dict[str, Any], resolved: dict[str, Any]) -> list[dict[str, Any]]:
    """Candidates lying in lo..hi of a transition: where the flip may be, for an unresolved one."""
    lo, hi = transition["lo"], transition["hi"]
    quantities = derived_quantities(resolved)
    return [{"quantity": c, "value": quantities[c]} for c in ordered(quantities) if lo <= quantities[c] <= hi]


def matches_text(found: list[dict[str, Any]]) -> str:
    """"last polluted 512 = resolved max capture size, max_num_seqs x (K+1)", one clause per relation."""
    clauses = []
    for relation in dict.fromkeys(m["relation"] for m in found):
        same = [m for m in found if m["relation"] == relation]
        labels = ", ".join(label(m["quantity"]) for m in same)
        clauses.append(f"{relation_text(relation)} {same[0]['value']} = {labels}")
    return "; ".join(clauses)


def inside_text(found: list[dict[str, Any]]) -> str:
    return ", ".join(f"{label(c['quantity'])} ({c['value']})" for c in found) or "no candidate quantity"


def predicted_transition(relation: str, value: int) -> str:
    """The lo|hi a transition would have if its `relation` side were `value`."""
    return f"{value}|{value + 1}" if relation.startswith("last") else f"{value - 1}|{value}"


def _trial_values(knob_key: str, baseline_knobs: dict[str, Any], resolved: dict[str, Any]) -> list[Any]:
    """A small deterministic set of values to try for one knob."""
    if knob_key == "spec.k":
        current = baseline_knobs.get("spec.k", resolved.get("spec_k", 0))
        return [k for k in range(4) if k != current]
    if model_override.is_override(knob_key):  # a model field: 3/4 (off the powers of two), half, double
        base = (resolved.get("model_quantities") or {}).get("model." + knob_key.removeprefix(model_override.PREFIX))
        return [v for v in dict.fromkeys((base * 3 // 4, base // 2, base * 2)) if v > 1 and v != base] if base else []
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
    for rank, knob_key in enumerate(k for k in _suggestion_knobs(quantities) if knobs.is_knob(k)):
        for order, value in enumerate(_trial_values(knob_key, baseline_knobs, baseline_resolved)):
            trial_knobs = {**baseline_knobs, knob_key: value}
            try:
                predicted_resolved = predict(trial_knobs)
            except ValueError:  # KnobError included: a value no engine would start with
                continue
            # the model's length fields: the baseline's, after the trial's model.override.<path>
            predicted_resolved = predicted_resolved | {"model_quantities": overridden(
                baseline_resolved.get("model_quantities"), trial_knobs)}
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
    found: list[dict[str, Any]],
    predict: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any] | None:
    """The single-knob change predicted to move exactly one of the coinciding quantities `found` (matches).

    `predict` maps knob values to a resolved config: resolution.predict with the
    study's settings bound (functools.partial). Prefers moving the max capture
    size, then a value whose new figure is not a power of two and does not
    equal another candidate (so the answer cannot coincide again). None when
    no tried value moves exactly one candidate.
    """
    relations = {m["quantity"]: m["relation"] for m in reversed(found) if m["quantity"] != POWER_OF_TWO}
    quantities = ordered(dict.fromkeys(relations))  # the engine's, then the model's config fields
    if not quantities:
        return None
    trials = sorted(_trials(baseline_knobs, baseline_resolved, quantities, predict), key=lambda t: t[0])
    if not trials:
        return None
    _, knob_key, value, moved, predicted = trials[0]
    baseline = {q: derived_quantities(baseline_resolved).get(q) for q in quantities}
    kept = [f"{label(q)} ({baseline[q]})" for q in quantities if q != moved]
    text = f"set {knob_key}={value}: predicted {label(moved)} {baseline[moved]} -> {predicted[moved]}"
    if kept:
        text += f", while {', '.join(kept)} stay"
    if predicted[moved] is not None:
        relation = relations[moved]
        text += (f"; a transition at {predicted_transition(relation, predicted[moved])} "
                 f"({relation_text(relation)} {predicted[moved]}) would mean it tracks the {label(moved)}")
    return {
        "knob": knob_key,
        "value": value,
        "moves": moved,
        "relation": relations[moved],
        "baseline": baseline,
        "predicted": predicted,
        "alternatives": [{"knob": k, "value": v, "moves": m, "relation": relations[m]}
                         for _, k, v, m, _ in trials[1:]],
        "text": text,
    }


def transition_report(transition: dict[str, Any], resolved: dict[str, Any]) -> dict[str, Any]:
    """One transition of a run: the candidates it coincides with (resolved) or holds inside (unresolved)."""
    found_transition = Transition.from_dict(transition)
    head = f"{found_transition.direction} at {found_transition.text}"
    if not found_transition.resolved:
        within = inside(transition, resolved)
        return {"transition": found_transition.text, "direction": found_transition.direction, "resolved": False,
                "matches": [], "inside": within, "ambiguous": False,
                "text": f"{head} is unresolved: {inside_text(within)} {'lies' if len(within) < 2 else 'lie'} "
                        f"inside {found_transition.lo}..{found_transition.hi}, none is matched exactly"}
    found = matches(transition, resolved)
    quantities = {m["quantity"] for m in found if m["quantity"] != POWER_OF_TWO}
    text = f"{head}: {matches_text(found)}" if found else \
        f"{head}: no candidate quantity equals {found_transition.lo} or {found_transition.hi}"
    return {"transition": found_transition.text, "direction": found_transition.direction, "resolved": True,
            "matches": found, "inside": [], "ambiguous": len(quantities) > 1,
            "text": text + ("; ambiguous" if len(quantities) > 1 else "")}


def confound_report(
    baseline_knobs: dict[str, Any],
    baseline_resolved: dict[str, Any],
    transitions: list[dict[str, Any]],
    predict: Callable[[dict[str, Any]], dict[str, Any]] | None,
) -> dict[str, Any]:
    """Every transition of one run against its candidates, whether any is ambiguous, and what to run next
    (to separate the quantities at the first transition that coincides with any)."""
    if not transitions:
        return {"transitions": [], "coinciding": [], "ambiguous": False, "suggestion": None,
                "text": "no transition, so nothing coincides"}
    per = [transition_report(t, baseline_resolved) for t in transitions]
    first = next((r for r in per if any(m["quantity"] != POWER_OF_TWO for m in r["matches"])), None)
    suggestion = suggest(baseline_knobs, baseline_resolved, first["matches"], predict) if first and predict else None
    text = "; ".join(r["text"] for r in per)
    if suggestion:
        text += f"; next: {suggestion['text']}"
    return {"transitions": per,
            "coinciding": list(dict.fromkeys(m["quantity"] for r in per for m in r["matches"])),
            "ambiguous": any(r["ambiguous"] for r in per), "suggestion": suggestion, "text": text}
