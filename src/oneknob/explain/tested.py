"""Every resolved transition of every run, tested by the sweep's runs or said untested, and why.

Each entry of a run's `explained` list (explain.explained: one per transition, each oracle's where they disagree)
gets `tested`: {tracks, offset, relation, ruled_out, untestable, untested, evidence, text}, from the runs one knob
away (explain.hypotheses: the configured variants, the baseline, the follow-ups). A run whose edge is a comparable
run's own edge, at the same quantity, says what that run's tests concluded ("as in ..."). What no run tested says
why not: no single knob moves the quantity alone (untestable), the predicted edge would leave the measured lengths,
or the follow-up budget (explain.followups) was spent or off. `conclusions` lists one sentence per transition of
the configured runs for the report's Result. Pure functions over run dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oneknob.config.quantities import label, overridden
from oneknob.explain import explained
from oneknob.explain import followup_design as design_mod
from oneknob.explain.hypotheses import Hypothesis, as_dict, comparable, conclude, evidence, hypotheses
from oneknob.verdict.search import Transition, relation_text


def trial_predictor(run: dict, predict: Callable[[dict], dict] | None) -> Callable[[dict], dict | None]:
    """Knob values -> the candidate quantities a run with them would have (explained.candidates), by the run's
    own resolution rules (`predict`: analysis.predictor), with the engine's config fields set by their
    `engine_args.<field>` and the model's by `model.override.<path>`; None for a trial no engine would start,
    or one that turns CUDA graphs or speculation on or off (a mechanism, not a quantity)."""
    base = run.get("resolved") or {}

    def trial_quantities(knob_values: dict) -> dict | None:
        try:
            resolved = predict(knob_values) if predict is not None else dict(base)
        except ValueError:  # KnobError included
            return None
        if predict is not None and (resolved.get("cudagraph_mode") != base.get("cudagraph_mode")
                                    or bool(resolved.get("spec_k")) != bool(base.get("spec_k"))):
            return None
        config = dict(base.get("config_quantities") or {})
        for key, value in knob_values.items():
            if key.startswith("engine_args.") and isinstance(value, int) and not isinstance(value, bool):
                config |= {q: value for q in config if q.endswith("." + key.removeprefix("engine_args."))}
        resolved = resolved | {"config_quantities": config,
                               "model_quantities": overridden(base.get("model_quantities"), knob_values)}
        return explained.candidates({"resolved": resolved, "requested": knob_values})
    return trial_quantities


def _why_untested(followups: dict | None) -> str:
    if followups is None:
        return "no follow-up ran for this comparison"
    if followups.get("skipped"):
        return followups["skipped"]
    if not followups.get("budget"):
        return "follow-ups are off (explain.followups=0)"
    return f"the follow-up budget is spent (explain.followups={followups['budget']})"


def test(run: dict, oracle: str | None, record: dict, runs: list[dict], predict, followups: dict | None) -> dict:
    """The tested record of one resolved transition of `run` (see the module docstring)."""
    quantities = explained.candidates(run)
    candidates = hypotheses(record, quantities)
    others = [r for r in runs if comparable(run, r)]
    direction = record["direction"]
    words = {h.quantity: [evidence(h, oracle, direction, r, explained.candidates(r)) for r in others]
             for h in candidates}
    found = conclude(candidates, words, Transition.from_dict(record).relations())
    untestable, untested = [], []
    if not found["tracks"]:
        trial = trial_predictor(run, predict)
        limits, tried = design_mod.limits_of(run, quantities), [r.get("requested") or {} for r in runs]
        for h in candidates:
            if h.quantity in found["tested"]:
                continue
            made = design_mod.design(run, h, [o for o in candidates if o is not h], trial, limits, tried)
            if made == design_mod.NO_KNOB:
                untestable.append(h.quantity)
            elif isinstance(made, str):
                untested.append({"quantity": h.quantity, "why": made})
            else:
                untested.append({"quantity": h.quantity, "why": _why_untested(followups),
                                 "design": {"knob": made.knob, "value": made.value, "moved_to": made.moved_to,
                                            "predicted": list(made.predicted)}})
    return found | {"candidates": [h.quantity for h in candidates], "hypotheses": {h.quantity: h for h in candidates},
                    "untestable": untestable, "untested": untested}


def _inherit(entry: dict, run: dict, runs: list[dict]) -> None:
    """An edge a comparable run has too, where that run's tests concluded what it tracks and the quantity is
    the same in both: the same conclusion, "as in" that run."""
    mine = entry["tested"]
    if mine["tracks"]:
        return
    quantities = explained.candidates(run)
    for other in runs:
        if not comparable(run, other):
            continue
        for theirs in other.get("explained") or []:
            done = theirs.get("tested") or {}
            if (done.get("tracks") and not done.get("as_in") and theirs["oracle"] == entry["oracle"]
                    and theirs["transition"] == entry["transition"] and theirs["direction"] == entry["direction"]
                    and quantities.get(done["tracks"]) == explained.candidates(other).get(done["tracks"])):
                # what that run ruled out holds here too for a candidate of this edge with the same value
                kept = [q for q in done["ruled_out"] if q in mine["hypotheses"]
                        and quantities.get(q) == explained.candidates(other).get(q)]
                mine.update(tracks=done["tracks"], offset=done["offset"], relation=done["relation"],
                            as_in=other["name"],
                            ruled_out=list(dict.fromkeys(mine["ruled_out"] + kept)),
                            evidence=[r for r in dict.fromkeys([other["name"], *done["evidence"], *mine["evidence"]])
                                      if r != run["name"]],  # never itself: it is what is explained
                            why=done["why"] | mine["why"], untested=[], untestable=[])
                return


def the(quantity: str) -> str:
    """A quantity as a sentence names it: "the resolved max capture size", "model.attention_chunk_size"."""
    text = label(quantity)
    return text if text == quantity else f"the {text}"


def _offset_text(h: Hypothesis) -> str:
    sign = "+" if h.offset >= 0 else "-"
    position = (f"; its first divergent position {h.at_position} = {h.value}"
                + (f" {'+' if h.at_position > h.value else '-'} {abs(h.at_position - h.value)}"
                   if h.at_position != h.value else "")) if h.at_position is not None else ""
    return f"offset {h.offset} ({relation_text(h.relation)} {h.side} = {h.value} {sign} {abs(h.offset)}{position})"


def _ruled_text(tested: dict, said: dict[str, Hypothesis]) -> str:
    """The ruled-out candidates, grouped by the run and the way it ruled them out."""
    groups: dict[tuple, list[str]] = {}
    for q in tested["ruled_out"]:
        word = tested["why"][q]
        key = (word["run"], word["kind"], word["edge"]) if word["kind"] == "stayed" else (word["run"], word["kind"], q)
        groups.setdefault(key, []).append(q)
    parts = []
    for (run, kind, _), names in groups.items():
        word, h = tested["why"][names[0]], said[names[0]]
        if kind == "stayed":
            parts.append(f"{', '.join(label(q) for q in names)} (unmoved in {run}, whose edge is {word['edge']})")
        elif kind == "held":
            parts.append(f"{label(names[0])} ({run} moved it {h.value} -> {word['value']}; the edge stayed)")
        else:
            parts.append(f"{label(names[0])} ({run} moved it {h.value} -> {word['value']}, predicting "
                         f"{word['predicted']}; the edge went to {word['edge']}: moved, but not with it)")
    return "; ".join(parts)


def sentence(entry: dict) -> str:
    """One sentence: what this transition tracks and the runs that show it, or what it does not and what is left."""
    tested, said = entry["tested"], entry["tested"]["hypotheses"]
    head = (f"{entry['oracle']}: " if entry["oracle"] else "") + entry["transition"]
    ruled = _ruled_text(tested, said)
    if tested.get("power_of_two") == "ruled_out":
        ruled += ("; " if ruled else "") + "a power of two (the moved edge is not one)"
    left = [f"coincides with {the(u['quantity'])}" if said[u["quantity"]].coincides else
            f"near {said[u['quantity']].text()}" for u in tested["untested"]]
    whys = list(dict.fromkeys(u["why"] for u in tested["untested"]))
    rest = (f"; untested: {', '.join(left)} ({'; '.join(whys)})" if left else "") + (
        f"; untestable (no single knob moves it alone): {', '.join(label(q) for q in tested['untestable'])}"
        if tested["untestable"] else "")
    if tested["tracks"]:
        h, word = said.get(tested["tracks"]), tested["why"].get(tested["tracks"])
        offset = _offset_text(h) if h is not None else f"offset {tested['offset']}"
        how = (f"as in {tested['as_in']}, whose edge it is" if tested.get("as_in") else
               f"{word['run']} moved it {h.value} -> {word['value']} and the edge to {word['edge']}")
        return f"{head} tracks {the(tested['tracks'])} with {offset}: {how}" + (
            f"; ruled out: {ruled}" if ruled else "")
    if tested["together"]:
        return (f"{head} moved with {', '.join(label(q) for q in tested['together'])} together (no run moved one of "
                "them alone)" + (f"; ruled out: {ruled}" if ruled else "") + rest)
    if tested["ruled_out"] and not left:
        return f"{head} tracks none of those tried: ruled out {ruled}{rest}"
    if tested["ruled_out"]:
        return f"{head} does not track {ruled}{rest}"
    return f"{head}: no run tested it{rest}" if rest else f"{head}: no candidate quantity to test"


def annotate(runs: list[dict], measured: Callable[[dict], bool], predictor: Callable, followups: dict | None
             ) -> list[dict[str, Any]]:
    """Set `tested` on every resolved entry of every measured run's `explained` (axis=length; the other axes'
    edges are in other units) and return the conclusions of the configured runs (report.md's Result)."""
    measured_runs = [r for r in runs if measured(r) and r.get("axis", "length") == "length"]
    for run in measured_runs:
        for entry, (oracle, record) in zip(run.get("explained") or [], explained.edges(run)):
            if entry["resolved"]:
                entry["tested"] = test(run, oracle, record, measured_runs, predictor(run), followups)
    for run in measured_runs:
        for entry in run.get("explained") or []:
            if "tested" in entry:
                _inherit(entry, run, measured_runs)
    conclusions = []
    for run in measured_runs:
        for entry in run.get("explained") or []:
            if "tested" not in entry:
                continue
            tested = entry["tested"]
            tested["text"] = sentence(entry)
            hypotheses_of = tested.pop("hypotheses")
            tested["candidates"] = [as_dict(h) for h in hypotheses_of.values()]
            if not run.get("followup"):
                conclusions.append({"run": run["name"], "oracle": entry["oracle"], "transition": entry["transition"],
                                    "direction": entry["direction"], "relation": tested["relation"],
                                    "tracks": tested["tracks"], "label": label(tested["tracks"]) if tested["tracks"]
                                    else None, **{k: tested[k] for k in ("offset", "ruled_out", "untestable",
                                                                         "untested", "evidence")},
                                    "text": tested["text"]})
    return conclusions



def next_test(runs: list[dict], refused: list[dict]) -> dict | None:
    """The next follow-up to run, from summarised runs: the first candidate (in the order tried) of the first
    unexplained transition (the baseline's first, then the variants', in run order) that a single knob can move
    alone, except trials already refused (`refused`: their knob values). None when nothing is left to test."""
    ordered_runs = sorted((r for r in runs if not r.get("followup")), key=lambda r: r.get("knob") is not None)
    for run in ordered_runs:
        for entry in run.get("explained") or []:
            tested = entry.get("tested")
            if not tested or tested["tracks"]:
                continue
            for untested in tested["untested"]:
                made = untested.get("design")
                if made is None or (run.get("requested") or {}) | {made["knob"]: made["value"]} in refused:
                    continue
                h = next(c for c in tested["candidates"] if c["quantity"] == untested["quantity"])
                edge = Transition.from_dict({"lo": entry["transition"].split("|")[0],
                                             "hi": entry["transition"].split("|")[1], "direction": entry["direction"]})
                return {"run": run["name"], "run_knob": run.get("knob"), "requested": run.get("requested") or {},
                        "oracle": entry["oracle"], "transition": entry["transition"], "direction": entry["direction"],
                        "edge": [edge.lo, edge.hi], "quantity": h["quantity"], "label": label(h["quantity"]),
                        "relation": h["relation"], "offset": h["offset"], "value": h["value"], **made}
    return None
