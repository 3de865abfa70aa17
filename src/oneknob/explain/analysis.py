"""What a set of runs says: the transitions of each run, what they track per knob, the confounds at the
baseline, honest notes.

Input is plain run dicts (compare.load_run: requested and resolved configs, transitions, per-length points,
the engine defaults the run recorded); output is the summary that report.py renders and summary.json holds.
Predictions use resolution.predict bound to each run's own recorded platform and engine defaults
(params `defaults.*`), never assumed ones. A resolved config marked `simulated` (the synthetic engine) IS
that prediction, so "as predicted" is said to hold by construction there, not claimed as a finding.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from oneknob.explain import axis_text
from oneknob.explain import claims
from oneknob.explain import confounds
from oneknob.explain import explained
from oneknob.explain import oracle_views
from oneknob.explain import steps
from oneknob.explain import tested
from oneknob.config import knobs
from oneknob.config import quantities, resolution
from oneknob.verdict import search
from oneknob.explain import versus
from oneknob.explain import warnings_text
from oneknob.verdict.search import Transition, relation_text
from oneknob.plan.single_variable import change_text
from oneknob.verdict.judge import samples_text, tolerance_text

MEASURED = ("ok", "confounded")
GRAPH_KNOBS = ("cudagraph.capture", "cudagraph.enforce_eager")


def measured(run: dict) -> bool:
    return run["status"] in MEASURED and bool(run["points"])


def mean_nll(run: dict, polluted: bool | None = None) -> float | None:
    """Mean of the per-length mean NLLs at the lengths with this verdict (all lengths when None)."""
    values = [p["nll"] for p in run["points"] if polluted is None or p["polluted"] == polluted]
    return sum(values) / len(values) if values else None


def predictor(run: dict):
    """resolution.predict bound to the platform and engine defaults this run recorded; None without them. The
    model's length fields are this run's, after the model.override.<path> of the knob values predicted for."""
    resolved, defaults = run["resolved"], run["defaults"]
    if not defaults or not resolved:
        return None
    ceiling = defaults.get("capture_ceiling") or resolution.DEFAULT_CAPTURE_CEILING
    # the release the run's vLLM was ("vllm 0.34.0 + patch"): past the rules' releases nothing is predicted
    release = re.search(r"\d+\.\d+[\w.]*", str(resolved.get("build") or ""))

    def predict(knob_values: dict) -> dict:
        return resolution.predict(
            knob_values, platform=resolved.get("platform", "cuda"), spec_method=resolved.get("spec_method") or "mtp",
            max_num_batched_tokens=defaults["max_num_batched_tokens"],
            default_max_num_seqs=defaults["default_max_num_seqs"], default_runner=defaults["default_runner"],
            capture_ceiling=ceiling, emulated=bool(defaults.get("emulate_cuda_graphs")),
            vllm_version=release.group(0) if release else None) | {
            "device_capture_ceiling": ceiling} | ({"model_quantities": quantities.overridden(
                resolved["model_quantities"], knob_values)} if resolved.get("model_quantities") else {})
    return predict


def simulated(runs: list[dict]) -> bool:
    """Every resolved config came from the resolution rules themselves (the synthetic engine)."""
    resolved = [r["resolved"] for r in runs if r["resolved"]]
    return bool(resolved) and all(r.get("simulated") for r in resolved)


# -- one run ----------------------------------------------------------------------------------------

def split_samples(run: dict) -> list[dict]:
    """Lengths where the samples disagree (some polluted, some clean): the verdict is polluted there."""
    return [{"length": p["length"], "polluted": p["polluted_samples"], "samples": run["samples"]}
            for p in run["points"] if p.get("polluted_samples") and run.get("samples")
            and p["polluted_samples"] < run["samples"]]


def budget_text(run: dict) -> str | None:
    """Why some transitions are unresolved, and the setting that resolves them."""
    unresolved = [Transition.from_dict(t) for t in run["transitions"] if not t["resolved"]]
    if not unresolved:
        return None
    listed = ", ".join(f"{t.lo}..{t.hi}" for t in unresolved)
    if run["search"].get("bisect") is False:
        return (f"bisection is off (search.bisect=false), so {listed} stay as wide as the grid: "
                "set search.bisect=true to narrow them to adjacent lengths")
    needed = (run["probes"] or 0) + sum(math.ceil(math.log2(t.hi - t.lo)) for t in unresolved)
    return (f"the probe budget ran out (search.max_probes={run['search'].get('max_probes')}, {run['probes']} "
            f"probes) before {listed} narrowed to adjacent lengths: raise it, e.g. search.max_probes={needed}")


def shape_text(run: dict) -> str:
    """The run's transitions in one line: all clean, one transition, or non-monotone with its islands."""
    transitions = [Transition.from_dict(t) for t in run["transitions"]]
    if not transitions:
        verdicts = {p["polluted"] for p in run["points"]}
        return "all clean" if verdicts == {False} else "all polluted" if verdicts == {True} else "nothing measured"
    if len(transitions) == 1:
        return transitions[0].describe()
    spans = search.polluted_spans({p["length"]: "polluted" if p["polluted"] else "clean" for p in run["points"]})
    return (f"non-monotone: {len(transitions)} transitions ("
            + ", ".join(f"{t.direction} at {t.text}" for t in transitions) + "); polluted at "
            + " and ".join(f"{a}..{b}" if a != b else str(a) for a, b in spans))


def _note(run: dict) -> str:
    """The job's own single-variable note (recorded with its run), plus what the run itself shows."""
    parts = [run["check"]["note"]] if run["check"].get("note") else []
    if run["status"] not in (*MEASURED, "noop", "refused"):
        parts.append(f"{run['status']}: {run.get('error') or 'no result'}")
    if len(run["transitions"]) > 1:
        parts.append(shape_text(run))
    parts += [f"{Transition.from_dict(t).text} is {tolerance_text(t['tolerance'])}"
              for t in run["transitions"] if t.get("tolerance")]
    if run["budget"]:
        parts.append(run["budget"])
    if run["split_samples"]:
        parts.append("samples disagree at " + ", ".join(
            f"{s['length']} ({samples_text(s['polluted'], s['samples'])})" for s in run["split_samples"])
            + "; a length is polluted when any sample is")
    return "; ".join(parts)


# -- across runs ------------------------------------------------------------------------------------

def _check_prediction(run: dict) -> list[str]:
    """Resolved fields where the engine did not do what the resolution rules predict, with its defaults."""
    predict = predictor(run)
    if predict is None:
        return []
    try:
        predicted = predict(run["requested"])
    except ValueError as exc:
        return [f"cannot predict: {exc}"]
    unsaid = {f for f in predicted if predicted.get("not_predicted") and predicted[f] is None}  # vLLM 0.34's sizes
    return [change_text(f, predicted.get(f), run["resolved"].get(f)) for f in knobs.RESOLVED_FIELDS
            if f in predicted and f not in unsaid and predicted.get(f) != run["resolved"].get(f)]  # nor of "build"


def _check_suggestion(suggestion: dict | None, runs: list[dict], predict) -> list[dict]:
    """The suggested experiment (or one of its alternatives) if this sweep ran it: did it do as predicted?"""
    if not suggestion or predict is None:
        return []
    checks = []
    options = [dict(suggestion, kind="suggestion")] + [dict(a, kind="alternative")
                                                       for a in suggestion.get("alternatives", [])]
    for option in options:
        for run in runs:
            if run["knob"] != option["knob"] or run["value"] != option["value"] or not measured(run):
                continue
            quantity, relation = option["moves"], option["relation"]
            predicted = confounds.derived_quantities(predict(run["requested"])).get(quantity)
            resolved = confounds.derived_quantities(run["resolved"]).get(quantity)
            held = None if run["resolved"].get("simulated") else predicted == resolved
            steps = axis_text.series_view(run)  # the quantities count tokens per step (axis=batch: probe + ...)
            follows = resolved is not None and claims.fits(steps, relation, resolved)
            said = {True: "prediction held", False: "PREDICTION WRONG",
                    None: "as it must: this engine resolves by the same rules, so this is no test of them"}[held]
            which = "the suggested change" if option["kind"] == "suggestion" else "an alternative"
            transitions = ", ".join(Transition.from_dict(t).text for t in steps["transitions"]) or "none"
            text = (f"{option['knob']}={json.dumps(option['value'])} ({which}) was run: predicted "
                    f"{confounds.label(quantity)} {predicted}, the engine resolved {resolved} ({said}); its "
                    f"transitions {transitions} {'include' if follows else 'do not include'} "
                    f"{relation_text(relation)} = {resolved}, so the boundary "
                    f"{'follows' if follows else 'does not follow'} the {confounds.label(quantity)}")
            checks.append({"knob": option["knob"], "value": option["value"], "kind": option["kind"],
                           "quantity": quantity, "relation": relation, "predicted": predicted,
                           "resolved": resolved, "held": held, "follows": follows, "run_id": run["run_id"],
                           "text": text})
    return checks


def _confounds(anchor: dict | None, runs: list[dict]) -> dict[str, Any]:
    empty = {"at": anchor and anchor["name"], "run_id": anchor and anchor["run_id"], "transitions": [],
             "coinciding": [], "labels": [], "ambiguous": False, "suggestion": None, "checked": []}
    if anchor is not None and anchor.get("axis") == "repeat":
        return empty | {"text": "axis=repeat: concurrency is the number of identical requests per engine call; "
                                "no engine quantity is counted in it, so none is compared"}
    if anchor is None or not anchor["transitions"]:
        where = "the baseline" if anchor is None or anchor["knob"] is None else anchor["name"]
        return empty | {"text": f"no transition at {where}, so nothing coincides"}
    predict = predictor(anchor)
    transitions = axis_text.in_step_tokens(anchor)  # the engine's quantities count tokens per step
    found = confounds.confound_report(anchor["requested"], anchor["resolved"], transitions, predict)
    if anchor.get("axis") == "batch":  # its edges are in neighbour tokens; these are the step's, say so
        for record in (*found["transitions"], found):
            record["text"] = f"in tokens per step (probe + neighbours): {record['text']}"
    return empty | {"transitions": found["transitions"], "coinciding": found["coinciding"],
                    "labels": [confounds.label(c) for c in found["coinciding"]], "ambiguous": found["ambiguous"],
                    "suggestion": found["suggestion"], "checked": _check_suggestion(found["suggestion"], runs, predict),
                    "text": found["text"]}


def _series(run: dict, value: Any) -> dict:
    return {"value": value, "name": run["name"], "transitions": axis_text.in_step_tokens(run),
            "resolved": run["resolved"]}


def _tracks(knob_names: list[str], baseline: dict | None, runs: list[dict]) -> tuple[dict[str, dict], dict | None]:
    """Per knob, what its runs (and the baseline's) track; and a conflict when two knobs claim differently."""
    detail, pooled = {}, {}
    for knob in knob_names:
        series = [_series(baseline, baseline["requested"].get(knob))] if baseline and measured(baseline) else []
        series += [_series(r, r["value"]) for r in runs if r["knob"] == knob and measured(r)]
        detail[knob], pooled[knob] = claims.tracks(series), series
    claimed = {k: (d["quantity"], d["relation"]) for k, d in detail.items() if d["quantity"]}
    if len(set(claimed.values())) < 2:
        return detail, None
    for knob, claim in claimed.items():
        detail[knob]["conflicts_with"] = [other for other, c in claimed.items() if c != claim]
    runs_of = list({s["name"]: s for k in claimed for s in pooled[k]}.values())
    reconciled = claims.reconcile(runs_of, list(dict.fromkeys(claimed.values())))
    said = "; ".join(f"{k}'s runs say {relation_text(r)} = {confounds.label(q)}" for k, (q, r) in claimed.items())
    text = (f"conflict: {said}; no single quantity fits them all; "
            + (reconciled["text"] if reconciled else "neither the min nor the max of two of them fits every run"))
    return detail, {"knobs": list(claimed), "reconciled": reconciled, "text": text}


def _notes(runs: list[dict], baseline: dict | None, mismatches: dict) -> list[str]:
    notes = []
    graphs_varied = any(str(r.get("knob") or "").startswith("cudagraph.") for r in runs)  # else not about graphs
    cpu = any(r["resolved"].get("platform") == "cpu" and not r["resolved"].get("cudagraph_emulated") for r in runs)
    if graphs_varied and cpu:
        notes.append("the engine ran on CPU: CUDA-graph knobs (" + ", ".join(GRAPH_KNOBS) + ") have no "
                     "effect there (resolved cudagraph_mode NONE), so a graph-replay boundary cannot show")
    elif graphs_varied and any(r["resolved"] for r in runs) and all(r["resolved"].get("cudagraph_mode") == "NONE"
                                                  for r in runs if r["resolved"]):
        notes.append("no run used CUDA graphs (resolved cudagraph_mode NONE everywhere)")
    if baseline is None:
        notes.append("no baseline run among these runs: shifts are compared between variants only, "
                      "and confounds are read at the first run with a transition")
    notes += [f"{run['name']}: {run['note']}" for run in runs if run["note"]]
    notes += [f"{name}: the engine resolved differently from the resolution rules (with the defaults it "
              f"recorded): {'; '.join(wrong)}" for name, wrong in mismatches.items()]
    return notes


def _predictions(runs: list[dict], mismatches: dict) -> dict[str, Any]:
    checked = sum(bool(r["resolved"]) for r in runs)
    if not checked:
        text = "resolution rules: no run resolved a config, so nothing was checked"
    elif simulated(runs):
        text = ("resolution rules: not tested here: this engine's resolved config is the rules' own prediction "
                "(resolved.simulated), so every run resolves as predicted by construction; engine=vllm tests them")
    elif not mismatches:
        text = f"resolution rules: the engine resolved all {checked} run(s) exactly as predicted"
    else:
        text = f"resolution rules: {len(mismatches)} of {checked} run(s) resolved differently (see the notes)"
    return {"checked": checked, "simulated": simulated(runs), "mismatches": mismatches, "text": text}


def _against(run: dict, runs: list[dict], baseline: dict | None) -> dict | None:
    """What a run changed: the baseline, or for a follow-up the run whose edge it tests (one knob from it)."""
    if not run.get("followup"):
        return baseline
    return next((r for r in runs if r["name"] == (run.get("followup_of") or {}).get("run")), baseline)


def summarize(meta: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    baseline = next((r for r in runs if r["knob"] is None), None)
    anchor = baseline or next((r for r in runs if measured(r) and r["transitions"]), None)
    anchor = anchor or next((r for r in runs if r["resolved"]), None)
    for run in runs:
        against = _against(run, runs, baseline)
        if run["resolved"] and run["defaults"].get("capture_ceiling"):  # the candidate's value on that device
            run["resolved"] = run["resolved"] | {"device_capture_ceiling": run["defaults"]["capture_ceiling"]}
        run["changed"], run["side_effects"] = run["check"].get("diff", {}), run["check"].get("side_effects", [])
        run["split_samples"], run["budget"] = split_samples(run), budget_text(run)
        run["shape"] = shape_text(run) if measured(run) else None
        run["note"] = _note(run)
        run["nll_polluted"], run["nll_clean"] = mean_nll(run, polluted=True), mean_nll(run, polluted=False)
        run["nll_mean"] = mean_nll(run)
        run.setdefault("axis", "length")
        run["axis_edges"] = axis_text.edge_lines(run)
        run["versus_baseline"] = versus.versus_baseline(run, against) if against and measured(run) else None
        run["headline"] = oracle_views.headline(run, shape_text) if measured(run) else None  # every oracle's
        run["oracle_results"] = (oracle_views.per_oracle(run, against, shape_text, versus.versus_baseline)
                                 if measured(run) and len(oracle_views.asked(run)) > 1 else {})
    for run in runs:  # every run's transitions, each oracle's, in its own terms
        run["explained"] = explained.explain_run(run, _against(run, runs, baseline)) if measured(run) else []
    conclusions = tested.annotate(runs, measured, predictor, meta.get("followups"))  # what the runs settle
    configured = [r for r in runs if not r.get("followup")]  # a follow-up is one knob from its run, not a series
    knob_names = list(dict.fromkeys(r["knob"] for r in configured if r["knob"]))
    detail, conflict = _tracks(knob_names, baseline, configured)
    pooled = [_series(r, r["name"]) for r in configured if measured(r)]
    mismatches = {r["name"]: m for r in runs if r["resolved"] and (m := _check_prediction(r))}
    by_oracle = {}  # where the oracles disagree, each one's own claims and confounds
    for name in oracle_views.varying(runs):
        views = [oracle_views.view(r, name) if name in oracle_views.asked(r) else r for r in configured]
        seen = next((v for v, r in zip(views, configured) if r is anchor), None)
        tracked, _ = _tracks(knob_names, next((v for v in views if v["knob"] is None), None), views)
        by_oracle[name] = {"tracks": {k: d["quantity"] for k, d in tracked.items()}, "tracks_detail": tracked,
                           "confounds": _confounds(seen, views)}
    return {
        **meta,
        "engine": anchor["engine"] if anchor else None,
        "baseline_run_id": baseline["run_id"] if baseline else None,
        "baseline": {"requested": baseline["requested"], "resolved": baseline["resolved"]} if baseline else None,
        "runs": [{k: v for k, v in r.items() if k not in ("start_time",)} for r in runs],
        "tracks": {k: d["quantity"] for k, d in detail.items()},
        "tracks_detail": detail,
        "conclusions": conclusions,
        "conflict": conflict,
        "overall": claims.tracks(pooled),
        "confounds": _confounds(anchor, runs),
        "steps": steps.lines(runs),
        "predictions": _predictions(runs, mismatches),
        "notes": _notes(runs, baseline, mismatches),
        "oracles": by_oracle,
        "engine_warnings": warnings_text.split(runs),  # shared by every run / only in some
    }


def missing_from_tracking(outcomes: list[dict], runs: list[dict]) -> list[str]:
    """Jobs the sweep ran (or stopped before running) whose run the tracking store lacks or holds in part."""
    known = {r["run_id"] for r in runs}
    notes = []
    for outcome in outcomes:
        name = f"{outcome.get('knob')}={json.dumps(outcome.get('value'))}" if outcome.get("knob") else "baseline"
        if not outcome.get("run_id"):
            error = outcome.get("error", "no error text")
            notes.append(f"{outcome.get('name', name)}: " + (error if error.startswith("not run") else
                                                             f"failed before its run was recorded: {error}"))
        elif outcome["run_id"] not in known or outcome.get("tracking"):
            notes.append(f"{name}: its MLflow run is incomplete ({outcome.get('tracking', 'not found')}); "
                         "this comparison lacks it until it is uploaded")
    return notes
