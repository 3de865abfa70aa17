"""Confounds on the seed study: 512 is three quantities at once until capture moves alone."""

from __future__ import annotations

import functools

from oneknob import confounds, resolution

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


def test_seed_boundary_is_ambiguous():
    found = confounds.coinciding(512, predict(SEED))
    assert {"max_capture_size", "seqs_x_query_len", "batched_tokens_per_query_len"} <= set(found)
    assert found[0] == "max_capture_size"
    assert "power_of_two" in found
    assert confounds.coinciding(513, predict(SEED)) == []


def test_seed_suggestion_moves_only_the_capture_size():
    report = confounds.confound_report(SEED, predict(SEED), 512, predict)
    assert report["ambiguous"]
    suggestion = report["suggestion"]
    assert suggestion["knob"] == "cudagraph.capture"
    assert suggestion["moves"] == "max_capture_size"
    # 384 rather than 256: not a power of two and not the grid's stride edge.
    assert suggestion["value"] == 384
    assert suggestion["predicted"]["max_capture_size"] == 384
    for other in ("seqs_x_query_len", "batched_tokens_per_query_len"):
        assert suggestion["predicted"][other] == suggestion["baseline"][other] == 512
    assert {"knob": "cudagraph.capture", "value": 256, "moves": "max_capture_size"} in suggestion[
        "alternatives"
    ]
    assert "384|385" in suggestion["text"]


def test_every_suggestion_moves_exactly_one_candidate():
    baseline = predict(SEED)
    found = confounds.coinciding(512, baseline)
    suggestion = confounds.suggest(SEED, baseline, found, predict)
    for trial in [suggestion, *suggestion["alternatives"]]:
        before = confounds.derived_quantities(baseline)
        after = confounds.derived_quantities(predict({**SEED, trial["knob"]: trial["value"]}))
        moved = [c for c in found if c != "power_of_two" and before.get(c) != after.get(c)]
        assert moved == [trial["moves"]]


def test_without_the_capture_candidate_a_scheduler_knob_is_suggested():
    suggestion = confounds.suggest(
        SEED, predict(SEED), ["seqs_x_query_len", "batched_tokens_per_query_len"], predict
    )
    assert suggestion["knob"] == "sched.max_num_seqs" and suggestion["moves"] == "seqs_x_query_len"


def test_nothing_to_suggest_without_quantities():
    assert confounds.suggest(SEED, predict(SEED), ["power_of_two"], predict) is None
    assert confounds.suggest(SEED, predict(SEED), [], predict) is None


def _run(value, last_polluted, knob_values):
    return {"value": value, "last_polluted": last_polluted, "resolved": predict(knob_values)}


def test_tracks_the_capture_size_on_the_seed_experiment():
    runs = [_run(None, 512, SEED), _run(256, 256, {**SEED, "cudagraph.capture": 256})]
    claim = confounds.tracks(runs)
    assert claim["quantity"] == "max_capture_size"
    assert claim["values"] == [512, 256]
    assert claim["text"].startswith("boundary tracks the resolved max capture size: 512 -> 256")
    assert claim["caveat"] and "power of two" in claim["caveat"]
    assert claim["reason"] is None


def test_tracks_with_a_non_power_of_two_run_has_no_caveat_and_ignores_clean_runs():
    runs = [
        _run(None, 512, SEED),
        _run(384, 384, {**SEED, "cudagraph.capture": 384}),
        _run(0, None, {**SEED, "cudagraph.enforce_eager": True}),
    ]
    claim = confounds.tracks(runs)
    assert claim["quantity"] == "max_capture_size" and claim["caveat"] is None
    assert "1 run without a boundary not counted" in claim["text"]


def test_tracks_refuses_a_boundary_that_never_moved():
    runs = [_run(None, 512, SEED), _run(64, 512, {**SEED, "sched.max_num_seqs": 64})]
    claim = confounds.tracks(runs)
    assert claim["quantity"] is None and claim["reason"] == "never_moved"
    assert "stayed at 512" in claim["text"]


def test_tracks_needs_a_run_that_separates_the_quantities():
    # K 3 -> 0 moves capture (512 -> 256) and max_num_seqs x (K+1) (512 -> 128):
    # a boundary at 128 would match only one, at 256 only capture.
    k0 = {**SEED, "spec.k": 0}
    runs = [_run(3, 512, SEED), _run(0, 256, k0)]
    assert confounds.tracks(runs)["quantity"] == "max_capture_size"
    both = [_run(3, 512, SEED), _run(None, 512, SEED)]
    assert confounds.tracks(both)["reason"] == "never_moved"
    twins = [
        _run(128, 512, SEED),
        _run(64, 256, {**SEED, "sched.max_num_seqs": 64, "cudagraph.capture": 256}),
    ]
    claim = confounds.tracks(twins)
    assert claim["reason"] == "ambiguous"
    assert set(claim["candidates"]) == {"max_capture_size", "seqs_x_query_len"}


def test_tracks_unexplained_and_too_few():
    runs = [_run(None, 500, SEED), _run(256, 250, {**SEED, "cudagraph.capture": 256})]
    assert confounds.tracks(runs)["reason"] == "unexplained"
    assert confounds.tracks([_run(None, 512, SEED)])["reason"] == "too_few_boundaries"
    assert confounds.tracks([])["reason"] == "too_few_boundaries"


def test_report_without_a_boundary():
    report = confounds.confound_report(SEED, predict(SEED), None, predict)
    assert report["coinciding"] == [] and not report["ambiguous"] and report["suggestion"] is None
