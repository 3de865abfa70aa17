"""The explanation modules in process, with exact texts, lists and orders: what a transition coincides with
(explain/run_edges.py), the hypotheses "side = X + d" and what a run one knob away says of each
(explain/hypotheses.py), the design of the separating follow-up (explain/followup_design.py), the tested records,
their sentences and the next follow-up (explain/tested.py), and the decode oracles' comparison (verdict/decode.py).

Runs are hand-built dicts as compare.load_run returns them (no engine, no subprocess); where the whole reading of a
sweep is the point, analysis.summarize reads small hand-built sweeps as test_analysis.py builds them. These
are the tests `make mutate` runs against those modules (pyproject's [tool.mutmut]); the sweeps a user types are
tests/explain/test_followups.py.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
from helpers import DOWN, UP, down, up

from oneknob.explain import run_edges
from oneknob.explain import followup_design as design
from oneknob.explain import tested
from oneknob.explain.hypotheses import (Hypothesis, Word, as_dict, changed_knobs, comparable, conclude, evidence,
                                        hypotheses)
from oneknob.verdict import decode
from oneknob.verdict.judge import Point

RESOLVED = {"max_capture_size": 512, "capture_sizes": [512], "cudagraph_mode": "FULL_AND_PIECEWISE",
            "max_num_seqs": 128, "max_num_batched_tokens": 2048, "spec_k": 3, "runner": "v1", "platform": "cuda"}
CEILING = "vLLM's default capture ceiling"
STRIDE = "capture-grid stride edge (steps of 8 below it, 16 from it)"


def edge(lo: int, hi: int | None = None, direction: str = DOWN, **extra) -> dict:
    hi = lo + 1 if hi is None else hi
    return {"lo": lo, "hi": hi, "direction": direction, "resolved": hi == lo + 1, **extra}


def run(name: str, requested: dict, transitions: list[dict], lengths=(128, 1024), **resolved) -> dict:
    return {"name": name, "requested": requested, "resolved": RESOLVED | resolved, "transitions": transitions,
            "check": {}, "points": [{"length": L} for L in lengths], "status": "ok", "axis": "length",
            "knob": next(iter(requested), None) if name != "baseline" else None}


# -- verdict/decode.py: the teacher-forced comparison ----------------------------------------------------

VERDICT = SimpleNamespace(tol_decode_token=0.5, greedy_min_match=1.0, tol_decode=0.1)


def test_compare_reads_both_decode_oracles_of_one_continuation():
    found = decode.compare([1, 2], [-0.5, -1.0], [-0.25, -0.5], [1, 3], VERDICT)
    assert found == {"greedy_match": 0.5, "greedy_first_divergence": 1, "greedy_polluted": True,
                     "decode_nll": 0.75, "decode_nll_ref": 0.375, "decode_delta": 0.375, "decode_max_delta": 0.5,
                     "decode_first_deviation": -1, "decode_polluted": True}
    assert tuple(found) == decode.FIELDS  # the fields the records carry, in their order
    clean = decode.compare([7, 8, 9], [-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0], [7, 8, 9], VERDICT)
    assert clean == {"greedy_match": 1.0, "greedy_first_divergence": -1, "greedy_polluted": False,
                     "decode_nll": 2.0, "decode_nll_ref": 2.0, "decode_delta": 0.0, "decode_max_delta": 0.0,
                     "decode_first_deviation": -1, "decode_polluted": False}


def test_compare_finds_the_first_divergence_and_deviation_not_the_last():
    found = decode.compare([1, 9, 9, 4], [-1.0, -1.0, -3.0, -4.0], [-1.0, -1.0, -1.0, -1.0], [1, 2, 3, 4], VERDICT)
    assert (found["greedy_first_divergence"], found["decode_first_deviation"]) == (1, 2)
    assert (found["greedy_match"], found["decode_max_delta"], found["decode_delta"]) == (0.5, 3.0, 1.25)
    # tokens compared as integers (a float id from a JSON reader is the same token)
    assert decode.compare([1.0], [-1.0], [-1.0], [1], VERDICT)["greedy_match"] == 1.0


def test_compare_thresholds_flag_only_beyond_them():
    at = SimpleNamespace(tol_decode_token=0.5, greedy_min_match=0.5, tol_decode=0.25)
    found = decode.compare([1, 2], [-1.25, -1.25], [-1.0, -1.0], [1, 3], at)  # share 0.5, every delta 0.25
    assert (found["greedy_polluted"], found["decode_polluted"], found["decode_first_deviation"]) == (False, False, -1)
    token = decode.compare([1, 2], [-1.5, -1.0], [-1.0, -1.0], [1, 2], SimpleNamespace(
        tol_decode_token=0.5, greedy_min_match=1.0, tol_decode=1.0))  # one delta exactly at the token tolerance
    assert (token["decode_max_delta"], token["decode_polluted"], token["decode_first_deviation"]) == (0.5, False, -1)
    beyond = decode.compare([1, 2], [-1.5, -1.0], [-1.0, -1.0], [1, 2], SimpleNamespace(
        tol_decode_token=0.49, greedy_min_match=1.0, tol_decode=1.0))  # the max alone flags it
    assert (beyond["decode_polluted"], beyond["decode_first_deviation"]) == (True, 0)
    mean = decode.compare([1, 2], [-1.3, -1.3], [-1.0, -1.0], [1, 2], SimpleNamespace(
        tol_decode_token=0.5, greedy_min_match=1.0, tol_decode=0.25))  # the mean alone flags it
    assert mean["decode_polluted"] is True and mean["decode_first_deviation"] == -1
    below = decode.compare([1, 2], [-1.0, -1.0], [-1.0, -1.0], [1, 3], SimpleNamespace(
        tol_decode_token=0.5, greedy_min_match=0.6, tol_decode=0.1))
    assert below["greedy_polluted"] is True


@pytest.mark.parametrize("tokens, engine, reference, argmax, said", [
    ([1, 2], [-1.0], [-1.0, -1.0], [1, 2], "a continuation of 2 tokens came with 1 engine logprobs and 2 reference "
                                           "logprobs / 2 reference choices"),
    ([1, 2], [-1.0, -1.0], [-1.0], [1, 2], "a continuation of 2 tokens came with 2 engine logprobs and 1 reference "
                                           "logprobs / 2 reference choices"),
    ([1, 2], [-1.0, -1.0], [-1.0, -1.0], [1], "a continuation of 2 tokens came with 2 engine logprobs and 2 "
                                              "reference logprobs / 1 reference choices"),
    ([], [], [], [], "a continuation of 0 tokens came with 0 engine logprobs and 0 reference logprobs / 0 "
                     "reference choices"),
])
def test_compare_refuses_lists_of_different_lengths_saying_each(tokens, engine, reference, argmax, said):
    with pytest.raises(ValueError) as raised:
        decode.compare(tokens, engine, reference, argmax, VERDICT)
    assert str(raised.value) == said


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -math.inf])
def test_compare_refuses_a_non_finite_engine_logprob_anywhere(bad):
    with pytest.raises(ValueError) as raised:
        decode.compare([1, 2], [-1.0, bad], [-1.0, -1.0], [1, 2], VERDICT)
    assert str(raised.value) == "engine returned a non-finite logprob for a generated token"


def test_judge_sets_the_values_and_the_verdict_of_the_oracles_asked_for():
    point = Point(length=300, sample=0, nll=3.0, scored=299, seconds=0.1, polluted=True, nll_polluted=False)
    score = {"logprobs": [-1.0, -1.0], "argmax": [1, 2]}
    drift = decode.judge(point, [1, 2], [-1.3, -1.3], score, ("nll", "greedy"), VERDICT)  # decode sees it only
    assert (drift.greedy_polluted, drift.decode_polluted, drift.polluted) == (False, True, False)
    assert (drift.length, drift.nll, drift.decode_delta) == (300, 3.0, pytest.approx(0.3))
    assert decode.judge(point, [1, 2], [-1.3, -1.3], score, ("greedy", "decode"), VERDICT).polluted is True
    nll = Point(length=300, sample=0, nll=3.0, scored=299, seconds=0.1, nll_polluted=True)
    assert decode.judge(nll, [1, 2], [-1.0, -1.0], score, ("nll", "greedy"), VERDICT).polluted is True
    assert decode.judge(nll, [1, 2], [-1.0, -1.0], score, ("greedy",), VERDICT).polluted is False


def test_flagged_reads_one_oracles_verdict_and_position_the_absolute_token():
    point = Point(length=1, sample=0, nll=1.0, scored=1, seconds=0.0, greedy_polluted=True, decode_polluted=None)
    assert decode.flagged(point, "greedy") is True
    assert decode.flagged(point, "decode") is False  # not judged
    assert decode.flagged(point, "nope") is False  # no such oracle
    assert decode.flagged(point, "topk") is False
    assert [decode.position(285, o) for o in (15, 0, -1, None)] == [300, 285, None, None]


# -- explain/run_edges.py: what each transition coincides with -----------------------------------------

def test_candidates_are_the_resolved_configs_the_engines_config_fields_and_the_knobs_values():
    mine = run("b", {"spec.k": 3, "x": 7, "flag": True, "same": 512, "one": 1, "name": "v1"}, [],
               config_quantities={"cache_config.block_size": 16, "max_capture_size": 99,
                                  "scheduler_config.max_num_seqs": 128},
               model_quantities={"model.window": 300})
    assert run_edges.candidates(mine) == {
        "max_capture_size": 512, "seqs_x_query_len": 512, "twice_seqs_x_query_len": 1024,
        "max_num_batched_tokens": 2048, "batched_tokens_per_query_len": 512, "default_capture_ceiling": 512,
        "grid_stride_edge": 256, "model.window": 300, "cache_config.block_size": 16,
        "scheduler_config.max_num_seqs": 128, "knob spec.k": 3, "knob x": 7}
    assert run_edges.candidates({"requested": {"a": 5}}) == {"knob a": 5}
    assert run_edges.candidates({"resolved": {}, "requested": None}) == {}


def test_coincidences_are_the_exact_then_one_then_two_off_in_preference_order():
    quantities = {"model.b": 511, "model.a": 510, "max_capture_size": 512, "seqs_x_query_len": 512,
                  "model.c": 513, "model.d": 514, "model.e": 509}
    found = run_edges.coincidences(512, quantities)
    assert [(m["quantity"], m["offset"]) for m in found] == [
        ("max_capture_size", 0), ("seqs_x_query_len", 0), ("model.b", 1), ("model.c", -1), ("model.a", 2),
        ("model.d", -2)]
    assert found[2] == {"quantity": "model.b", "value": 511, "offset": 1}
    assert run_edges.coincidences(100, quantities) == []


def test_a_transition_says_its_exact_coincidences_and_drops_the_offsets_beside_them():
    quantities = {"max_capture_size": 512, "seqs_x_query_len": 512, "model.w": 514}
    found = run_edges.transition(edge(512), quantities, None)
    assert found == {"oracle": None, "transition": "512|513", "direction": DOWN, "resolved": True,
                     "sides": [{"relation": "last_polluted", "at": 512, "matches": [
                         {"quantity": "max_capture_size", "value": 512, "offset": 0},
                         {"quantity": "seqs_x_query_len", "value": 512, "offset": 0}]}],
                     "text": "polluted->clean at 512|513: last polluted 512 = resolved max capture size, "
                             "max_num_seqs x (K+1)"}


def test_a_transition_off_by_one_or_two_says_the_offset_of_each_side():
    found = run_edges.transition(edge(301), {"model.w": 300, "model.v": 303}, "nll")
    assert found["text"] == ("nll: polluted->clean at 301|302: last polluted 301 = model.w (300) + 1, "
                             "model.v (303) - 2; first clean 302 = model.v (303) - 1, model.w (300) + 2")
    assert [s["relation"] for s in found["sides"]] == ["last_polluted", "first_clean"]
    up_edge = run_edges.transition(edge(299, direction=UP), {"model.w": 300}, None)
    assert up_edge["text"] == "clean->polluted at 299|300: first polluted 300 = model.w"  # exact: the offset dropped
    assert up_edge["sides"] == [{"relation": "first_polluted", "at": 300,
                                 "matches": [{"quantity": "model.w", "value": 300, "offset": 0}]}]


def test_a_transition_with_nothing_near_or_unresolved_says_so():
    assert run_edges.transition(edge(700), {"model.w": 300}, None)["text"] == (
        "polluted->clean at 700|701: no candidate quantity is within 2 of 700, 701")
    unresolved = run_edges.transition(edge(100, 200), {"model.w": 100}, "greedy")
    assert unresolved == {"oracle": "greedy", "transition": "100..200", "direction": DOWN, "resolved": False,
                          "sides": [], "text": "greedy: polluted->clean at 100..200 is unresolved (the flip lies "
                                               "in 101..200)"}


def test_a_decode_transition_reads_its_first_divergent_position_too():
    found = run_edges.transition(edge(383, direction=UP, first_position=300), {"model.w": 300}, "greedy")
    assert found["text"] == "greedy: clean->polluted at 383|384: first divergent position 300 = model.w"
    assert found["sides"] == [{"relation": "first_divergent_position", "at": 300,
                               "matches": [{"quantity": "model.w", "value": 300, "offset": 0}]}]
    far = run_edges.transition(edge(383, direction=UP, first_position=900), {"model.w": 300}, "greedy")
    assert far["text"] == ("greedy: clean->polluted at 383|384: no candidate quantity is within 2 of 383, 384 "
                           "or position 900")
    at_zero = run_edges.transition(edge(5, direction=UP, first_position=0), {"model.w": 300}, None)
    assert at_zero["text"].endswith("or position 0")
    inside = run_edges.transition(edge(100, 200, first_position=301), {"model.w": 300}, None)
    assert inside["sides"][0]["relation"] == "first_divergent_position" and "unresolved" in inside["text"]


def oracles(run_: dict, **by_name) -> dict:
    """The run with these oracles' {transitions, verdicts}."""
    return run_ | {"oracles": {name: {"transitions": t, "verdicts": v} for name, (t, v) in by_name.items()}}


def test_edges_are_each_oracles_where_they_disagree_else_the_decode_records_with_their_positions():
    base = run("r", {}, [edge(512)])
    disagree = oracles(base, nll=([edge(512)], {512: "polluted"}),
                       greedy=([edge(300, direction=UP, first_position=310)], {512: "clean"}))
    assert run_edges.edges(disagree) == [("nll", edge(512)), ("greedy", edge(300, direction=UP, first_position=310))]
    agree = oracles(base, nll=([edge(512)], {512: "polluted"}),
                    decode=([edge(512, first_position=520)], {512: "polluted"}))
    assert run_edges.edges(agree) == [(None, edge(512, first_position=520))]
    greedy_first = oracles(base, greedy=([edge(512, first_position=521)], {512: "polluted"}),
                           decode=([edge(512, first_position=520)], {512: "polluted"}))
    assert run_edges.edges(greedy_first) == [(None, edge(512, first_position=521))]
    none_decoded = oracles(base, nll=([edge(512)], {512: "polluted"}), greedy=([], {512: "polluted"}))
    assert run_edges.edges(none_decoded) == [(None, edge(512))]
    assert run_edges.edges(oracles(base, nll=([edge(9)], {}))) == [(None, edge(512))]
    assert run_edges.edges(base) == [(None, edge(512))]


def test_a_variants_new_edge_says_which_coinciding_quantities_moved_with_the_knob():
    baseline = run("baseline", {}, [edge(512)])
    k1 = run("spec.k=1", {"spec.k": 1}, [edge(256), edge(600, direction=UP)], spec_k=1,
             model_quantities={"model.w": 256})
    (new, plain) = run_edges.explain_run(k1, baseline)
    assert new["versus_baseline"] == (f"moved with the knob: max_num_seqs x (K+1) 512 -> 256; unmoved: {STRIDE} "
                                      "(256)")  # model.w: not the baseline's, neither moved nor kept
    assert new["text"] == (f"polluted->clean at 256|257: last polluted 256 = max_num_seqs x (K+1), {STRIDE}, "
                           f"model.w (an edge the baseline lacks; {new['versus_baseline']})")
    assert plain["versus_baseline"] == "" and plain["text"] == (
        "clean->polluted at 600|601: no candidate quantity is within 2 of 600, 601")
    kept = run("kept", {"x": 1}, [edge(513)], max_capture_size=513)
    (only_moved,) = run_edges.explain_run(kept, baseline)
    assert only_moved["versus_baseline"] == "moved with the knob: resolved max capture size 512 -> 513"
    stayed = run("stayed", {"x": 1}, [edge(256)])
    assert run_edges.explain_run(stayed, baseline)[0]["versus_baseline"] == f"unmoved: {STRIDE} (256)"
    (same,) = run_edges.explain_run(run("same", {"x": 1}, [edge(512)]), baseline)
    assert "versus_baseline" not in same
    assert "versus_baseline" not in run_edges.explain_run(baseline, baseline)[0]
    assert "versus_baseline" not in run_edges.explain_run(k1, None)[0]


def test_a_new_edge_is_per_oracle_against_the_baselines_same_oracle():
    baseline = oracles(run("baseline", {}, [edge(512)]), nll=([edge(512)], {512: "polluted"}),
                       greedy=([edge(300, direction=UP)], {512: "clean"}))
    variant = oracles(run("v", {"x": 1}, [edge(512)]), nll=([edge(300, direction=UP)], {512: "polluted"}),
                      greedy=([edge(512)], {512: "clean"}))
    assert ["versus_baseline" in e for e in run_edges.explain_run(variant, baseline)] == [True, True]
    assert ["versus_baseline" in e for e in run_edges.explain_run(baseline | {"name": "b2"}, baseline)] == [
        False, False]


def explained_sweep(*runs_: dict) -> list[dict]:
    baseline = runs_[0]
    for r in runs_:
        r["explained"] = run_edges.explain_run(r, baseline)
    return list(runs_)


def test_new_edges_name_each_run_with_an_edge_the_baseline_lacks():
    runs = explained_sweep(run("baseline", {}, [edge(512)]),
                           run("spec.k=1", {"spec.k": 1}, [edge(256), edge(700)], spec_k=1),
                           run("same", {"x": 1}, [edge(512)]), run("none", {"x": 2}, []))
    assert run_edges.new_edges(runs) == [
        f"spec.k=1: polluted->clean at 256|257: last polluted 256 = max_num_seqs x (K+1), {STRIDE} (an edge the "
        f"baseline lacks; moved with the knob: max_num_seqs x (K+1) 512 -> 256; unmoved: {STRIDE} (256)); "
        "polluted->clean at 700|701: no candidate quantity is within 2 of 700, 701"]
    assert run_edges.new_edges([{"name": "unmeasured"}]) == []


def test_same_edges_say_only_what_differs_in_what_they_coincide_with():
    baseline = run("baseline", {}, [edge(512), edge(900, direction=UP)])
    seqs = run("sched.max_num_seqs=64", {"sched.max_num_seqs": 64}, [edge(512), edge(900, direction=UP)],
               max_num_seqs=64, model_quantities={"model.w": 512, "model.a": 512})
    unchanged = run("unchanged", {"x": 1}, [edge(512), edge(900, direction=UP)])
    new = run("new", {"x": 2}, [edge(256)])
    runs = explained_sweep(baseline, seqs, unchanged, new, run("cleared", {"x": 3}, []))
    assert run_edges.same_edges(runs, baseline) == [
        "sched.max_num_seqs=64: 512|513 as at the baseline; also = 2 x max_num_seqs x (K+1), model.a, model.w; "
        "no longer = max_num_seqs x (K+1)"]
    assert run_edges.same_edges(runs, None) == []
    fewer = run("k=1", {"spec.k": 1}, [edge(512), edge(900, direction=UP)], spec_k=1)
    fewer["explained"] = run_edges.explain_run(fewer, baseline)
    assert run_edges.same_edges([baseline, fewer], baseline) == [
        "k=1: 512|513 as at the baseline; also = 2 x max_num_seqs x (K+1); no longer = max_num_seqs x (K+1), "
        "max_num_batched_tokens / (K+1)"]
    bare = copy.deepcopy(baseline) | {"name": "bare", "explained": [
        dict(e, oracle="greedy") for e in run_edges.explain_run(fewer, baseline)]}
    assert run_edges.same_edges([baseline, bare], baseline) == []  # another oracle's edge: nothing to compare


# -- explain/hypotheses.py: "side = X + d", and what a run one knob away says of it ---------------------

def test_a_hypothesis_says_its_side_its_quantity_and_the_offset():
    assert Hypothesis("max_capture_size", 512, "last_polluted", 512, 0).text() == (
        "last polluted 512 = resolved max capture size")
    assert Hypothesis("model.w", 400, "last_polluted", 424, 24).text() == "last polluted 424 = model.w (400) + 24"
    assert Hypothesis("model.w", 450, "first_clean", 425, -25).text() == "first clean 425 = model.w (450) - 25"
    assert [Hypothesis("q", 10, "first_clean", 10 + d, d).coincides for d in (-3, -2, 2, 3)] == [
        False, True, True, False]
    position = [Hypothesis("q", 400, "first_polluted", 300, -100, at_position=400 + d).coincides
                for d in (-3, -2, 2, 3)]
    assert position == [False, True, True, False]
    assert as_dict(Hypothesis("model.w", 400, "last_polluted", 424, 24)) == {
        "quantity": "model.w", "value": 400, "relation": "last_polluted", "side": 424, "offset": 24,
        "at_position": None, "label": "model.w", "coincides": False, "text": "last polluted 424 = model.w (400) + 24"}


def test_coinciding_candidates_come_nearest_first_then_in_preference_order():
    found = hypotheses(edge(511), {"model.x": 509, "model.y": 513, "model.z": 510, "max_capture_size": 512,
                                   "model.far": 600})
    assert [(h.quantity, h.relation, h.side, h.offset) for h in found] == [
        ("max_capture_size", "first_clean", 512, 0), ("model.y", "first_clean", 512, -1),
        ("model.z", "last_polluted", 511, 1), ("model.x", "last_polluted", 511, 2)]


def test_where_nothing_coincides_two_distinct_values_below_and_above_each_side_nearest_relative_first():
    quantities = {"model.a": 400, "model.b": 100, "model.c": 450, "model.d": 1000, "model.e": 600, "model.f": 600,
                  "power_of_two": 512, "model.g": True, "model.h": 0, "model.i": "x", "model.j": 2.5, "model.k": 1}
    found = hypotheses(edge(424), quantities)
    assert [(h.quantity, h.relation, h.offset) for h in found] == [
        ("model.c", "first_clean", -25), ("model.a", "last_polluted", 24), ("model.e", "first_clean", -175),
        ("model.f", "first_clean", -175), ("model.b", "last_polluted", 324)]
    assert not any(h.coincides for h in found)
    assert hypotheses(edge(424, 430), quantities) == []  # unresolved: no side to read
    sides = hypotheses(edge(500), {"model.a": 490, "model.b": 480, "model.c": 470, "model.d": 600, "model.e": 700,
                                   "model.f": 800})
    assert [h.quantity for h in sides] == ["model.a", "model.b", "model.d", "model.e"]


def test_a_decode_candidate_near_the_first_divergent_position_coincides_and_comes_first():
    found = hypotheses(edge(384, direction=UP, first_position=400),
                       {"max_capture_size": 401, "model.a": 400, "model.b": 386, "model.c": 385, "model.far": 700})
    # nearest first, by the side or by the position: the exact position before one a token off it
    assert [(h.quantity, h.at_position, h.offset, h.coincides) for h in found] == [
        ("model.a", 400, -15, True), ("model.c", None, 0, True), ("max_capture_size", 400, -16, True),
        ("model.b", None, -1, True)]
    both = hypotheses(edge(384, direction=UP, first_position=386), {"model.a": 384, "model.b": 386})
    assert [(h.quantity, h.offset, h.at_position) for h in both] == [  # each exact, a by its side, b by position
        ("model.a", 0, 386), ("model.b", -1, 386)]
    assert found[0].relation == "first_polluted" and found[0].side == 385


def test_changed_knobs_are_the_knobs_asked_for_differently_except_pins():
    a = {"requested": {"spec.k": 3, "cudagraph.capture": None, "x": 1}, "check": {}}
    b = {"requested": {"spec.k": 1, "cudagraph.capture": 512, "y": 2},
         "check": {"pinned": {"cudagraph.capture": 512}}}
    assert changed_knobs(a, b) == ["spec.k", "x", "y"]
    assert changed_knobs(b, a) == ["spec.k", "x", "y"]  # a pin on either side
    assert changed_knobs({"requested": None}, {"requested": {"x": 1}, "check": None}) == ["x"]
    assert changed_knobs({}, {}) == []
    one = {"requested": {"spec.k": 1}}
    assert comparable({"requested": {"spec.k": 3}}, one) and not comparable(one, one)
    assert not comparable({"requested": {"spec.k": 3, "x": 1}}, one) and not comparable(dict(one), one)


CAPTURE = Hypothesis("max_capture_size", 512, "last_polluted", 512, 0)
SEQS = Hypothesis("seqs_x_query_len", 512, "last_polluted", 512, 0)
CHUNK = Hypothesis("model.chunk", 400, "last_polluted", 424, 24)


def test_a_run_whose_edge_followed_the_quantity_moved_it_and_one_whose_neither_moved_is_unmoved():
    moved = run("capture=256", {"cudagraph.capture": 256}, [edge(100), edge(256)])
    assert evidence(CAPTURE, None, DOWN, moved, {"max_capture_size": 256}) == Word(
        "capture=256", "moved", 256, "256|257", predicted=256)
    assert evidence(CHUNK, None, DOWN, run("c", {}, [edge(324)]), {"model.chunk": 300}) == Word(
        "c", "moved", 300, "324|325", predicted=324)
    assert evidence(CAPTURE, None, DOWN, run("same", {}, [edge(512)]), {"max_capture_size": 512}) == Word(
        "same", "unmoved", 512, "512|513", predicted=512)
    first = Hypothesis("model.w", 514, "first_clean", 513, -1)
    assert evidence(first, None, DOWN, run("w", {}, [edge(299)]), {"model.w": 301}).status == "moved"


def test_a_run_rules_a_quantity_out_by_the_way_the_edge_disobeyed_it():
    stayed = evidence(SEQS, None, DOWN, run("capture=256", {}, [edge(256)]), {"seqs_x_query_len": 512})
    assert stayed == Word("capture=256", "ruled_out", 512, "256|257", "stayed", 512)
    held = evidence(SEQS, None, DOWN, run("seqs=64", {}, [edge(100), edge(512)]), {"seqs_x_query_len": 256})
    assert held == Word("seqs=64", "ruled_out", 256, "512|513", "held", 256)
    other = evidence(CAPTURE, None, DOWN, run("x", {}, [edge(300), edge(700)]), {"max_capture_size": 256})
    assert other == Word("x", "ruled_out", 256, "300|301, 700|701", "other", 256)


def test_a_run_says_nothing_where_it_has_no_edge_of_that_direction_or_one_that_may_hide_the_prediction():
    assert evidence(CAPTURE, None, DOWN, run("q", {}, [edge(256)]), {}) == Word("q", "unknown", None, None)
    assert evidence(CAPTURE, None, DOWN, run("eager", {}, []), {"max_capture_size": 256}) == Word(
        "eager", "unknown", 256, None, predicted=256)
    assert evidence(CAPTURE, None, UP, run("d", {}, [edge(256)]), {"max_capture_size": 256}).status == "unknown"
    unresolved = [edge(300), edge(200, 256)]  # the prediction 256 may lie in 201..256
    assert evidence(CAPTURE, None, DOWN, run("u", {}, unresolved), {"max_capture_size": 256}) == Word(
        "u", "unknown", 256, None, predicted=256)
    below = [edge(300), edge(256, 300)]  # 257..300 cannot hold 256: the resolved edge elsewhere rules it out
    assert evidence(CAPTURE, None, DOWN, run("u", {}, below), {"max_capture_size": 256}).status == "ruled_out"
    above = [edge(300), edge(200, 255)]
    assert evidence(CAPTURE, None, DOWN, run("u", {}, above), {"max_capture_size": 256}).status == "ruled_out"


def test_an_oracles_evidence_is_that_oracles_edges_else_the_combined_ones():
    other = oracles(run("o", {}, [edge(512)]), nll=([edge(512)], {}), greedy=([edge(256)], {}))
    assert evidence(CAPTURE, "greedy", DOWN, other, {"max_capture_size": 256}).status == "moved"
    assert evidence(CAPTURE, "nll", DOWN, other, {"max_capture_size": 256}).kind == "held"
    assert evidence(CAPTURE, None, DOWN, other, {"max_capture_size": 256}).kind == "held"
    assert evidence(CAPTURE, "decode", DOWN, other, {"max_capture_size": 256}).kind == "held"  # not asked: combined
    cleared = oracles(run("o", {}, [edge(256)]), greedy=([], {}))
    assert evidence(CAPTURE, "greedy", DOWN, cleared, {"max_capture_size": 256}).status == "unknown"


def words_of(h: Hypothesis, *runs_: tuple[dict, dict]) -> list[Word]:
    return [evidence(h, None, DOWN, r, q) for r, q in runs_]


def test_the_conclusion_tracks_the_quantity_that_moved_alone_with_the_edge():
    capture = run("capture=256", {}, [edge(256)])
    seqs = run("seqs=64", {}, [edge(512)])
    words = {"max_capture_size": words_of(CAPTURE, (capture, {"max_capture_size": 256}),
                                          (seqs, {"max_capture_size": 512})),
             "seqs_x_query_len": words_of(SEQS, (seqs, {"seqs_x_query_len": 256}),
                                          (capture, {"seqs_x_query_len": 512}))}
    found = conclude([CAPTURE, SEQS], words, {"last_polluted": 512, "first_clean": 513})
    assert found == {"tracks": "max_capture_size", "offset": 0, "relation": "last_polluted",
                     "ruled_out": ["seqs_x_query_len"], "evidence": ["capture=256", "seqs=64"], "together": [],
                     "tested": ["max_capture_size", "seqs_x_query_len"],
                     "why": {"seqs_x_query_len": asdict(Word("seqs=64", "ruled_out", 256, "512|513", "held", 256)),
                             "max_capture_size": asdict(Word("capture=256", "moved", 256, "256|257",
                                                             predicted=256))},
                     "power_of_two": "coincides"}


def test_a_quantity_ruled_out_twice_is_said_by_the_run_that_moved_it():
    capture = run("capture=256", {}, [edge(256)])
    seqs = run("seqs=64", {}, [edge(512)])
    words = {"seqs_x_query_len": words_of(SEQS, (capture, {"seqs_x_query_len": 512}),
                                          (seqs, {"seqs_x_query_len": 256}))}
    found = conclude([SEQS], words, {"last_polluted": 511, "first_clean": 513})
    assert (found["tracks"], found["ruled_out"], found["evidence"]) == (None, ["seqs_x_query_len"],
                                                                        ["seqs=64", "capture=256"])
    assert found["why"]["seqs_x_query_len"]["kind"] == "held" and found["power_of_two"] is None
    elsewhere = run("x", {}, [edge(300)])
    words = {"seqs_x_query_len": words_of(SEQS, (capture, {"seqs_x_query_len": 512}),
                                          (elsewhere, {"seqs_x_query_len": 256}))}
    assert conclude([SEQS], words, {"last_polluted": 511})["evidence"] == ["x", "capture=256"]  # other, then stayed


def test_quantities_that_moved_together_are_said_together_and_a_later_lone_mover_still_tracks():
    both = run("k=1", {}, [edge(256)])
    words = {"max_capture_size": words_of(CAPTURE, (both, {"max_capture_size": 256})),
             "seqs_x_query_len": words_of(SEQS, (both, {"seqs_x_query_len": 256}))}
    found = conclude([CAPTURE, SEQS], words, {"last_polluted": 512})
    assert (found["tracks"], found["offset"], found["relation"], found["together"], found["evidence"]) == (
        None, None, None, ["max_capture_size", "seqs_x_query_len"], [])
    assert found["tested"] == ["max_capture_size", "seqs_x_query_len"] and found["why"] == {}
    assert found["power_of_two"] == "coincides"
    alone = run("seqs=96", {}, [edge(384)])
    words["seqs_x_query_len"] += words_of(SEQS, (alone, {"seqs_x_query_len": 384}))
    words["max_capture_size"] += words_of(CAPTURE, (alone, {"max_capture_size": 512}))
    found = conclude([CAPTURE, SEQS], words, {"last_polluted": 512})
    assert (found["tracks"], found["together"], found["ruled_out"], found["evidence"]) == (
        "seqs_x_query_len", [], ["max_capture_size"], ["k=1", "seqs=96"])  # k=1: the capture size is out
    assert found["power_of_two"] == "ruled_out"  # 512 moved to 384, no power of two


def test_untested_candidates_are_neither_tracked_nor_ruled_out():
    words = {"max_capture_size": [Word("e", "unknown", 256, None)],
             "seqs_x_query_len": [Word("s", "unmoved", 512, "512|513", predicted=512)]}
    found = conclude([CAPTURE, SEQS], words, {"last_polluted": 512})
    assert (found["tracks"], found["ruled_out"], found["tested"], found["evidence"], found["together"]) == (
        None, [], [], [], [])
    assert conclude([CAPTURE], {}, {"first_clean": 300})["power_of_two"] is None
    tracked = conclude([CAPTURE], {"max_capture_size": [Word("m", "moved", None, "1|2")]}, {"last_polluted": 512})
    assert tracked["tracks"] == "max_capture_size" and tracked["power_of_two"] == "coincides"


# -- explain/followup_design.py: the run that moves one candidate alone ---------------------------------

def test_the_knobs_tried_for_a_quantity_are_its_own_first_then_the_named_ones():
    named = ["cudagraph.capture", "sched.max_num_seqs", "spec.k", "engine_args.max_num_batched_tokens"]
    assert design.movers("model.rope_scaling.factor", {}) == ["model.override.rope_scaling.factor", *named]
    assert design.movers("knob sched.max_num_seqs", {}) == named[1:2] + named[:1] + named[2:]
    assert design.movers("knob env.VLLM_X", {}) == ["env.VLLM_X", *named]
    assert design.movers("scheduler_config.max_num_seqs", {}) == named[1:2] + named[:1] + named[2:]
    assert design.movers("cache_config.block_size", {}) == ["engine_args.block_size", *named]
    assert design.movers("max_capture_size", {}) == named
    assert design.movers("knob not a knob", {}) == named  # a knob name that is none is not tried
    assert design.movers("model.bad-name", {}) == named


def test_the_current_value_of_a_knob_is_the_requested_else_what_it_resolved_to():
    mine = run("r", {"sched.max_num_seqs": 64, "spec.k": 0}, [], max_capture_size=400)
    quantities = {"model.w": 300, "cache_config.block_size": 16, "cache_config.xnum_blocks": 9,
                  "knob engine_args.num_blocks": 7, "scheduler_config.num_blocks": 11}
    current = {k: design._current(k, mine, quantities) for k in (
        "sched.max_num_seqs", "spec.k", "cudagraph.capture", "engine_args.max_num_batched_tokens",
        "model.override.w", "model.override.v", "engine_args.block_size", "engine_args.num_blocks",
        "engine_args.other", "env.VLLM_X")}
    assert current == {"sched.max_num_seqs": 64, "spec.k": 0, "cudagraph.capture": 400,
                       "engine_args.max_num_batched_tokens": 2048, "model.override.w": 300, "model.override.v": None,
                       "engine_args.block_size": 16, "engine_args.num_blocks": 11, "engine_args.other": None,
                       "env.VLLM_X": None}
    assert design._current("cudagraph.capture", {"requested": None, "resolved": None}, {}) is None


def test_trial_values_are_three_quarters_half_five_quarters_and_twice_and_k_from_one_to_four():
    assert design.trial_values("sched.max_num_seqs", 128) == [96, 64, 160, 256]
    assert design.trial_values("x", 4) == [3, 2, 5, 8]
    assert design.trial_values("x", 3) == [2, 6]  # 1 turns nothing off but moves nothing either; dupes dropped
    assert design.trial_values("x", 2) == [4]
    assert [design.trial_values("x", bad) for bad in (1, 0, -4, True, "8", None, 8.0)] == [[]] * 7
    assert design.trial_values("spec.k", 3) == [1, 2, 4]
    assert design.trial_values("spec.k", None) == [1, 2, 3, 4]
    assert design.trial_values("spec.k", 4) == [1, 2, 3]
    # the capture knob on vLLM's capture grid: multiples of 8 below 256, of 16 from it
    assert design.trial_values("cudagraph.capture", 512) == [384, 256, 640, 1024]
    assert design.trial_values("cudagraph.capture", 300) == [224, 144, 368, 592]
    assert design.trial_values("cudagraph.capture", 100) == [72, 48, 120, 200]
    assert design.trial_values("cudagraph.capture", 3) == [2, 4]  # 3 * 5 // 4 = 3 is itself; 6 floored onto 4
    assert design.trial_values("cudagraph.capture", 6) == [4, 2, 8]  # 3, 7, 12 floored onto the grid


W = Hypothesis("model.w", 400, "last_polluted", 424, 24)


def w_trial(moves=lambda v: v, also=None):
    """A follow-up's predicted quantities: model.w where model.override.w puts it (through `moves`), other
    quantities as functions of the trial's knob values."""
    def trial(knob_values):
        w = knob_values.get("model.override.w")
        found = {"model.w": 400 if w is None else moves(w)}
        return found | {q: f(knob_values, found["model.w"]) for q, f in (also or {}).items()}
    return trial


def test_a_model_field_is_moved_by_its_override_to_three_quarters_first():
    made = design.design(run("r", {}, []), W, [], w_trial(), (128, 1024), [])
    assert made == design.Design("model.override.w", 300, 300, (324, 325)) and made.transition == "324|325"
    first = Hypothesis("model.w", 400, "first_clean", 425, 25)  # a first side: the edge's hi is predicted
    assert design.design(run("r", {}, []), first, [], w_trial(), (128, 1024), []).predicted == (324, 325)
    assert design.design(run("r", {"x": 1}, []), W, [], w_trial(), (128, 1024), [{"x": 1}]).value == 300


def test_a_trial_that_exists_or_no_engine_would_start_or_that_leaves_the_quantity_is_not_proposed():
    mine = run("r", {"x": 1}, [])
    tried = [{"x": 1, "model.override.w": 300}]
    assert design.design(mine, W, [], w_trial(), (128, 1024), tried).value == 200
    refuses = w_trial()
    assert design.design(mine, W, [], lambda kv: None if kv.get("model.override.w") == 300 else refuses(kv),
                         (128, 1024), []).value == 200
    assert design.design(mine, W, [], lambda kv: {} if kv.get("model.override.w") == 300 else refuses(kv),
                         (128, 1024), []).value == 200
    assert design.design(mine, W, [], lambda kv: None if kv.get("model.override.w") else refuses(kv),
                         (128, 1024), []) == design.NO_KNOB
    assert design.design(mine, W, [], lambda kv: None, (128, 1024), []) == design.NO_KNOB  # not even the base


def test_a_trial_must_move_the_side_by_two_or_more():
    stays = {300: 400, 200: 401, 500: 402, 800: 500}
    made = design.design(run("r", {}, []), W, [], w_trial(stays.get), (128, 1024), [])
    assert (made.value, made.moved_to, made.predicted) == (500, 402, (426, 427))
    assert design.design(run("r", {}, []), W, [], w_trial(lambda v: 400), (128, 1024), []) == design.NO_KNOB
    down_by_two = {300: 398, 200: 399}
    assert design.design(run("r", {}, []), W, [], w_trial(lambda v: down_by_two.get(v, 400)), (128, 1024),
                         []).predicted == (422, 423)


def test_the_predicted_edge_must_lie_inside_the_limits():
    mine = run("r", {}, [])
    assert design.design(mine, W, [], w_trial(), (324, 325), []).value == 300
    assert design.design(mine, W, [], w_trial(), (325, 1024), []).value == 500
    assert design.design(mine, W, [], w_trial(), (128, 324), []).value == 200
    assert design.design(mine, W, [], w_trial(), (128, 224), []) == design.OUTSIDE  # 224|225 ends past it
    assert design.design(mine, W, [], w_trial(), (325, 523), []) == design.OUTSIDE
    assert design.design(mine, W, [], w_trial(), (825, 900), []) == design.OUTSIDE


def test_a_trial_that_moves_another_candidate_onto_the_same_prediction_is_not_proposed():
    twin = Hypothesis("model.twin", 400, "last_polluted", 424, 24)  # the same prediction wherever both go
    trial = w_trial(also={"model.twin": lambda kv, w: w if kv.get("model.override.w") != 500 else 400})
    assert design.design(run("r", {}, []), W, [twin], trial, (128, 1024), []).value == 500
    always = w_trial(also={"model.twin": lambda kv, w: w})
    assert design.design(run("r", {}, []), W, [twin], always, (128, 1024), []) == design.NO_KNOB
    gone = w_trial(also={"model.twin": lambda kv, w: None})  # a candidate the trial lacks: moved, but predicts nothing
    assert design.design(run("r", {}, []), W, [twin], gone, (128, 1024), []).value == 300


def test_among_the_trials_left_the_one_that_moves_fewest_others_off_powers_of_two_and_collisions_wins():
    mine = run("r", {}, [])
    collides = w_trial(also={"model.other": lambda kv, w: 300})  # another quantity equal to the moved one
    assert design.design(mine, W, [], collides, (128, 1024), []).value == 200
    side = Hypothesis("model.side", 100, "last_polluted", 424, 324)
    moves_side = w_trial(also={"model.side": lambda kv, w: 101 if kv.get("model.override.w") in (300, 200) else 100})
    assert design.design(mine, W, [side], moves_side, (128, 1024), []).value == 500  # 300 and 200 move it too
    power = Hypothesis("model.w", 400, "last_polluted", 356, -44)  # 300 - 44 = 256: a power of two
    assert design.design(mine, power, [], w_trial(), (128, 1024), []).predicted == (156, 157)
    assert design.design(mine, power, [], w_trial(), (200, 1024), []).predicted == (456, 457)
    # the own knob first: the capture knob moves model.w as well, but comes second
    both = w_trial(lambda v: v)
    def via_capture(kv):
        found = both(kv)
        return found | ({"model.w": kv["cudagraph.capture"]} if kv.get("cudagraph.capture") else {})
    assert design.design(mine, W, [], via_capture, (128, 1024), []).knob == "model.override.w"
    tried = [{"model.override.w": v} for v in (300, 200, 500, 800)]
    made = design.design(mine, W, [], via_capture, (128, 1024), tried)
    assert (made.knob, made.value, made.moved_to, made.predicted) == ("cudagraph.capture", 384, 384, (408, 409))


def test_the_targeted_probes_are_the_predicted_and_the_old_edges_lengths():
    assert design.targeted((384, 385), (512, 513)) == [384, 385, 512, 513]
    assert design.targeted((512, 513), (511, 512)) == [511, 512, 513]


def test_the_targeted_probes_settle_it_only_where_both_pairs_read_as_one_hypothesis_says():
    P, C = "polluted", "clean"
    new, old = (384, 385), (512, 513)
    assert design.decisive({384: P, 385: C, 512: C, 513: C}, new, old, DOWN)  # moved as predicted
    assert design.decisive({384: P, 385: C, 512: P, 513: P}, new, old, DOWN)
    assert design.decisive({384: P, 385: P, 512: P, 513: C}, new, old, DOWN)  # stayed
    assert design.decisive({384: C, 385: C, 512: P, 513: C}, new, old, DOWN)
    assert not design.decisive({384: P, 385: C, 512: P, 513: C}, new, old, DOWN)  # both flip: search
    assert not design.decisive({384: C, 385: C, 512: C, 513: C}, new, old, DOWN)  # neither: search
    assert not design.decisive({384: C, 385: P, 512: C, 513: C}, new, old, DOWN)  # the wrong way
    assert not design.decisive({384: P, 385: C, 512: C}, new, old, DOWN)  # a probe missing
    assert not design.decisive({384: P, 385: C}, new, old, DOWN)
    assert not design.decisive({385: C, 512: P, 513: C}, new, old, DOWN)
    assert not design.decisive({}, new, old, DOWN)
    assert design.decisive({384: C, 385: P, 512: P, 513: P}, new, old, UP)
    assert design.decisive({384: C, 385: C, 512: C, 513: P}, new, old, UP)
    assert not design.decisive({384: P, 385: C, 512: C, 513: C}, new, old, UP)


def test_a_follow_up_places_its_edge_within_the_lengths_measured_and_the_models_length():
    mine = run("r", {}, [], lengths=(200, 128, 1024, 600))
    assert design.limits_of(mine, {}) == (128, 1024)
    assert design.limits_of(mine, {"scheduler_config.max_model_len": 700, "model.max_position_embeddings": 900}) \
        == (128, 700)
    assert design.limits_of(mine, {"model.max_position_embeddings": 900}) == (128, 900)
    assert design.limits_of(mine, {"model.max_position_embeddings": 4096}) == (128, 1024)
    assert design.limits_of(run("r", {}, [], lengths=()), {"model.max_position_embeddings": 900}) == (1, 0)
    assert design.limits_of({"points": None}, {}) == (1, 0)


# -- explain/tested.py: every resolved transition tested or said untested -------------------------------

TRIAL_RESOLVED = RESOLVED | {"config_quantities": {"cache_config.block_size": 16,
                                                   "scheduler_config.max_model_len": 4096},
                             "model_quantities": {"model.w": 400}}


def fake_predict(knob_values: dict) -> dict:
    if knob_values.get("bad"):
        raise ValueError("no engine starts with this")
    return RESOLVED | {"max_num_seqs": knob_values.get("sched.max_num_seqs", 128),
                       "spec_k": knob_values.get("spec.k", 3),
                       "cudagraph_mode": "NONE" if knob_values.get("eager") else "FULL_AND_PIECEWISE"}


def test_a_trials_quantities_are_predicted_with_its_engine_fields_and_model_overrides_set():
    trial = tested.trial_predictor({"resolved": TRIAL_RESOLVED, "requested": {"spec.k": 3}}, fake_predict)
    assert trial({"spec.k": 3, "engine_args.block_size": 32, "engine_args.max_model_len": True,
                  "engine_args.nothing": 8, "model.override.w": 300, "model.override.v": 5,
                  "sched.max_num_seqs": 64}) == {
        "max_capture_size": 512, "seqs_x_query_len": 256, "twice_seqs_x_query_len": 512,
        "max_num_batched_tokens": 2048, "batched_tokens_per_query_len": 512, "default_capture_ceiling": 512,
        "grid_stride_edge": 256, "model.w": 300, "cache_config.block_size": 32,
        "scheduler_config.max_model_len": 4096, "knob spec.k": 3, "knob engine_args.nothing": 8,
        "knob model.override.v": 5, "knob sched.max_num_seqs": 64}
    # no engine would start; CUDA graphs or speculation turned on or off: a mechanism, no quantity
    assert [trial(kv) for kv in ({"bad": 1}, {"eager": True}, {"spec.k": 0})] == [None, None, None]
    assert trial({"spec.k": 1})["seqs_x_query_len"] == 256  # K moved, still on


def test_without_the_runs_resolution_rules_a_trial_keeps_its_resolved_config():
    trial = tested.trial_predictor({"resolved": TRIAL_RESOLVED}, None)
    found = trial({"spec.k": 0, "eager": True, "model.override.w": 450, "engine_args.block_size": 64})
    assert found == {
        "max_capture_size": 512, "seqs_x_query_len": 512, "twice_seqs_x_query_len": 1024,
        "max_num_batched_tokens": 2048, "batched_tokens_per_query_len": 512, "default_capture_ceiling": 512,
        "grid_stride_edge": 256, "model.w": 450, "cache_config.block_size": 64,
        "scheduler_config.max_model_len": 4096}  # K=0 and eager read by no rule: nothing refused
    assert TRIAL_RESOLVED["config_quantities"]["cache_config.block_size"] == 16  # the run's record untouched
    assert TRIAL_RESOLVED["model_quantities"] == {"model.w": 400}


def test_why_a_candidate_went_untested():
    assert tested._why_untested(None) == "no follow-up ran for this comparison"
    assert tested._why_untested({"budget": 0}) == "follow-ups are off (explain.followups=0)"
    assert tested._why_untested({}) == "follow-ups are off (explain.followups=0)"
    assert tested._why_untested({"budget": 3}) == "the follow-up budget is spent (explain.followups=3)"
    assert tested._why_untested({"budget": 3, "skipped": "the sweep was interrupted"}) == "the sweep was interrupted"
    assert tested._why_untested({"budget": 0, "skipped": ""}) == "follow-ups are off (explain.followups=0)"


def test_a_quantity_is_named_as_a_sentence_says_it():
    assert tested.the("max_capture_size") == "the resolved max capture size"
    assert tested.the("model.attention_chunk_size") == "model.attention_chunk_size"
    assert tested.the("knob sched.max_num_seqs") == "knob sched.max_num_seqs"


def test_an_offset_is_said_with_its_side_and_a_decode_edges_position():
    assert tested._offset_text(Hypothesis("model.w", 400, "last_polluted", 424, 24)) == (
        "offset 24 (last polluted 424 = 400 + 24)")
    assert tested._offset_text(Hypothesis("model.w", 400, "first_clean", 385, -15)) == (
        "offset -15 (first clean 385 = 400 - 15)")
    assert tested._offset_text(Hypothesis("m", 512, "last_polluted", 512, 0)) == (
        "offset 0 (last polluted 512 = 512 + 0)")
    at = [tested._offset_text(Hypothesis("m", 400, "first_polluted", 385, -15, at_position=p)) for p in (400, 401, 398)]
    assert at == ["offset -15 (first polluted 385 = 400 - 15; its first divergent position 400 = 400)",
                  "offset -15 (first polluted 385 = 400 - 15; its first divergent position 401 = 400 + 1)",
                  "offset -15 (first polluted 385 = 400 - 15; its first divergent position 398 = 400 - 2)"]


def sweep(*runs_: dict, followups: dict | None = None) -> list[dict]:
    """analysis.summarize's reading of runs built as tests/explain/test_analysis.py builds them: the conclusions."""
    from test_analysis import META

    from oneknob.explain import analysis

    return analysis.summarize(META | {"followups": followups}, list(runs_))


def ablation_runs() -> list[dict]:
    from test_analysis import job

    return [job("baseline", transitions=[down(512)]),
            job("cudagraph.capture=256", "cudagraph.capture", 256, [down(256)]),
            job("sched.max_num_seqs=64", "sched.max_num_seqs", 64, [down(512)]),
            job("spec.k=1", "spec.k", 1, [down(512)])]


def test_the_seeds_ablation_concludes_from_its_own_runs():
    summary = sweep(*ablation_runs())
    (base, capture, seqs, k1) = summary["conclusions"]
    assert base == {
        "run": "baseline", "oracle": None, "transition": "512|513", "direction": DOWN, "relation": "last_polluted",
        "tracks": "max_capture_size", "label": "resolved max capture size", "offset": 0,
        "ruled_out": ["seqs_x_query_len", "batched_tokens_per_query_len", "default_capture_ceiling"],
        "untestable": [], "untested": [],
        "evidence": ["cudagraph.capture=256", "sched.max_num_seqs=64", "spec.k=1"],
        "text": "512|513 tracks the resolved max capture size with offset 0 (last polluted 512 = 512 + 0): "
                "cudagraph.capture=256 moved it 512 -> 256 and the edge to 256|257; ruled out: max_num_seqs x (K+1) "
                "(sched.max_num_seqs=64 moved it 512 -> 256; the edge stayed); max_num_batched_tokens / (K+1) "
                "(spec.k=1 moved it 512 -> 1024; the edge stayed); vLLM's default capture ceiling (unmoved in "
                "cudagraph.capture=256, whose edge is 256|257)"}
    assert capture["text"] == (
        "256|257 tracks the resolved max capture size with offset 0 (last polluted 256 = 256 + 0): baseline moved "
        f"it 256 -> 512 and the edge to 512|513; ruled out: {STRIDE} (unmoved in baseline, whose edge is 512|513)")
    assert (capture["evidence"], capture["ruled_out"]) == (["baseline"], ["grid_stride_edge"])
    # the same edge in a run one knob from the baseline: the baseline's conclusion, as in it
    assert seqs["text"] == (
        "512|513 tracks the resolved max capture size with offset 0 (last polluted 512 = 512 + 0): as in baseline, "
        "whose edge it is; ruled out: 2 x max_num_seqs x (K+1) (baseline moved it 512 -> 1024; the edge stayed); "
        "max_num_batched_tokens / (K+1) (spec.k=1 moved it 512 -> 1024; the edge stayed); vLLM's default capture "
        "ceiling (unmoved in cudagraph.capture=256, whose edge is 256|257)")
    assert seqs["ruled_out"] == ["twice_seqs_x_query_len", "batched_tokens_per_query_len", "default_capture_ceiling"]
    assert seqs["evidence"] == ["baseline", "cudagraph.capture=256", "spec.k=1"]  # never itself
    assert k1["ruled_out"] == ["twice_seqs_x_query_len", "default_capture_ceiling"]  # K moved the budget's share
    assert k1["evidence"] == ["baseline", "cudagraph.capture=256", "sched.max_num_seqs=64"]
    baseline = summary["runs"][0]
    (entry,) = baseline["explained"]
    assert "as_in" not in entry["tested"] and "hypotheses" not in entry["tested"]
    assert entry["tested"]["candidates"][0] == {
        "quantity": "max_capture_size", "value": 512, "relation": "last_polluted", "side": 512, "offset": 0,
        "at_position": None, "label": "resolved max capture size", "coincides": True,
        "text": "last polluted 512 = resolved max capture size"}
    assert [c["quantity"] for c in entry["tested"]["candidates"]] == [
        "max_capture_size", "seqs_x_query_len", "batched_tokens_per_query_len", "default_capture_ceiling"]
    assert summary["runs"][2]["explained"][0]["tested"]["as_in"] == "baseline"
    assert tested.next_test(summary["runs"], []) is None  # nothing left to test


def test_a_baseline_alone_says_what_is_untested_and_why_and_plans_the_next_follow_up():
    from test_analysis import job

    untested = ("512|513: no run tested it; untested: coincides with the resolved max capture size, coincides "
                "with the max_num_seqs x (K+1), coincides with the max_num_batched_tokens / (K+1) ({}); untestable "
                "(no single knob moves it alone): vLLM's default capture ceiling")
    for followups, why in ((None, "no follow-up ran for this comparison"),
                           ({"budget": 0}, "follow-ups are off (explain.followups=0)"),
                           ({"budget": 3}, "the follow-up budget is spent (explain.followups=3)")):
        (conclusion,) = sweep(job("baseline", transitions=[down(512)]), followups=followups)["conclusions"]
        assert conclusion["text"] == untested.format(why)
    assert conclusion["untestable"] == ["default_capture_ceiling"] and conclusion["tracks"] is None
    assert conclusion["untested"] == [
        {"quantity": "max_capture_size", "why": why, "design": {"knob": "cudagraph.capture", "value": 384,
                                                                "moved_to": 384, "predicted": [384, 385]}},
        {"quantity": "seqs_x_query_len", "why": why, "design": {"knob": "sched.max_num_seqs", "value": 96,
                                                                "moved_to": 384, "predicted": [384, 385]}},
        {"quantity": "batched_tokens_per_query_len", "why": why, "design": {
            "knob": "engine_args.max_num_batched_tokens", "value": 1536, "moved_to": 384, "predicted": [384, 385]}}]
    assert (conclusion["evidence"], conclusion["ruled_out"], conclusion["relation"], conclusion["label"]) == (
        [], [], None, None)


def test_the_next_follow_up_is_the_first_untested_candidate_of_the_baselines_edge_not_refused():
    from test_analysis import SEED, job

    summary = sweep(job("baseline", transitions=[down(512)]), followups={"budget": 3})
    nxt = tested.next_test(summary["runs"], [])
    assert nxt == {"run": "baseline", "run_knob": None, "requested": SEED, "oracle": None, "transition": "512|513",
                   "direction": DOWN, "edge": [512, 513], "quantity": "max_capture_size",
                   "label": "resolved max capture size", "relation": "last_polluted", "offset": 0, "value": 384,
                   "knob": "cudagraph.capture", "moved_to": 384, "predicted": [384, 385]}
    refused = tested.next_test(summary["runs"], [SEED | {"cudagraph.capture": 384}])
    assert (refused["quantity"], refused["knob"], refused["value"], refused["label"]) == (
        "seqs_x_query_len", "sched.max_num_seqs", 96, "max_num_seqs x (K+1)")
    assert tested.next_test(summary["runs"], [SEED | {"cudagraph.capture": 384}, SEED | {"sched.max_num_seqs": 96},
                                              SEED | {"engine_args.max_num_batched_tokens": 1536}]) is None
    assert tested.next_test([], []) is None


def test_the_next_follow_up_looks_at_the_baseline_first_then_the_variants_never_at_follow_ups():
    from test_analysis import job

    variant = job("cudagraph.capture=384", "cudagraph.capture", 384, [up(700)])  # no edge of the other's direction
    runs = sweep(copy.deepcopy(variant), job("baseline", transitions=[down(512)]), followups={"budget": 3})["runs"]
    assert [tested.next_test(runs, [])[k] for k in ("run", "transition")] == ["baseline", "512|513"]
    followup = job("follow-up x", "sched.max_num_seqs", 64, [up(800)], followup=True)  # its own edge untested
    runs = sweep(followup, variant, job("baseline", transitions=[]), followups={"budget": 3})["runs"]
    assert runs[0]["explained"][0]["tested"]["untested"][0]["design"]
    nxt = tested.next_test(runs, [])
    assert (nxt["run"], nxt["run_knob"], nxt["transition"], nxt["edge"]) == (
        "cudagraph.capture=384", "cudagraph.capture", "700|701", [700, 701])
    assert nxt["requested"]["cudagraph.capture"] == 384


def test_an_edge_that_stayed_under_every_move_tracks_none_of_those_tried():
    from test_analysis import job

    (base, capture, seqs, k1) = sweep(job("baseline", transitions=[down(512)]),
                                      job("cudagraph.capture=384", "cudagraph.capture", 384, [down(512)]),
                                      job("sched.max_num_seqs=96", "sched.max_num_seqs", 96, [down(512)]),
                                      job("spec.k=1", "spec.k", 1, [down(512)]))["conclusions"]
    assert base["text"] == (
        "512|513 tracks none of those tried: ruled out resolved max capture size (cudagraph.capture=384 moved it "
        "512 -> 384; the edge stayed); max_num_seqs x (K+1) (sched.max_num_seqs=96 moved it 512 -> 384; the edge "
        "stayed); max_num_batched_tokens / (K+1) (spec.k=1 moved it 512 -> 1024; the edge stayed); untestable (no "
        "single knob moves it alone): vLLM's default capture ceiling")
    assert (base["tracks"], base["untestable"], base["untested"]) == (None, ["default_capture_ceiling"], [])
    assert k1["text"] == (
        "512|513 does not track 2 x max_num_seqs x (K+1) (baseline moved it 512 -> 1024; the edge stayed); "
        "untested: coincides with the resolved max capture size (no follow-up ran for this comparison); untestable "
        "(no single knob moves it alone): vLLM's default capture ceiling")


def test_quantities_that_moved_together_are_said_so_with_what_was_ruled_out():
    from test_analysis import SEED, job, resolved_of

    def with_model(requested, fields):
        return resolved_of(SEED | requested) | {"model_quantities": fields}
    (base, seqs) = sweep(job("baseline", transitions=[down(512)], resolved=with_model({}, {"model.w": 512})),
                         job("sched.max_num_seqs=64", "sched.max_num_seqs", 64, [down(256)],
                             resolved=with_model({"sched.max_num_seqs": 64}, {"model.w": 256})))["conclusions"]
    assert base["text"] == (
        "512|513 moved with max_num_seqs x (K+1), model.w together (no run moved one of them alone); ruled out: "
        "resolved max capture size, max_num_batched_tokens / (K+1), vLLM's default capture ceiling (unmoved in "
        "sched.max_num_seqs=64, whose edge is 256|257)")
    assert seqs["text"].startswith("256|257 moved with max_num_seqs x (K+1), model.w together")


def test_an_edge_that_moved_but_not_with_the_quantity_and_a_power_of_two_ruled_out():
    from test_analysis import job

    (base, _) = sweep(job("baseline", transitions=[down(512)]),
                      job("cudagraph.capture=384", "cudagraph.capture", 384, [down(300)]))["conclusions"]
    assert base["text"] == (
        "512|513 tracks none of those tried: ruled out resolved max capture size (cudagraph.capture=384 moved it "
        "512 -> 384, predicting 384; the edge went to 300|301: moved, but not with it); max_num_seqs x (K+1), "
        "max_num_batched_tokens / (K+1), vLLM's default capture ceiling (unmoved in cudagraph.capture=384, whose "
        "edge is 300|301)")
    (base, capture) = sweep(job("baseline", transitions=[down(512)]),
                            job("cudagraph.capture=384", "cudagraph.capture", 384, [down(384)]))["conclusions"]
    assert base["text"].endswith("(unmoved in cudagraph.capture=384, whose edge is 384|385); a power of two (the "
                                 "moved edge is not one)")
    assert capture["text"] == ("384|385 tracks the resolved max capture size with offset 0 (last polluted 384 = "
                               "384 + 0): baseline moved it 384 -> 512 and the edge to 512|513")


def test_a_model_field_plus_an_offset_is_concluded_by_the_run_that_overrode_it():
    from test_analysis import SEED, job, resolved_of

    def chunk(size):
        return resolved_of(SEED) | {"model_quantities": {"model.attention_chunk_size": size}}
    (base, moved) = sweep(job("baseline", transitions=[down(424)], resolved=chunk(400)),
                          job("model.override.attention_chunk_size=300", "model.override.attention_chunk_size", 300,
                              [down(324)], resolved=chunk(300)), followups={"budget": 3})["conclusions"]
    assert base["text"] == (
        "424|425 tracks model.attention_chunk_size with offset 24 (last polluted 424 = 400 + 24): "
        "model.override.attention_chunk_size=300 moved it 400 -> 300 and the edge to 324|325; ruled out: resolved "
        "max capture size, max_num_seqs x (K+1), max_num_batched_tokens / (K+1), vLLM's default capture ceiling, "
        f"2 x max_num_seqs x (K+1), {STRIDE} (unmoved in model.override.attention_chunk_size=300, whose edge is "
        "324|325)")
    assert (base["tracks"], base["label"], base["offset"], base["relation"]) == (
        "model.attention_chunk_size", "model.attention_chunk_size", 24, "last_polluted")
    assert moved["evidence"] == ["baseline"]


def greedy_run(name, knob, value, transition, window):
    from test_analysis import SEED, job, resolved_of

    found = job(name, knob, value, [transition],
                resolved=resolved_of(SEED) | {"model_quantities": {"model.sliding_window": window}})
    polluted_from = transition["hi"]
    found["oracles"] = {
        "nll": {"transitions": [], "verdicts": {p["length"]: "clean" for p in found["points"]}},
        "greedy": {"transitions": [transition], "verdicts": {p["length"]: "polluted" if p["length"] >= polluted_from
                                                            else "clean" for p in found["points"]}}}
    return found


def test_a_decode_edge_at_a_position_is_concluded_per_oracle_and_says_the_position():
    (base, moved) = sweep(greedy_run("baseline", None, None, up(384) | {"first_position": 400}, 400),
                          greedy_run("model.override.sliding_window=300", "model.override.sliding_window", 300,
                                     up(284) | {"first_position": 301}, 300))["conclusions"]
    assert base["text"] == (
        "greedy: 384|385 tracks model.sliding_window with offset -15 (first polluted 385 = 400 - 15; its first "
        "divergent position 400 = 400): model.override.sliding_window=300 moved it 400 -> 300 and the edge to "
        "284|285")
    assert (base["oracle"], base["direction"], base["relation"]) == ("greedy", UP, "first_polluted")
    assert moved["text"].startswith("greedy: 284|285 tracks model.sliding_window with offset -15 (first polluted "
                                    "285 = 300 - 15; its first divergent position 301 = 300 + 1)")


def test_an_inherited_conclusion_keeps_only_what_this_edge_has_as_candidates():
    from test_analysis import SEED, job, resolved_of

    def chunk(requested, size):
        return resolved_of(SEED | requested) | {"model_quantities": {"model.chunk": size}}
    runs = [job("baseline", transitions=[down(424)], resolved=chunk({}, 400)),
            job("model.override.chunk=300", "model.override.chunk", 300, [down(324)], resolved=chunk({}, 300)),
            job("sched.max_num_seqs=106", "sched.max_num_seqs", 106, [down(424)],  # 106 x 4 = 424 coincides
                resolved=chunk({"sched.max_num_seqs": 106}, 400))]
    (base, _, seqs) = sweep(*runs)["conclusions"]
    assert base["ruled_out"] == ["max_capture_size", "seqs_x_query_len", "batched_tokens_per_query_len",
                                 "default_capture_ceiling", "twice_seqs_x_query_len", "grid_stride_edge"]
    # the baseline's nearest candidates are none of this edge's (it coincides with max_num_seqs x (K+1)):
    # the conclusion and its offset are the baseline's, the ruled-out ones this edge's own
    assert seqs == {
        "run": "sched.max_num_seqs=106", "oracle": None, "transition": "424|425", "direction": DOWN,
        "relation": "last_polluted", "tracks": "model.chunk", "label": "model.chunk", "offset": 24,
        "ruled_out": ["seqs_x_query_len"], "untestable": [], "untested": [],
        "evidence": ["baseline", "model.override.chunk=300"],
        "text": "424|425 tracks model.chunk with offset 24: as in baseline, whose edge it is; ruled out: max_num_seqs "
                "x (K+1) (baseline moved it 424 -> 512; the edge stayed)"}


def test_an_inherited_conclusion_replaces_what_the_run_left_untested():
    (_, _, seqs, _) = sweep(*ablation_runs())["conclusions"]
    assert {k: seqs[k] for k in ("tracks", "offset", "relation", "untested", "untestable")} == {
        "tracks": "max_capture_size", "offset": 0, "relation": "last_polluted", "untested": [], "untestable": []}
    # whatever the order of the runs, and never from a conclusion that was itself inherited
    (k1, seqs, capture, base) = sweep(*reversed(ablation_runs()))["conclusions"]
    assert seqs["text"].startswith("512|513 tracks the resolved max capture size with offset 0 (last polluted 512 = "
                                   "512 + 0): as in baseline, whose edge it is")
    from test_analysis import job

    both = job("sched.max_num_seqs=64, spec.k=1", "spec.k", 1, [down(512)])
    both["requested"] = both["requested"] | {"sched.max_num_seqs": 64}
    (*_, two) = sweep(*ablation_runs(), both)["conclusions"]
    assert two["tracks"] is None and "as in" not in two["text"]  # its runs one knob away only inherited it


def test_the_tested_record_has_the_fields_summary_json_carries():
    summary = sweep(*ablation_runs())
    (entry,) = summary["runs"][0]["explained"]
    assert sorted(entry["tested"]) == ["candidates", "evidence", "offset", "power_of_two", "relation", "ruled_out",
                                       "tested", "text", "together", "tracks", "untestable", "untested", "why"]
    (entry,) = summary["runs"][2]["explained"]
    assert sorted(entry["tested"]) == ["as_in", "candidates", "evidence", "offset", "power_of_two", "relation",
                                       "ruled_out", "tested", "text", "together", "tracks", "untestable", "untested",
                                       "why"]


def test_two_quantities_one_run_moved_while_the_edge_stayed_are_said_each_with_its_values():
    from test_analysis import job

    (base, _) = sweep(job("baseline", transitions=[down(512)]), job("spec.k=1", "spec.k", 1, [down(512)]))[
        "conclusions"]
    assert base["text"] == (
        "512|513 does not track max_num_seqs x (K+1) (spec.k=1 moved it 512 -> 256; the edge stayed); "
        "max_num_batched_tokens / (K+1) (spec.k=1 moved it 512 -> 1024; the edge stayed); untested: coincides with "
        "the resolved max capture size (no follow-up ran for this comparison); untestable (no single knob moves it "
        "alone): vLLM's default capture ceiling")


def test_an_edge_near_quantities_says_each_untested_one_and_every_reason():
    from test_analysis import job

    (base,) = sweep(job("baseline", transitions=[down(700)]), followups={"budget": 3})["conclusions"]
    assert base["text"] == (
        "700|701: no run tested it; untested: near first clean 701 = 2 x max_num_seqs x (K+1) (1024) - 323, near "
        "last polluted 700 = resolved max capture size (512) + 188, near last polluted 700 = max_num_seqs x (K+1) "
        "(512) + 188, near last polluted 700 = max_num_batched_tokens / (K+1) (512) + 188, near first clean 701 = "
        "max_num_batched_tokens (2048) - 1347 (the follow-up budget is spent (explain.followups=3); the predicted "
        "edge falls outside the lengths measured); untestable (no single knob moves it alone): vLLM's default "
        f"capture ceiling, {STRIDE}")


def test_a_trial_a_run_of_the_sweep_already_made_is_not_planned_again():
    from test_analysis import job

    (base,) = sweep(job("baseline", transitions=[down(512)]),
                    job("cudagraph.capture=384", "cudagraph.capture", 384, []))["conclusions"]  # no edge: no word
    assert base["untested"][0] == {"quantity": "max_capture_size", "why": "no follow-up ran for this comparison",
                                   "design": {"knob": "spec.k", "value": 2, "moved_to": 498,
                                              "predicted": [498, 499]}}


def test_an_oracles_edge_is_tested_by_that_oracles_edges_in_the_other_run():
    baseline = greedy_run("baseline", None, None, up(384) | {"first_position": 400}, 400)
    moved = greedy_run("model.override.sliding_window=300", "model.override.sliding_window", 300,
                       up(284) | {"first_position": 301}, 300)
    moved["oracles"]["nll"] = {"transitions": [up(250)], "verdicts": {
        p["length"]: "polluted" if p["length"] >= 251 else "clean" for p in moved["points"]}}
    moved["transitions"] = [up(250)]  # the combined verdict: polluted where any oracle is
    (base, *_) = sweep(baseline, moved)["conclusions"]
    assert (base["oracle"], base["tracks"], base["evidence"]) == (
        "greedy", "model.sliding_window", ["model.override.sliding_window=300"])


def annotated(*runs_: dict, measured=lambda r: True, followups=None, predict=None) -> list[dict]:
    """tested.annotate over hand-built runs (explained against the first), with these resolution rules."""
    for r in runs_:
        r.setdefault("explained", run_edges.explain_run(r, runs_[0]))
    return tested.annotate(list(runs_), measured, lambda r: predict, followups)


def seed_rules(knob_values: dict) -> dict:
    from oneknob.config import resolution

    return resolution.predict({"spec.k": 3, "sched.max_num_seqs": 128, "runner": "v1"} | knob_values,
                              max_num_batched_tokens=2048)


ALONE = {"max_capture_size": 640, "device_capture_ceiling": 1024, "max_num_batched_tokens": 4096,
         "model_quantities": {"model.w": 512}}  # at 512 only max_num_seqs x (K+1) and model.w


def test_quantities_that_moved_together_with_nothing_ruled_out_say_only_that():
    (base, _) = annotated(run("baseline", {}, [edge(512)], **ALONE),
                          run("seqs", {"sched.max_num_seqs": 64}, [edge(256)], **ALONE | {
                              "max_num_seqs": 64, "model_quantities": {"model.w": 256}}))
    assert base["text"] == ("512|513 moved with max_num_seqs x (K+1), model.w together (no run moved one of them "
                            "alone)")


def test_a_power_of_two_is_ruled_out_alone_when_nothing_else_was():
    resolved = ALONE | {"model_quantities": {}, "max_capture_size": 512}
    (base, _) = annotated(run("baseline", {}, [edge(512)], **resolved | {"max_num_seqs": 100}),
                          run("c", {"cudagraph.capture": 384}, [edge(384)], **resolved | {
                              "max_num_seqs": 100, "max_capture_size": 384}))
    assert base["text"] == (
        "512|513 tracks the resolved max capture size with offset 0 (last polluted 512 = 512 + 0): c moved it 512 "
        "-> 384 and the edge to 384|385; ruled out: a power of two (the moved edge is not one)")


def test_an_edge_with_no_candidate_says_so_and_constants_are_untestable_together():
    (bare,) = annotated({"name": "baseline", "requested": {}, "resolved": {}, "transitions": [edge(512)],
                         "points": [{"length": 128}], "status": "ok"})
    assert bare["text"] == "512|513: no candidate quantity to test"
    (constants,) = annotated(run("baseline", {}, [edge(256)], **ALONE | {"device_capture_ceiling": 256}))
    assert constants["untestable"] == ["default_capture_ceiling", "grid_stride_edge"]
    assert constants["text"].endswith(f"; untestable (no single knob moves it alone): {CEILING}, {STRIDE}")


def test_only_measured_runs_along_the_length_axis_are_tested_and_follow_ups_conclude_nothing_of_their_own():
    baseline = run("baseline", {}, [edge(512)])
    failed = run("failed", {"cudagraph.capture": 256}, [edge(256)]) | {"status": "failed"}
    batch = run("batch", {"cudagraph.capture": 384}, [edge(384)]) | {"axis": "batch"}
    followup = run("follow-up", {"sched.max_num_seqs": 96}, [edge(512)]) | {"followup": True}
    no_axis = run("no axis", {"spec.k": 1}, [edge(100, 200), edge(512)], spec_k=1)
    del no_axis["axis"]
    conclusions = annotated(baseline, failed, batch, followup, no_axis, measured=lambda r: r["status"] == "ok")
    assert [(c["run"], c["transition"]) for c in conclusions] == [("baseline", "512|513"), ("no axis", "512|513")]
    assert "failed" not in conclusions[0]["evidence"] and "batch" not in conclusions[0]["evidence"]
    assert conclusions[0]["ruled_out"] == ["seqs_x_query_len", "batched_tokens_per_query_len"]  # by the follow-up
    assert "tested" not in batch["explained"][0] and "tested" not in failed["explained"][0]
    assert "tested" in followup["explained"][0] and "tested" not in no_axis["explained"][0]


def test_the_next_follow_up_skips_unresolved_and_concluded_edges_of_a_run():
    baseline = run("baseline", {}, [edge(100, 200), edge(512), edge(700)])
    annotated(baseline, run("capture=384", {"cudagraph.capture": 384}, [edge(384), edge(700)], max_capture_size=384),
              predict=seed_rules)
    assert [e["tested"]["tracks"] if "tested" in e else "-" for e in baseline["explained"]] == [
        "-", "max_capture_size", None]
    nxt = tested.next_test([baseline], [])
    assert (nxt["transition"], nxt["quantity"], nxt["knob"], nxt["value"], nxt["predicted"]) == (
        "700|701", "twice_seqs_x_query_len", "sched.max_num_seqs", 96, [444, 445])


# -- the finer points: orders, joins and edges of conditions ---------------------------------------------

def test_a_knob_value_of_two_is_a_candidate_and_one_is_not():
    assert run_edges.candidates({"requested": {"a": 2, "b": 1}}) == {"knob a": 2}


def test_a_new_edge_names_every_quantity_that_moved_and_every_one_that_did_not():
    baseline = run("baseline", {}, [edge(512)], model_quantities={"model.a": 256, "model.b": 256})
    k1 = run("spec.k=1", {"spec.k": 1}, [edge(256)], spec_k=1, model_quantities={"model.a": 256, "model.b": 256})
    (new,) = run_edges.explain_run(k1, baseline)
    assert new["versus_baseline"] == (f"moved with the knob: max_num_seqs x (K+1) 512 -> 256; unmoved: {STRIDE} "
                                      "(256), model.a (256), model.b (256)")
    seqs = run("seqs", {"sched.max_num_seqs": 64}, [edge(256)], max_num_seqs=64, max_num_batched_tokens=1024)
    assert run_edges.explain_run(seqs, baseline)[0]["versus_baseline"] == (
        f"moved with the knob: max_num_seqs x (K+1) 512 -> 256, max_num_batched_tokens / (K+1) 512 -> 256; "
        f"unmoved: {STRIDE} (256)")


def test_same_edges_say_an_addition_or_a_loss_alone_and_join_several_edges():
    baseline = run("baseline", {}, [edge(512), edge(900, direction=UP)])
    added = run("added", {"x": 1}, [edge(512), edge(900, direction=UP)], model_quantities={"model.w": 900})
    lost = run("lost", {"x": 2}, [edge(512), edge(900, direction=UP)], max_capture_size=640)
    both = run("both", {"x": 3}, [edge(512), edge(900, direction=UP)], max_capture_size=640,
               model_quantities={"model.w": 900})
    runs = explained_sweep(baseline, added, lost, both)
    assert run_edges.same_edges(runs, baseline) == [
        "added: 900|901 as at the baseline; also = model.w",
        "lost: 512|513 as at the baseline; no longer = resolved max capture size",
        "both: 512|513 as at the baseline; no longer = resolved max capture size; 900|901 as at the baseline; "
        "also = model.w"]
    # a run with an edge the baseline lacks is a new edge's line, not this one, even where it shares one
    new = run("new", {"x": 4}, [edge(300), edge(512)], max_capture_size=640)
    new["explained"] = run_edges.explain_run(new, baseline)
    assert run_edges.same_edges([baseline, new, {"name": "unmeasured"}], baseline) == []


def test_a_hypothesis_one_off_says_its_offset_and_a_value_of_one_is_a_quantity():
    assert Hypothesis("model.w", 400, "last_polluted", 401, 1).text() == "last polluted 401 = model.w (400) + 1"
    assert Hypothesis("model.w", 400, "last_polluted", 399, -1).text() == "last polluted 399 = model.w (400) - 1"
    assert hypotheses(edge(2), {"model.one": 1, "model.zero": 0}) == [
        Hypothesis("model.one", 1, "last_polluted", 2, 1)]


def test_the_run_that_moved_a_quantity_is_its_why_before_one_whose_edge_went_elsewhere():
    other = Word("x", "ruled_out", 256, "300|301", "other", 256)
    held = Word("seqs=64", "ruled_out", 256, "512|513", "held", 256)
    found = conclude([SEQS], {"seqs_x_query_len": [other, held]}, {"last_polluted": 511})
    assert found["why"]["seqs_x_query_len"] == asdict(held) and found["evidence"] == ["seqs=64", "x"]


def test_a_candidate_that_moved_alone_tracks_even_where_another_has_an_unmoved_word_of_that_run():
    moved = Word("a", "moved", 256, "256|257", predicted=256)
    found = conclude([CAPTURE, SEQS], {"max_capture_size": [moved],
                                       "seqs_x_query_len": [Word("a", "unknown", 512, None, predicted=512)]},
                     {"last_polluted": 512})
    assert (found["tracks"], found["together"]) == ("max_capture_size", [])
    alone = conclude([CAPTURE, SEQS], {"max_capture_size": [moved]}, {"last_polluted": 512})  # no word of the other
    assert alone["tracks"] == "max_capture_size"


def test_a_candidate_that_moved_together_once_and_alone_later_tracks_by_the_later_run():
    words = {"max_capture_size": [Word("a", "moved", 256, "256|257", predicted=256),
                                  Word("b", "moved", 384, "384|385", predicted=384)],
             "seqs_x_query_len": [Word("a", "moved", 256, "256|257", predicted=256),
                                  Word("b", "unmoved", 512, "384|385", predicted=512)]}
    found = conclude([CAPTURE, SEQS], words, {"last_polluted": 512})
    assert (found["tracks"], found["together"], found["evidence"]) == ("max_capture_size", [], ["b"])
    assert found["why"]["max_capture_size"]["run"] == "b"


def test_the_tested_candidates_are_listed_in_the_order_tried():
    words = {"max_capture_size": [Word("a", "ruled_out", 256, "512|513", "held", 256)],
             "seqs_x_query_len": [Word("b", "ruled_out", 256, "512|513", "held", 256)]}
    assert conclude([SEQS, CAPTURE], words, {"last_polluted": 512})["tested"] == ["seqs_x_query_len",
                                                                                   "max_capture_size"]


def test_a_power_of_two_is_ruled_out_by_where_the_moved_edge_is_with_its_offset():
    offset = Hypothesis("model.w", 500, "last_polluted", 512, 12)
    onto = conclude([offset], {"model.w": [Word("a", "moved", 244, "256|257", predicted=256)]},
                    {"last_polluted": 512})
    assert onto["power_of_two"] == "coincides"  # 244 + 12 = 256: a power of two again
    off = conclude([offset], {"model.w": [Word("a", "moved", 372, "384|385", predicted=384)]},
                   {"last_polluted": 512})
    assert off["power_of_two"] == "ruled_out"


def test_a_nested_engine_config_field_is_moved_by_no_knob_of_its_own():
    named = ["cudagraph.capture", "sched.max_num_seqs", "spec.k", "engine_args.max_num_batched_tokens"]
    # its last part names a scheduler field, but it is another field: the scheduler's knob is no own knob of it
    assert design.movers("compilation_config.pass_config.max_num_seqs", {}) == named
    assert design.movers("compilation_config.pass_config.size", {}) == named


def test_the_speculative_tokens_are_tried_from_one_to_four():
    k = Hypothesis("knob spec.k", 3, "last_polluted", 10, 7)
    made = design.design(run("r", {"spec.k": 3}, []), k, [], lambda kv: {"knob spec.k": kv["spec.k"]}, (1, 100), [])
    assert (made.knob, made.value, made.predicted) == ("spec.k", 1, (8, 9))


# -- verdict/decode.py: malformed answers (the worker marks them; the decode oracles judge them polluted) ---------

def test_a_malformed_continuation_is_scored_over_its_readable_logprobs_and_judged_polluted():
    nan = float("nan")
    with pytest.raises(ValueError, match="non-finite logprob"):  # unmarked: a bug in the worker, never a verdict
        decode.compare([1, 2], [nan, -1.0], [-1.0, -1.0], [1, 2], VERDICT)
    partial = decode.compare([1, 2], [nan, -1.5], [-1.0, -1.0], [1, 2], VERDICT, True)
    assert partial == {"greedy_match": 1.0, "greedy_first_divergence": -1, "greedy_polluted": False,
                       "decode_nll": 1.5, "decode_nll_ref": 1.0, "decode_delta": 0.5, "decode_max_delta": 0.5,
                       "decode_first_deviation": -1, "decode_polluted": True}
    unreadable = decode.compare([1, 2], [nan, nan], [-1.0, -1.0], [1, 3], VERDICT, True)
    assert unreadable == {"greedy_match": 0.5, "greedy_first_divergence": 1, "greedy_polluted": True,
                          "decode_nll": None, "decode_nll_ref": None, "decode_delta": None, "decode_max_delta": None,
                          "decode_first_deviation": None, "decode_polluted": True}


def test_a_decode_oracle_whose_part_was_malformed_judges_the_point_polluted():
    nan = float("nan")
    score = {"logprobs": [-1.0, -1.0], "argmax": [1, 2]}
    clean = Point(length=300, sample=0, nll=3.0, scored=299, seconds=0.1, polluted=False, nll_polluted=False)
    bad_decode = replace(clean, malformed={"decode": "malformed: a logprob that is no number"})
    judged = decode.judge(bad_decode, [1, 2], [nan, -1.0], score, ("nll", "greedy", "decode"), VERDICT)
    assert (judged.greedy_polluted, judged.decode_polluted, judged.polluted) == (False, True, True)
    assert (judged.decode_delta, judged.decode_nll) == (0.0, 1.0)  # over the readable token
    bad_greedy = replace(clean, malformed={"greedy": "malformed: a token id that is no number"})
    judged = decode.judge(bad_greedy, [1, 2], [-1.0, -1.0], score, ("nll", "greedy"), VERDICT)
    assert (judged.greedy_polluted, judged.decode_polluted, judged.polluted) == (True, False, True)
    # the continuation's tokens themselves unreadable: nothing to score, both decode oracles polluted
    unscored = decode.judge(bad_greedy, [], [], None, ("nll", "decode"), VERDICT)
    assert {f: getattr(unscored, f) for f in decode.FIELDS} == {f: None for f in decode.FIELDS} | {
        "greedy_polluted": True, "decode_polluted": True}
    assert unscored.polluted is True
    no_tokens = decode.judge(bad_decode, [], [], None, ("nll", "greedy"), VERDICT)  # greedy has nothing to match
    assert (no_tokens.greedy_polluted, no_tokens.decode_polluted, no_tokens.polluted) == (True, True, True)
    assert decode.judge(clean, [1, 2], [-1.0, -1.0], score, ("nll", "greedy", "decode"), VERDICT).polluted is False
