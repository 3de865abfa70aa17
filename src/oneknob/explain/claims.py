"""What a boundary tracks across runs: one quantity and one relation, or an honest "no claim".

A claim says that in every run with a resolved transition, one candidate
quantity equals the same side of a transition ("last polluted = resolved max
capture size", "first clean = ...", "last clean = ...", "first polluted =
..."), and that the quantity moved between runs. Unresolved transitions are
never matched: they are listed with the candidates lying inside them. When no
single quantity fits every run but different quantities fit different runs,
the runs conflict; the min or max of two quantities may reconcile them
(`reconcile`). Pure functions over run dicts {value, name, transitions,
resolved}; confounds.py owns the quantities.
"""

from __future__ import annotations

import itertools
from typing import Any

from oneknob.explain.confounds import CANDIDATES, POWER_OF_TWO, derived_quantities, inside_text, is_power_of_two, label
from oneknob.explain.confounds import inside as candidates_inside
from oneknob.explain.confounds import matches as transition_matches
from oneknob.verdict.search import Transition, relation_text

COMBINERS = {"min": min, "max": max}
COMBINER_WORDS = {"min": "the smaller", "max": "the larger"}


def _rank(quantity: str) -> tuple[int, str]:
    """The engine's candidates in CANDIDATES order, then the model's (model.<path>) by name."""
    return (list(CANDIDATES).index(quantity), "") if quantity in CANDIDATES else (len(CANDIDATES), quantity)


def model_claims(run: dict[str, Any]) -> list[tuple[str, str]]:
    """(quantity, relation) of the model's own thresholds (model.<path>) equal to a side of a resolved transition."""
    return [key for key in _matched(run) if key[0].startswith("model.")]


def _arrow(values: list[Any]) -> str:
    return " -> ".join("null" if v is None else str(v) for v in values)


def _claim_text(quantity: str, relation: str) -> str:
    return f"{relation_text(relation)} = {label(quantity)}"


def _claims_text(keys: list[tuple[str, str]]) -> str:
    """"last polluted = A, B; first clean = C": (quantity, relation) pairs grouped by relation."""
    relations = dict.fromkeys(r for _, r in keys)
    return "; ".join(f"{relation_text(r)} = {', '.join(label(q) for q, rr in keys if rr == r)}" for r in relations)


def _matched(run: dict[str, Any]) -> dict[tuple[str, str], int]:
    """(quantity, relation) -> value for every candidate equal to a side of a resolved transition."""
    return {(m["quantity"], m["relation"]): m["value"] for t in run["transitions"]
            for m in transition_matches(t, run["resolved"]) if m["quantity"] != POWER_OF_TWO}


def _transitions_text(run: dict[str, Any]) -> str:
    """"512|513" or "299|300, 400|401": every transition of a run."""
    return ", ".join(Transition.from_dict(t).text for t in run["transitions"]) or "none"


def _unresolved(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every unresolved transition of these runs, with the candidates inside it."""
    found = []
    for run in runs:
        for t in run["transitions"]:
            if not t["resolved"]:
                within = candidates_inside(t, run["resolved"])
                found.append({"run": run.get("name") or str(run.get("value")), "transition": f"{t['lo']}..{t['hi']}",
                              "inside": [c["quantity"] for c in within], "text": inside_text(within)})
    return found


def fits(run: dict[str, Any], relation: str, value: int) -> bool:
    """Whether a resolved transition of the run has `value` on its `relation` side."""
    return any(t["resolved"] and Transition.from_dict(t).relations().get(relation) == value
               for t in run["transitions"])


def reconcile(runs: list[dict[str, Any]], claims: list[tuple[str, str]]) -> dict[str, Any] | None:
    """The min or max of two claimed quantities (same relation) that fits every run with a resolved transition."""
    exact = [r for r in runs if any(t["resolved"] for t in r["transitions"])]
    for (a, relation), (b, other) in itertools.combinations(claims, 2):
        if relation != other or a == b:
            continue
        for name, combine in COMBINERS.items():
            values = []
            for run in exact:
                quantities = derived_quantities(run["resolved"])
                if a not in quantities or b not in quantities:
                    break
                values.append(combine(quantities[a], quantities[b]))
            else:
                if all(fits(run, relation, v) for run, v in zip(exact, values)):
                    return {"combine": name, "quantities": [a, b], "relation": relation, "values": values,
                            "text": f"{name}({label(a)}, {label(b)}) fits every run ({relation_text(relation)} = "
                                    f"it: {_arrow(values)}): the boundary may track {COMBINER_WORDS[name]} of the two"}
    return None


def _partial_claims(exact: list[dict[str, Any]], matched: list[dict]) -> list[dict[str, Any]]:
    """Quantities that fit (and move across) at least two runs, though not all."""
    found = []
    quantities = sorted({q for m in matched for q, _ in m}, key=_rank)
    for quantity, relation in itertools.product(quantities, ("last_polluted", "first_clean", "last_clean",
                                                             "first_polluted")):
        supporters = [(run, m[(quantity, relation)]) for run, m in zip(exact, matched) if (quantity, relation) in m]
        if len(supporters) >= 2 and len({v for _, v in supporters}) > 1:
            found.append({"quantity": quantity, "relation": relation,
                          "runs": [run.get("name") or str(run.get("value")) for run, _ in supporters]})
    return found


def tracks(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Which single quantity equals the same side of a resolved transition in every run of a sweep.

    A claim needs at least two runs with a resolved transition, and the quantity must move. Always returns a
    dict: "quantity"/"relation" (None when there is no claim), "reason" says why not ("too_few_boundaries",
    "unresolved", "never_moved", "ambiguous", "unexplained", "conflict"), "candidates" lists every
    (quantity, relation) consistent with all runs, "unresolved" the unresolved transitions with the
    candidates inside them, "conflict" the partial claims and any reconciliation, "text" one line.
    """
    exact = [r for r in runs if any(t["resolved"] for t in r["transitions"])]
    unresolved = _unresolved(runs)
    result: dict[str, Any] = {"quantity": None, "relation": None, "label": None, "values": [],
                              "boundaries": [_transitions_text(r) for r in exact],
                              "knob_values": [r.get("value") for r in exact], "candidates": [], "reason": None,
                              "caveat": None, "unresolved": unresolved, "conflict": None, "text": ""}
    skipped = len(runs) - len(exact)
    note = f" ({skipped} run{'s' if skipped != 1 else ''} without a resolved transition not counted)" if skipped else ""
    if unresolved:
        note += "; unresolved, so never matched exactly: " + "; ".join(
            f"{u['run']} {u['transition']} holds {u['text']}" for u in unresolved)
    if len(exact) < 2:
        common = [c for c in CANDIDATES if unresolved and all(c in u["inside"] for u in unresolved)]
        if common and len(unresolved) > 1:
            note += (f"; {', '.join(label(c) for c in common)} lie(s) inside every unresolved transition: "
                     "consistent with tracking it, not exact")
        result["reason"] = "unresolved" if unresolved else "too_few_boundaries"
        result["text"] = (f"no exact claim: {len(exact)} run(s) with a resolved transition, at least 2 are "
                          f"needed{note}")
        if exact and (model := model_claims(exact[0])):  # a threshold the model declares: a coincidence
            quantity, relation = model[0]
            result.update(quantity=quantity, relation=relation, label=label(quantity),
                          values=[_matched(exact[0])[model[0]]], reason="model_threshold")
            result["text"] = (f"the transition {_transitions_text(exact[0])} coincides with the model's own "
                              f"threshold ({_claims_text(model)}, from its config.json); only a run that moves it "
                              f"(model.override.{quantity.removeprefix('model.')}) can tell whether it tracks "
                              f"it{note}")
        return result
    matched = [_matched(run) for run in exact]
    consistent = [key for key in matched[0] if all(key in m for m in matched[1:])]
    consistent.sort(key=lambda key: _rank(key[0]))
    result["candidates"] = [{"quantity": q, "relation": r} for q, r in consistent]
    moving = [key for key in consistent if len({m[key] for m in matched}) > 1]
    if len({_transitions_text(r) for r in exact}) == 1:
        stayed = _claims_text(consistent) or "no candidate"
        result["reason"] = "never_moved"
        result["text"] = f"no claim: the boundary stayed at {_transitions_text(exact[0])} in every run ({stayed}){note}"
        if model := [key for key in consistent if key[0].startswith("model.")]:
            result.update(quantity=model[0][0], relation=model[0][1], label=label(model[0][0]),
                          values=[m[model[0]] for m in matched], reason="model_threshold")
            result["text"] = (f"the boundary stayed at {_transitions_text(exact[0])} in every run, where it "
                              f"coincides with the model's own threshold ({_claims_text(model)}, from its "
                              f"config.json; none of these runs moved it; also {stayed}){note}")
        return result
    if len(moving) > 1:
        result["reason"] = "ambiguous"
        result["text"] = (f"ambiguous: in every run the boundary ({_arrow(result['boundaries'])}) fits each of "
                          f"{_claims_text(moving)}{note}")
        return result
    if not moving:
        static = "".join(f"; {_claim_text(q, r)} fits every run but never moves" for q, r in consistent)
        return _no_single_quantity(result, exact, matched, static + note)
    quantity, relation = moving[0]
    values = [m[moving[0]] for m in matched]
    result.update(quantity=quantity, relation=relation, label=label(quantity), values=values)
    result["text"] = (f"boundary tracks the {label(quantity)} ({_claim_text(quantity, relation)}): {_arrow(values)} "
                      f"(transitions {_arrow(result['boundaries'])}; knob values {_arrow(result['knob_values'])})"
                      f"{note}")
    if all(is_power_of_two(v) for v in values):
        result["caveat"] = ("every boundary is also a power of two; a run whose predicted value is not "
                            "a power of two would rule out a power-of-two origin")
    return result


def _no_single_quantity(result: dict, exact: list[dict], matched: list[dict], note: str) -> dict:
    """No quantity fits every run: a conflict when different quantities fit different runs, else unexplained."""
    partial = _partial_claims(exact, matched)
    if len({p["quantity"] for p in partial}) < 2:
        result["reason"] = "unexplained"
        fits = "".join(f"; {_claim_text(p['quantity'], p['relation'])} fits only {', '.join(p['runs'])}"
                       for p in partial)
        result["text"] = (f"no single candidate quantity fits the boundary {_arrow(result['boundaries'])} in "
                          f"every run{fits}{note}")
        return result
    reconciled = reconcile(exact, [(p["quantity"], p["relation"]) for p in partial])
    result["reason"] = "conflict"
    result["conflict"] = {"claims": partial, "reconciled": reconciled}
    said = "; ".join(f"runs {', '.join(p['runs'])} say {_claim_text(p['quantity'], p['relation'])}" for p in partial)
    result["text"] = (f"conflict: {said}; no single quantity fits every run; "
                      + (reconciled["text"] if reconciled else "neither the min nor the max of two of them fits "
                                                               "every run either") + note)
    return result
