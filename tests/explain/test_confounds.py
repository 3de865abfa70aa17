"""Confounds on the seed study: 512 is three quantities at once until capture moves alone."""

from __future__ import annotations

import functools

import pytest
from helpers import DOWN, UP, down, up

from oneknob.explain import claims
from oneknob.explain import confounds
from oneknob.config import resolution

SEED = {"sched.max_num_seqs": 128, "spec.k": 3}
predict = functools.partial(resolution.predict, max_num_batched_tokens=2048)


def test_derived_quantities_of_the_seed_baseline():
    quantities = confounds.derived_quantities(predict(SEED))
    assert quantities["max_capture_size"] == 512
    assert quantities["seqs_x_query_len"] == 512
    assert quantities["twice_seqs_x_query_len"] == 1024
    assert quantities["max_num_batched_tokens"] == 2048
    assert quantities["batched_tokens_per_query_len"] == 512
    assert set(quantities) <= set(confounds.CANDIDATES)


def test_per_query_len_share_is_floored_and_absent_without_speculation():
    assert confounds.derived_quantities(predict({"spec.k": 2}))["batched_tokens_per_query_len"] == 682
    assert "batched_tokens_per_query_len" not in confounds.derived_quantities(predict({"spec.k": 0}))


def test_graph_quantities_vanish_without_graphs():
    eager = confounds.derived_quantities(predict({**SEED, "cudagraph.enforce_eager": True}))
    assert "max_capture_size" not in eager and "default_capture_ceiling" not in eager
    cpu = confounds.derived_quantities(resolution.predict(SEED, platform="cpu"))
    assert "max_capture_size" not in cpu


def test_seed_transition_is_ambiguous_and_names_the_relation():
    found = confounds.matches(down(512), predict(SEED))
    assert [(m["quantity"], m["relation"]) for m in found] == [
        ("max_capture_size", "last_polluted"), ("seqs_x_query_len", "last_polluted"),
        ("batched_tokens_per_query_len", "last_polluted"), ("default_capture_ceiling", "last_polluted"),
        ("power_of_two", "last_polluted")]
    assert confounds.matches(down(513), predict(SEED)) == []  # 513|514: neither side is a candidate


def test_each_side_of_each_direction_is_matched_with_its_own_relation():
    seed = predict(SEED)
    assert {m["relation"] for m in confounds.matches(down(511), seed) if m["quantity"] == "max_capture_size"} \
        == {"first_clean"}
    assert {m["relation"] for m in confounds.matches(up(512), seed) if m["quantity"] == "max_capture_size"} \
        == {"last_clean"}
    assert {m["relation"] for m in confounds.matches(up(511), seed) if m["quantity"] == "max_capture_size"} \
        == {"first_polluted"}
    report = confounds.transition_report(up(511), seed)
    assert report["text"].startswith("clean->polluted at 511|512: first polluted 512 = resolved max capture size, ")
    assert report["ambiguous"]


def test_an_unresolved_transition_is_never_matched_only_holds_candidates():
    seed = predict(SEED)
    assert confounds.matches(down(510, 513), seed) == []
    assert [c["quantity"] for c in confounds.inside(down(510, 513), seed)] == [
        "max_capture_size", "seqs_x_query_len", "batched_tokens_per_query_len", "default_capture_ceiling"]
    report = confounds.transition_report(down(510, 513), seed)
    assert not report["resolved"] and report["matches"] == [] and not report["ambiguous"]
    assert report["text"] == ("polluted->clean at 510..513 is unresolved: resolved max capture size (512), "
                              "max_num_seqs x (K+1) (512), max_num_batched_tokens / (K+1) (512), vLLM's default "
                              "capture ceiling (512) lie inside 510..513, none is matched exactly")


def test_seed_suggestion_moves_only_the_capture_size():
    report = confounds.confound_report(SEED, predict(SEED), [down(512)], predict)
    assert report["ambiguous"]
    suggestion = report["suggestion"]
    assert suggestion["knob"] == "cudagraph.capture"
    assert suggestion["moves"] == "max_capture_size" and suggestion["relation"] == "last_polluted"
    # 384 rather than 256: not a power of two and not the grid's stride edge.
    assert suggestion["value"] == 384
    assert suggestion["predicted"]["max_capture_size"] == 384
    for other in ("seqs_x_query_len", "batched_tokens_per_query_len"):
        assert suggestion["predicted"][other] == suggestion["baseline"][other] == 512
    assert {"knob": "cudagraph.capture", "value": 256, "moves": "max_capture_size",
            "relation": "last_polluted"} in suggestion["alternatives"]
    assert "a transition at 384|385 (last polluted 384) would mean" in suggestion["text"]


def test_the_suggestion_predicts_the_transition_on_the_matched_side():
    report = confounds.confound_report(SEED, predict(SEED), [down(511)], predict)  # first clean = 512
    assert "a transition at 383|384 (first clean 384) would mean" in report["suggestion"]["text"]


def test_every_suggestion_moves_exactly_one_candidate():
    """Worked out from vLLM's rules by hand, not with derived_quantities: capture=384/256/1024 set the max
    capture size (on the grid, under the 2048 budget) and leave max_num_seqs x 4 = 512; max_num_seqs=96/64/256
    give 384/256/1024 while the default capture stays min(seqs x 4 x 2, 512) = 512; every K moves two
    (K=0: capture 256 and seqs x 1 = 128; K=1: seqs x 2 = 256 and 2048 // 2 = 1024; K=2: 384 and 682)."""
    baseline = predict(SEED)
    found = confounds.matches(down(512), baseline)
    suggestion = confounds.suggest(SEED, baseline, found, predict)
    assert (suggestion["knob"], suggestion["value"], suggestion["moves"]) == ("cudagraph.capture", 384,
                                                                             "max_capture_size")
    assert suggestion["baseline"] == {"max_capture_size": 512, "seqs_x_query_len": 512,
                                      "batched_tokens_per_query_len": 512, "default_capture_ceiling": 512}
    assert suggestion["predicted"] == {"max_capture_size": 384, "seqs_x_query_len": 512,
                                       "batched_tokens_per_query_len": 512, "default_capture_ceiling": 512}
    # ordered: the capture size first, then values that are neither a power of two nor another candidate
    assert [(a["knob"], a["value"], a["moves"]) for a in suggestion["alternatives"]] == [
        ("cudagraph.capture", 256, "max_capture_size"), ("cudagraph.capture", 1024, "max_capture_size"),
        ("sched.max_num_seqs", 96, "seqs_x_query_len"), ("sched.max_num_seqs", 64, "seqs_x_query_len"),
        ("sched.max_num_seqs", 256, "seqs_x_query_len")]
    assert {a["relation"] for a in suggestion["alternatives"]} == {"last_polluted"}
    assert suggestion["text"] == (
        "set cudagraph.capture=384: predicted resolved max capture size 512 -> 384, while max_num_seqs x (K+1) "
        "(512), max_num_batched_tokens / (K+1) (512), vLLM's default capture ceiling (512) stay; a transition at "
        "384|385 (last polluted 384) would mean it tracks the resolved max capture size")


def test_without_the_capture_candidate_a_scheduler_knob_is_suggested():
    found = [{"quantity": q, "relation": "last_polluted", "value": 512}
             for q in ("seqs_x_query_len", "batched_tokens_per_query_len")]
    suggestion = confounds.suggest(SEED, predict(SEED), found, predict)
    assert suggestion["knob"] == "sched.max_num_seqs" and suggestion["moves"] == "seqs_x_query_len"


def test_nothing_to_suggest_without_quantities():
    power = [{"quantity": "power_of_two", "relation": "last_polluted", "value": 512}]
    assert confounds.suggest(SEED, predict(SEED), power, predict) is None
    assert confounds.suggest(SEED, predict(SEED), [], predict) is None


def test_report_without_a_transition():
    report = confounds.confound_report(SEED, predict(SEED), [], predict)
    assert report["coinciding"] == [] and not report["ambiguous"] and report["suggestion"] is None
    assert report["text"] == "no transition, so nothing coincides"


def test_report_of_an_island_reads_each_transition_on_its_own():
    report = confounds.confound_report(SEED, predict(SEED), [up(299), down(400)], predict)
    assert report["text"] == ("clean->polluted at 299|300: no candidate quantity equals 299 or 300; "
                              "polluted->clean at 400|401: no candidate quantity equals 400 or 401")
    assert report["suggestion"] is None and report["coinciding"] == []


# -- claims: what a boundary tracks across runs ----------------------------------------------------

def _run(value, transitions, knob_values, name=None):
    return {"value": value, "name": name or f"v={value}", "transitions": transitions,
            "resolved": predict(knob_values)}


def test_tracks_the_capture_size_on_the_seed_experiment():
    runs = [_run(None, [down(512)], SEED), _run(256, [down(256)], {**SEED, "cudagraph.capture": 256})]
    claim = claims.tracks(runs)
    assert (claim["quantity"], claim["relation"]) == ("max_capture_size", "last_polluted")
    assert claim["values"] == [512, 256]
    assert claim["text"] == ("boundary tracks the resolved max capture size (last polluted = resolved max capture "
                             "size): 512 -> 256 (transitions 512|513 -> 256|257; knob values null -> 256)")
    assert claim["caveat"] and "power of two" in claim["caveat"]
    assert claim["reason"] is None


@pytest.mark.parametrize("make,relation", [(lambda q: down(q - 1), "first_clean"), (lambda q: up(q), "last_clean"),
                                           (lambda q: up(q - 1), "first_polluted")])
def test_tracks_every_relation(make, relation):
    runs = [_run(None, [make(512)], SEED), _run(384, [make(384)], {**SEED, "cudagraph.capture": 384})]
    claim = claims.tracks(runs)
    assert (claim["quantity"], claim["relation"], claim["values"]) == ("max_capture_size", relation, [512, 384])
    assert f"({relation.replace('_', ' ')} = resolved max capture size): 512 -> 384" in claim["text"]


def test_tracks_with_a_non_power_of_two_run_has_no_caveat_and_ignores_clean_runs():
    runs = [
        _run(None, [down(512)], SEED),
        _run(384, [down(384)], {**SEED, "cudagraph.capture": 384}),
        _run(0, [], {**SEED, "cudagraph.enforce_eager": True}),
    ]
    claim = claims.tracks(runs)
    assert claim["quantity"] == "max_capture_size" and claim["caveat"] is None
    assert "1 run without a resolved transition not counted" in claim["text"]


def test_tracks_refuses_a_boundary_that_never_moved():
    runs = [_run(None, [down(512)], SEED), _run(64, [down(512)], {**SEED, "sched.max_num_seqs": 64})]
    claim = claims.tracks(runs)
    assert claim["quantity"] is None and claim["reason"] == "never_moved"
    assert claim["text"].startswith("no claim: the boundary stayed at 512|513 in every run (last polluted = "
                                    "resolved max capture size, ")


def test_tracks_needs_a_run_that_separates_the_quantities():
    k0 = {**SEED, "spec.k": 0}
    assert claims.tracks([_run(3, [down(512)], SEED), _run(0, [down(256)], k0)])["quantity"] == "max_capture_size"
    twins = [_run(128, [down(512)], SEED),
             _run(64, [down(256)], {**SEED, "sched.max_num_seqs": 64, "cudagraph.capture": 256})]
    claim = claims.tracks(twins)
    assert claim["reason"] == "ambiguous"
    assert claim["candidates"] == [{"quantity": "max_capture_size", "relation": "last_polluted"},
                                   {"quantity": "seqs_x_query_len", "relation": "last_polluted"}]


def test_tracks_unexplained_and_too_few():
    runs = [_run(None, [down(500)], SEED), _run(256, [down(250)], {**SEED, "cudagraph.capture": 256})]
    assert claims.tracks(runs)["reason"] == "unexplained"
    assert claims.tracks([_run(None, [down(512)], SEED)])["reason"] == "too_few_boundaries"
    assert claims.tracks([])["reason"] == "too_few_boundaries"


def test_unresolved_runs_make_no_exact_claim_and_say_what_lies_inside():
    runs = [_run(None, [down(510, 513)], SEED, "baseline"),
            _run(256, [down(254, 258)], {**SEED, "cudagraph.capture": 256}, "capture=256")]
    claim = claims.tracks(runs)
    assert claim["quantity"] is None and claim["reason"] == "unresolved"
    assert [u["transition"] for u in claim["unresolved"]] == ["510..513", "254..258"]
    assert claim["text"].startswith("no exact claim: 0 run(s) with a resolved transition, at least 2 are needed")
    assert "baseline 510..513 holds resolved max capture size (512)" in claim["text"]
    assert "resolved max capture size lie(s) inside every unresolved transition: consistent with tracking it, " \
           "not exact" in claim["text"]


def test_runs_that_support_two_claims_conflict_and_the_minimum_reconciles_them():
    # The boundary is min(capture size, max_num_seqs x (K+1)): capture=256 moves it with the capture size,
    # max_num_seqs=64 with max_num_seqs x (K+1), capture=1024 not at all. No single quantity fits all four.
    base = {**SEED, "cudagraph.capture": 512}
    runs = [_run("base", [down(512)], base, "base"),
            _run("c256", [down(256)], {**base, "cudagraph.capture": 256}, "c256"),
            _run("s64", [down(256)], {**base, "sched.max_num_seqs": 64}, "s64"),
            _run("s32", [down(128)], {**base, "sched.max_num_seqs": 32}, "s32"),
            _run("c1024", [down(512)], {**base, "cudagraph.capture": 1024}, "c1024")]
    claim = claims.tracks(runs)
    assert claim["reason"] == "conflict" and claim["quantity"] is None
    said = {(c["quantity"], c["relation"]): c["runs"] for c in claim["conflict"]["claims"]}
    assert said[("max_capture_size", "last_polluted")] == ["base", "c256"]
    assert said[("seqs_x_query_len", "last_polluted")] == ["base", "s64", "s32", "c1024"]
    reconciled = claim["conflict"]["reconciled"]
    assert (reconciled["combine"], reconciled["quantities"]) == ("min", ["max_capture_size", "seqs_x_query_len"])
    assert claim["text"].startswith("conflict: runs base, c256 say last polluted = resolved max capture size; "
                                    "runs base, s64, s32, c1024 say last polluted = max_num_seqs x (K+1)")
    assert ("min(resolved max capture size, max_num_seqs x (K+1)) fits every run (last polluted = it: "
            "512 -> 256 -> 256 -> 128 -> 512): the boundary may track the smaller of the two") in claim["text"]


def _job(name, knob, value, knob_values, transitions):
    """A run as compare.load_run returns it, for analysis.summarize."""
    points = [{"length": L, "nll": 3.0, "nll_ref": 3.0, "polluted": polluted, "polluted_samples": int(polluted)}
              for t in transitions
              for L, polluted in ((t["lo"], t["direction"] == DOWN), (t["hi"], t["direction"] == UP))]
    return {"run_id": name, "name": name, "sweep_id": "s", "parent_run_id": None, "start_time": 0,
            "engine": "synthetic", "knob": knob, "value": value, "status": "ok", "check": {}, "pinned": {},
            "confounded": False, "requested": knob_values, "resolved": predict(knob_values),
            "defaults": {"default_max_num_seqs": 256, "default_runner": "v2", "max_num_batched_tokens": 2048},
            "transitions": transitions, "samples": 1, "probes": 10, "search": {"max_probes": 64, "bisect": True},
            "points": points, "error": None}


def _two_knob_summary() -> dict:
    from oneknob.explain import analysis

    base = {**SEED, "cudagraph.capture": 512, "runner": "v1"}
    runs = [_job("baseline", None, None, base, [down(512)]),
            _job("cudagraph.capture=256", "cudagraph.capture", 256, {**base, "cudagraph.capture": 256}, [down(256)]),
            _job("sched.max_num_seqs=64", "sched.max_num_seqs", 64, {**base, "sched.max_num_seqs": 64}, [down(256)])]
    meta = {"sweep_id": "s", "parent_run_id": None, "sweep_dir": None, "command": None, "run_ids": None}
    return analysis.summarize(meta, runs)


def test_two_knobs_that_claim_different_quantities_are_said_to_conflict():
    summary = _two_knob_summary()
    assert summary["tracks"] == {"cudagraph.capture": "max_capture_size", "sched.max_num_seqs": "seqs_x_query_len"}
    assert summary["tracks_detail"]["cudagraph.capture"]["conflicts_with"] == ["sched.max_num_seqs"]
    assert summary["conflict"]["text"] == (
        "conflict: cudagraph.capture's runs say last polluted = resolved max capture size; sched.max_num_seqs's "
        "runs say last polluted = max_num_seqs x (K+1); no single quantity fits them all; min(resolved max capture "
        "size, max_num_seqs x (K+1)) fits every run (last polluted = it: 512 -> 256 -> 256): the boundary may "
        "track the smaller of the two")
    assert summary["overall"]["reason"] == "conflict"


def test_a_conflict_between_two_knobs_is_in_report_md(tmp_path):  # plots: left out of `make mutate`
    from oneknob.explain import report

    summary = _two_knob_summary()
    report.write(summary, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "(conflicts with sched.max_num_seqs's claim)" in text and f"- {summary['conflict']['text']}\n" in text


def test_inside_counts_both_ends_and_skips_what_a_config_lacks():
    seed = predict(SEED)
    at_lo = [c["quantity"] for c in confounds.inside(down(512, 520), seed)]
    assert at_lo == ["max_capture_size", "seqs_x_query_len", "batched_tokens_per_query_len",
                     "default_capture_ceiling"]
    assert [c["value"] for c in confounds.inside(down(500, 512), seed)] == [512, 512, 512, 512]
    assert confounds.inside(down(513, 600), seed) == []
    eager = predict({**SEED, "cudagraph.enforce_eager": True})  # no capture size, no graph constants
    assert [c["quantity"] for c in confounds.inside(up(1, 600), eager)] == ["seqs_x_query_len",
                                                                            "batched_tokens_per_query_len"]


# -- the suggestion's choices, worked out by hand (mutation testing: docs/MUTATION.md) ---------------------

def test_a_value_that_would_coincide_with_another_candidate_is_tried_last():
    # capture 640, max_num_seqs 120, K=3: 3/4 of 640 is 480 = max_num_seqs x 4; 320 and 1280 coincide with nothing
    base = {"sched.max_num_seqs": 120, "spec.k": 3, "cudagraph.capture": 640}
    found = [{"quantity": "max_capture_size", "relation": "last_polluted", "value": 640}]
    suggestion = confounds.suggest(base, predict(base), found, predict)
    assert (suggestion["knob"], suggestion["value"]) == ("cudagraph.capture", 320)
    assert [(a["knob"], a["value"]) for a in suggestion["alternatives"]] == [("cudagraph.capture", 1280),
                                                                          ("cudagraph.capture", 480)]


def test_values_that_move_two_candidates_are_passed_over_not_the_rest_of_the_knob():
    # K=1, max_num_seqs 128: capture 512, max_num_seqs x 2 = 256. max_num_seqs=96 and 64 move both (the default
    # capture follows max_num_seqs); 256 moves only the product. spec.k=0 moves both; 2 and 3 only the product.
    base = {"sched.max_num_seqs": 128, "spec.k": 1}
    found = [{"quantity": "max_capture_size", "relation": "last_polluted", "value": 512},
             {"quantity": "seqs_x_query_len", "relation": "last_polluted", "value": 256}]
    suggestion = confounds.suggest(base, predict(base), found, predict)
    assert [(a["knob"], a["value"], a["moves"]) for a in suggestion["alternatives"]] == [
        ("cudagraph.capture", 256, "max_capture_size"), ("cudagraph.capture", 1024, "max_capture_size"),
        ("sched.max_num_seqs", 256, "seqs_x_query_len"), ("spec.k", 2, "seqs_x_query_len"),
        ("spec.k", 3, "seqs_x_query_len")]


def test_values_no_engine_would_start_with_or_that_switch_graphs_are_passed_over():
    found = confounds.matches(down(512), predict(SEED))

    def refusing(knob_values):
        if knob_values.get("cudagraph.capture") == 384:
            raise ValueError("no engine starts with this")
        return predict(knob_values)

    def switching(knob_values):
        resolved = predict(knob_values)
        return resolved | {"cudagraph_mode": "NONE"} if knob_values.get("cudagraph.capture") == 384 else resolved

    for other in (refusing, switching):
        suggestion = confounds.suggest(SEED, predict(SEED), found, other)
        assert (suggestion["knob"], suggestion["value"]) == ("cudagraph.capture", 256)
        assert ("cudagraph.capture", 1024) in [(a["knob"], a["value"]) for a in suggestion["alternatives"]]


def test_trial_values_per_knob():
    seed = predict(SEED)
    assert confounds._trial_values("spec.k", SEED, seed) == [0, 1, 2]
    assert confounds._trial_values("spec.k", {}, seed) == [0, 1, 2]  # K from the resolved config
    assert confounds._trial_values("spec.k", {}, {}) == [1, 2, 3]
    assert confounds._trial_values("cudagraph.capture", SEED, seed) == [384, 256, 1024]
    assert confounds._trial_values("sched.max_num_seqs", SEED, seed) == [96, 64, 256]
    # steps of 16 from 256 on: 3/4 of 272 is 204, on the grid 192 (steps of 8 would give 200)
    assert confounds._trial_values("cudagraph.capture", {}, {"max_capture_size": 272}) == [192, 136, 544]
    assert confounds._trial_values("cudagraph.capture", {}, {"max_capture_size": 248}) == [184, 124, 496]
    # without a resolved capture size (CPU), the requested one; without either, nothing
    assert confounds._trial_values("cudagraph.capture", {"cudagraph.capture": 300}, {}) == [224, 150, 600]
    assert confounds._trial_values("cudagraph.capture", {}, {}) == []
    assert confounds._trial_values("sched.max_num_seqs", {}, {"max_num_seqs": 2}) == [1, 4]  # 0 is no value
    assert confounds._trial_values("sched.max_num_seqs", {}, {"max_num_seqs": 1}) == [2]


def test_the_first_transition_with_a_real_candidate_gets_the_suggestion():
    # 64 is only a power of two; 512 is the seed's ambiguous boundary
    report = confounds.confound_report(SEED, predict(SEED), [down(64), down(512)], predict)
    assert report["suggestion"]["value"] == 384
    assert report["text"].startswith("polluted->clean at 64|65: last polluted 64 = a power of two; polluted->clean "
                                     "at 512|513: last polluted 512 = ")
    assert report["text"].endswith("; next: " + report["suggestion"]["text"])
    assert report["coinciding"] == ["power_of_two", "max_capture_size", "seqs_x_query_len",
                                    "batched_tokens_per_query_len", "default_capture_ceiling"]
    assert confounds.confound_report(SEED, predict(SEED), [down(512)], None)["suggestion"] is None
    assert confounds.confound_report(SEED, predict(SEED), [], predict) == {
        "transitions": [], "coinciding": [], "ambiguous": False, "suggestion": None,
        "text": "no transition, so nothing coincides"}


def test_transition_reports_are_whole_records():
    seed = predict(SEED)
    assert confounds.transition_report(down(1024), seed) == {
        "transition": "1024|1025", "direction": "polluted->clean", "resolved": True,
        "matches": [{"quantity": "twice_seqs_x_query_len", "relation": "last_polluted", "value": 1024},
                    {"quantity": "power_of_two", "relation": "last_polluted", "value": 1024}],
        "inside": [], "ambiguous": False,
        "text": "polluted->clean at 1024|1025: last polluted 1024 = 2 x max_num_seqs x (K+1), a power of two"}
    seqs64 = predict({**SEED, "sched.max_num_seqs": 64})  # max_num_seqs x 4 = 256 = the grid's stride edge
    assert confounds.transition_report(down(256), seqs64)["ambiguous"] is True
    assert confounds.transition_report(down(256), seqs64)["text"].endswith("; ambiguous")
    two = confounds.transition_report(down(250, 260), seqs64)
    assert two == {"transition": "250..260", "direction": "polluted->clean", "resolved": False, "matches": [],
                   "inside": [{"quantity": "seqs_x_query_len", "value": 256},
                              {"quantity": "grid_stride_edge", "value": 256}], "ambiguous": False,
                   "text": "polluted->clean at 250..260 is unresolved: max_num_seqs x (K+1) (256), capture-grid "
                           "stride edge (steps of 8 below it, 16 from it) (256) lie inside 250..260, none is "
                           "matched exactly"}
    one = confounds.transition_report(down(1020, 1030), seed)
    assert one["text"] == ("polluted->clean at 1020..1030 is unresolved: 2 x max_num_seqs x (K+1) (1024) lies inside "
                           "1020..1030, none is matched exactly")
    assert confounds.transition_report(up(700, 800), seed)["text"] == (
        "clean->polluted at 700..800 is unresolved: no candidate quantity lies inside 700..800, none is matched "
        "exactly")


def test_matches_on_both_sides_are_one_clause_each():
    resolved = {"max_capture_size": 512, "capture_sizes": [512], "cudagraph_mode": "FULL_AND_PIECEWISE",
                "max_num_seqs": 128, "spec_k": 3, "max_num_batched_tokens": 513}
    found = confounds.matches(down(512), resolved)
    assert confounds.matches_text(found) == ("last polluted 512 = resolved max capture size, max_num_seqs x (K+1), "
                                             "vLLM's default capture ceiling, a power of two; first clean 513 = "
                                             "max_num_batched_tokens")


def test_small_quantities_and_powers_of_two():
    tiny = {"max_capture_size": 1, "capture_sizes": [1], "cudagraph_mode": "FULL_AND_PIECEWISE", "max_num_seqs": 1,
            "spec_k": 1, "max_num_batched_tokens": 9}
    assert confounds.derived_quantities(tiny) == {"max_capture_size": 1, "seqs_x_query_len": 2,
                                                  "twice_seqs_x_query_len": 4, "max_num_batched_tokens": 9,
                                                  "batched_tokens_per_query_len": 4, "default_capture_ceiling": 512,
                                                  "grid_stride_edge": 256}
    assert confounds.derived_quantities(tiny | {"device_capture_ceiling": 1024})["default_capture_ceiling"] == 1024
    assert "max_capture_size" not in confounds.derived_quantities(tiny | {"max_capture_size": 0})
    assert [v for v in range(0, 10) if confounds.is_power_of_two(v)] == [1, 2, 4, 8]
    assert confounds.label("seqs_x_query_len") == "max_num_seqs x (K+1)" and confounds.label("other") == "other"
    assert confounds.predicted_transition("last_polluted", 384) == "384|385"
    assert confounds.predicted_transition("first_clean", 384) == "383|384"
    assert confounds.inside_text([]) == "no candidate quantity"


def test_trial_values_of_k_start_from_the_requested_k():
    # the requested K wins over the resolved one (they differ only in a record made by hand)
    assert confounds._trial_values("spec.k", {"spec.k": 3}, {"spec_k": 1}) == [0, 1, 2]


def test_a_coinciding_model_field_is_moved_by_its_own_override_knob_alone():
    # model.attention_chunk_size 400 = the last polluted length; no engine quantity is 400, so no engine knob
    # moves it: its own knob model.override.attention_chunk_size does, to 3/4 (off the powers of two), 1/2 and 2x
    baseline = predict(SEED) | {"model_quantities": {"model.attention_chunk_size": 400}}
    found = confounds.matches(down(400), baseline)
    assert found == [{"quantity": "model.attention_chunk_size", "relation": "last_polluted", "value": 400}]
    suggestion = confounds.suggest(SEED, baseline, found, predict)
    assert (suggestion["knob"], suggestion["value"], suggestion["moves"]) == (
        "model.override.attention_chunk_size", 300, "model.attention_chunk_size")
    assert suggestion["baseline"] == {"model.attention_chunk_size": 400}
    assert suggestion["predicted"] == {"model.attention_chunk_size": 300}
    assert [(a["knob"], a["value"]) for a in suggestion["alternatives"]] == [
        ("model.override.attention_chunk_size", 200), ("model.override.attention_chunk_size", 800)]
    assert suggestion["text"] == (
        "set model.override.attention_chunk_size=300: predicted model.attention_chunk_size 400 -> 300; a transition "
        "at 300|301 (last polluted 300) would mean it tracks the model.attention_chunk_size")


def test_moving_the_capture_size_is_preferred_to_a_model_field_whichever_knob_moves_it():
    # max_num_seqs 32, K=3: the default capture size is min(32 x 4 x 2, 512) = 256 = the model field. With no
    # cudagraph.capture value accepted, max_num_seqs=24 moves the capture size alone (to 192): it comes before the
    # model field's own knob although that knob ranks before the scheduler's
    base = {"sched.max_num_seqs": 32, "spec.k": 3}
    baseline = predict(base) | {"model_quantities": {"model.attention_chunk_size": 256}}
    found = [{"quantity": q, "relation": "last_polluted", "value": 256}
             for q in ("max_capture_size", "model.attention_chunk_size")]

    def refusing_capture(knob_values):
        if "cudagraph.capture" in knob_values:
            raise ValueError("no engine starts with this capture size")
        return predict(knob_values)

    suggestion = confounds.suggest(base, baseline, found, refusing_capture)
    assert (suggestion["knob"], suggestion["value"], suggestion["moves"]) == ("sched.max_num_seqs", 24,
                                                                             "max_capture_size")
    assert suggestion["predicted"] == {"max_capture_size": 192, "model.attention_chunk_size": 256}
    assert [(a["knob"], a["value"]) for a in suggestion["alternatives"]][-3:] == [
        ("model.override.attention_chunk_size", 192), ("model.override.attention_chunk_size", 128),
        ("model.override.attention_chunk_size", 512)]


def test_trial_values_of_a_model_field():
    def values(base):
        resolved = {"model_quantities": {"model.attention_chunk_size": base}} if base is not None else {}
        return confounds._trial_values("model.override.attention_chunk_size", {}, resolved)

    assert values(400) == [300, 200, 800]
    assert values(6) == [4, 3, 12]  # integer values: 3/4 and 1/2 floored
    assert values(7) == [5, 3, 14]
    assert values(3) == [2, 6]  # 1 is no length to move a field to
    assert values(2) == [4]
    assert values(None) == []  # a field the model does not have: nothing to try
    other = {"model_quantities": {"model.sliding_window": 400}}
    assert confounds._trial_values("model.override.attention_chunk_size", {}, other) == []
