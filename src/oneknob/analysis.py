"""What a set of runs says: boundary shift per knob, the confounds at the baseline, honest notes.

Input is plain run dicts (compare.load_run: requested and resolved configs,
boundary, per-length points); output is the summary that report.py renders and
summary.json holds. Predictions use resolution.predict with the engine
settings the baseline's resolved config reveals, which are the settings
oneknob.app.predicted_resolved uses for a dry run of the same study.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from oneknob import confounds, knobs, resolution
from oneknob.single_variable import change_text

MEASURED = ("ok", "confounded")
GRAPH_KNOBS = ("cudagraph.capture", "cudagraph.enforce_eager")


def measured(run: dict) -> bool:
    return run["status"] in MEASURED and bool(run["points"])


def mean_nll(run: dict, low: int = 0, high: float = float("inf")) -> float | None:
    """Mean of the per-length mean NLLs measured at lengths in [low, high]."""
    values = [p["nll"] for p in run["points"] if low <= p["length"] <= high]
    return sum(values) / len(values) if values else None


def predictor(anchor: dict):
    """resolution.predict bound to the engine settings and defaults the anchor run recorded."""
    resolved, defaults = anchor["resolved"], anchor["defaults"]
    if not defaults:
        return None
    return functools.partial(
        resolution.predict, platform=resolved.get("platform", "cuda"),
        spec_method=resolved.get("spec_method") or "mtp",
        max_num_batched_tokens=defaults["max_num_batched_tokens"],
        default_max_num_seqs=defaults["default_max_num_seqs"], default_runner=defaults["default_runner"])


def _note(run: dict) -> str:
    """The job's own single-variable note (recorded with its run), plus what the run itself shows."""
    parts = [run["check"]["note"]] if run["check"].get("note") else []
    if run["status"] not in (*MEASURED, "noop", "refused"):
        parts.append(f"{run['status']}: {run.get('error') or 'no result'}")
    transitions = sum(a["polluted"] != b["polluted"] for a, b in zip(run["points"], run["points"][1:]))
    if transitions > 1:
        parts.append(f"non-monotone: the verdict changes {transitions} times along length")
    return "; ".join(parts)


def _check_prediction(run: dict, predict) -> list[str]:
    """Resolved fields where the engine did not do what the resolution rules predict."""
    try:
        predicted = predict(run["requested"])
    except ValueError as exc:
        return [f"cannot predict: {exc}"]
    return [change_text(f, predicted.get(f), run["resolved"].get(f)) for f in knobs.RESOLVED_FIELDS
            if predicted.get(f) != run["resolved"].get(f)]


def _check_suggestion(suggestion: dict | None, runs: list[dict], predict) -> list[dict]:
    """The suggested experiment (or one of its alternatives) if this sweep ran it: did it do as predicted?"""
    if not suggestion:
        return []
    checks = []
    options = [dict(suggestion, kind="suggestion")] + [dict(a, kind="alternative")
                                                       for a in suggestion.get("alternatives", [])]
    for option in options:
        for run in runs:
            if run["knob"] != option["knob"] or run["value"] != option["value"] or not measured(run):
                continue
            quantity = option["moves"]
            predicted = confounds.derived_quantities(predict(run["requested"])).get(quantity)
            resolved = confounds.derived_quantities(run["resolved"]).get(quantity)
            held = predicted == resolved
            boundary = run["last_polluted"]
            pair = f"{boundary}|{run['first_clean']}" if boundary is not None else "none"
            which = "the suggested change" if option["kind"] == "suggestion" else "an alternative"
            text = (f"{option['knob']}={json.dumps(option['value'])} ({which}) was run: predicted "
                    f"{confounds.label(quantity)} {predicted}, the engine resolved {resolved} "
                    f"({'prediction held' if held else 'PREDICTION WRONG'}); its boundary {pair} "
                    f"{'equals' if boundary == resolved else 'does not equal'} it, so the boundary "
                    f"{'follows' if boundary == resolved else 'does not follow'} the {confounds.label(quantity)}")
            checks.append({"knob": option["knob"], "value": option["value"], "kind": option["kind"],
                           "quantity": quantity, "predicted": predicted, "resolved": resolved, "held": held,
                           "last_polluted": boundary, "follows": boundary == resolved, "run_id": run["run_id"],
                           "text": text})
    return checks


def _confounds(anchor: dict | None, runs: list[dict], predict) -> dict[str, Any]:
    if anchor is None or anchor["last_polluted"] is None:
        return {"at": anchor and anchor["name"], "run_id": anchor and anchor["run_id"], "last_polluted": None,
                "coinciding": [], "labels": [], "ambiguous": False, "suggestion": None, "checked": [],
                "text": "no boundary at the baseline, so nothing coincides"}
    found = confounds.confound_report(anchor["requested"], anchor["resolved"], anchor["last_polluted"], predict)
    return {"at": anchor["name"], "run_id": anchor["run_id"], "last_polluted": anchor["last_polluted"],
            "coinciding": found["coinciding"], "labels": [confounds.label(c) for c in found["coinciding"]],
            "ambiguous": found["ambiguous"], "suggestion": found["suggestion"],
            "checked": _check_suggestion(found["suggestion"], runs, predict), "text": found["text"]}


def _tracks(knob_names: list[str], baseline: dict | None, runs: list[dict]) -> dict[str, dict]:
    detail = {}
    for knob in knob_names:
        series = [{"value": baseline["requested"].get(knob), "last_polluted": baseline["last_polluted"],
                   "resolved": baseline["resolved"]}] if baseline is not None and measured(baseline) else []
        series += [r for r in runs if r["knob"] == knob and measured(r)]
        detail[knob] = confounds.tracks(series)
    return detail


def _notes(runs: list[dict], baseline: dict | None, predictions: dict) -> list[str]:
    notes = []
    if any(r["resolved"].get("platform") == "cpu" for r in runs):
        notes.append("the engine ran on CPU: CUDA-graph knobs (" + ", ".join(GRAPH_KNOBS) + ") have no "
                     "effect there (resolved cudagraph_mode NONE), so a graph-replay boundary cannot show")
    elif runs and all(r["resolved"].get("cudagraph_mode") == "NONE" for r in runs if r["resolved"]):
        notes.append("no run used CUDA graphs (resolved cudagraph_mode NONE everywhere)")
    if baseline is None:
        notes.append("no baseline run among these runs: shifts are compared between variants only, "
                     "and confounds are read at the first run with a boundary")
    for run in runs:
        if run["note"] and run is not baseline:
            notes.append(f"{run['name']}: {run['note']}")
    for name, wrong in predictions["mismatches"].items():
        notes.append(f"{name}: the engine resolved differently from the resolution rules: {'; '.join(wrong)}")
    return notes


def summarize(meta: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    baseline = next((r for r in runs if r["knob"] is None), None)
    anchor = baseline or next((r for r in runs if measured(r) and r["last_polluted"] is not None), None)
    anchor = anchor or next((r for r in runs if r["resolved"]), None)
    predict = predictor(anchor) if anchor and anchor["resolved"] else None
    for run in runs:
        run["changed"], run["side_effects"] = run["check"].get("diff", {}), run["check"].get("side_effects", [])
        run["note"] = _note(run)
        has_boundary = run["last_polluted"] is not None and run["first_clean"] is not None
        run["nll_below"] = mean_nll(run, high=run["last_polluted"]) if has_boundary else None
        run["nll_above"] = mean_nll(run, low=run["first_clean"]) if has_boundary else None
        run["nll_mean"] = mean_nll(run)
    knob_names = list(dict.fromkeys(r["knob"] for r in runs if r["knob"]))
    detail = _tracks(knob_names, baseline, runs)
    pooled = [{"value": r["name"], "last_polluted": r["last_polluted"], "resolved": r["resolved"]}
              for r in runs if measured(r)]
    mismatches = {r["name"]: m for r in runs if r["resolved"] and predict and (m := _check_prediction(r, predict))}
    predictions = {"checked": sum(bool(r["resolved"]) for r in runs), "mismatches": mismatches}
    return {
        **meta,
        "engine": anchor["engine"] if anchor else None,
        "baseline_run_id": baseline["run_id"] if baseline else None,
        "baseline": {"requested": baseline["requested"], "resolved": baseline["resolved"]} if baseline else None,
        "runs": [{k: v for k, v in r.items() if k not in ("start_time",)} for r in runs],
        "tracks": {k: d["quantity"] for k, d in detail.items()},
        "tracks_detail": detail,
        "overall": confounds.tracks(pooled),
        "confounds": _confounds(anchor, runs, predict),
        "predictions": predictions,
        "notes": _notes(runs, baseline, predictions),
    }


def missing_from_tracking(outcomes: list[dict], runs: list[dict]) -> list[str]:
    """Jobs the sweep ran whose run the tracking store lacks or holds only in part."""
    known = {r["run_id"] for r in runs}
    notes = []
    for outcome in outcomes:
        name = f"{outcome.get('knob')}={json.dumps(outcome.get('value'))}" if outcome.get("knob") else "baseline"
        if not outcome.get("run_id"):
            notes.append(f"{name}: failed before its run was recorded: {outcome.get('error', 'no error text')}")
        elif outcome["run_id"] not in known or outcome.get("tracking"):
            notes.append(f"{name}: its MLflow run is incomplete ({outcome.get('tracking', 'not found')}); "
                         "this comparison lacks it until it is uploaded")
    return notes
