"""What a boundary tracks across runs (claims.py), in process: every reason for no claim, the notes, the
conflict and its reconciliation by min or max. Resolved configs are vLLM 0.33's rules on a 2048-token budget;
the quantities in the comments are worked out from README's definitions (K=3: max_num_seqs x 4)."""

from __future__ import annotations

import functools

from oneknob.explain import claims
from oneknob.config import resolution

SEED = {"sched.max_num_seqs": 128, "spec.k": 3}
predict = functools.partial(resolution.predict, max_num_batched_tokens=2048)


def down(lo: int, hi: int | None = None) -> dict:
    hi = lo + 1 if hi is None else hi
    return {"lo": lo, "hi": hi, "direction": "polluted->clean", "resolved": hi == lo + 1}


def up(lo: int, hi: int | None = None) -> dict:
    hi = lo + 1 if hi is None else hi
    return {"lo": lo, "hi": hi, "direction": "clean->polluted", "resolved": hi == lo + 1}


def run(value, transitions, knob_values, name=None) -> dict:
    found = {"value": value, "transitions": transitions, "resolved": predict(knob_values)}
    return found | ({"name": name} if name else {})


def test_a_claim_counts_only_runs_with_a_resolved_transition_and_says_how_many_it_left_out():
    runs = [run(None, [down(512)], SEED), run(384, [down(384)], {**SEED, "cudagraph.capture": 384}),
            run(0, [], SEED), run(1, [], SEED)]
    claim = claims.tracks(runs)
    assert (claim["quantity"], claim["relation"], claim["label"]) == ("max_capture_size", "last_polluted",
                                                                      "resolved max capture size")
    assert (claim["values"], claim["boundaries"], claim["knob_values"]) == ([512, 384], ["512|513", "384|385"],
                                                                           [None, 384])
    assert claim["candidates"] == [{"quantity": "max_capture_size", "relation": "last_polluted"}]
    assert (claim["reason"], claim["caveat"], claim["conflict"], claim["unresolved"]) == (None, None, None, [])
    assert claim["text"] == ("boundary tracks the resolved max capture size (last polluted = resolved max capture "
                             "size): 512 -> 384 (transitions 512|513 -> 384|385; knob values null -> 384) (2 runs "
                             "without a resolved transition not counted)")


def test_every_boundary_a_power_of_two_carries_the_caveat():
    runs = [run(None, [down(512)], SEED), run(256, [down(256)], {**SEED, "cudagraph.capture": 256})]
    assert claims.tracks(runs)["caveat"] == ("every boundary is also a power of two; a run whose predicted value is "
                                             "not a power of two would rule out a power-of-two origin")


def test_a_quantity_that_fits_every_run_but_never_moves_is_no_claim():
    # 256 is the capture grid's stride edge in both runs; the other transition matches nothing
    runs = [run(None, [down(256), down(500)], SEED),
            run(384, [down(256), down(600)], {**SEED, "cudagraph.capture": 384})]
    claim = claims.tracks(runs)
    assert (claim["quantity"], claim["reason"]) == (None, "unexplained")
    assert claim["candidates"] == [{"quantity": "grid_stride_edge", "relation": "last_polluted"}]
    assert claim["text"] == ("no single candidate quantity fits the boundary 256|257, 500|501 -> 256|257, 600|601 in "
                             "every run; last polluted = capture-grid stride edge (steps of 8 below it, 16 from it) "
                             "fits every run but never moves")


def test_a_quantity_that_fits_only_some_runs_is_named_with_them():
    runs = [run(None, [down(512)], SEED, "a"), run(256, [down(256)], {**SEED, "cudagraph.capture": 256}, "b"),
            run(128, [down(100)], {**SEED, "cudagraph.capture": 128}, "c")]
    claim = claims.tracks(runs)
    assert claim["reason"] == "unexplained" and claim["conflict"] is None
    assert claim["text"] == ("no single candidate quantity fits the boundary 512|513 -> 256|257 -> 100|101 in every "
                             "run; last polluted = resolved max capture size fits only a, b")


def test_one_resolved_run_and_one_unresolved_is_no_exact_claim():
    runs = [run(None, [down(510, 513)], SEED, "base"), run(2, [down(256)], {**SEED, "cudagraph.capture": 256})]
    claim = claims.tracks(runs)
    assert (claim["quantity"], claim["reason"]) == (None, "unresolved")
    assert claim["unresolved"] == [{"run": "base", "transition": "510..513",
                                    "inside": ["max_capture_size", "seqs_x_query_len", "batched_tokens_per_query_len",
                                               "default_capture_ceiling"],
                                    "text": "resolved max capture size (512), max_num_seqs x (K+1) (512), "
                                            "max_num_batched_tokens / (K+1) (512), vLLM's default capture ceiling "
                                            "(512)"}]
    assert claim["text"] == (
        "no exact claim: 1 run(s) with a resolved transition, at least 2 are needed (1 run without a resolved "
        "transition not counted); unresolved, so never matched exactly: base 510..513 holds resolved max capture "
        "size (512), max_num_seqs x (K+1) (512), max_num_batched_tokens / (K+1) (512), vLLM's default capture "
        "ceiling (512)")


def test_an_unnamed_run_is_named_by_its_value_and_one_unresolved_run_claims_nothing_inside():
    (found,) = claims.tracks([run(7, [up(100, 140)], SEED)])["unresolved"]
    assert (found["run"], found["transition"], found["inside"], found["text"]) == ("7", "100..140", [],
                                                                                   "no candidate quantity")
    single = claims.tracks([run(None, [down(510, 513)], SEED, "base")])
    assert "lie(s) inside every unresolved transition" not in single["text"]  # needs two unresolved runs


def test_a_boundary_that_stayed_without_any_candidate():
    runs = [run(None, [down(300)], SEED), run(2, [down(300)], {**SEED, "sched.max_num_seqs": 64})]
    claim = claims.tracks(runs)
    assert claim["reason"] == "never_moved"
    assert claim["text"] == "no claim: the boundary stayed at 300|301 in every run (no candidate)"


def test_conflicting_runs_that_neither_min_nor_max_reconciles():
    runs = [run("a", [down(512)], {**SEED, "cudagraph.capture": 512}, "a"),
            run("b", [down(256)], {**SEED, "cudagraph.capture": 256}, "b"),
            run("c", [down(256)], {**SEED, "sched.max_num_seqs": 64}, "c"),
            run("d", [down(100)], {**SEED, "sched.max_num_seqs": 32}, "d")]
    claim = claims.tracks(runs)
    assert claim["reason"] == "conflict"
    assert claim["conflict"] == {"claims": [
        {"quantity": "max_capture_size", "relation": "last_polluted", "runs": ["a", "b"]},
        {"quantity": "seqs_x_query_len", "relation": "last_polluted", "runs": ["a", "c"]}], "reconciled": None}
    assert claim["text"] == ("conflict: runs a, b say last polluted = resolved max capture size; runs a, c say last "
                             "polluted = max_num_seqs x (K+1); no single quantity fits every run; neither the min "
                             "nor the max of two of them fits every run either")


def test_the_maximum_of_two_quantities_reconciles_runs_the_minimum_does_not():
    # boundary = max(capture, max_num_seqs x 4): 512|512, 1024|512, 256|1024, 128|256
    runs = [run("A", [down(512)], {**SEED, "cudagraph.capture": 512}, "A"),
            run("B", [down(1024)], {**SEED, "cudagraph.capture": 1024}, "B"),
            run("C", [down(1024)], {**SEED, "cudagraph.capture": 256, "sched.max_num_seqs": 256}, "C"),
            run("D", [down(256)], {**SEED, "cudagraph.capture": 128, "sched.max_num_seqs": 64}, "D")]
    claim = claims.tracks(runs)
    assert claim["reason"] == "conflict"
    assert claim["conflict"]["reconciled"] == {
        "combine": "max", "quantities": ["max_capture_size", "seqs_x_query_len"], "relation": "last_polluted",
        "values": [512, 1024, 1024, 256],
        "text": "max(resolved max capture size, max_num_seqs x (K+1)) fits every run (last polluted = it: 512 -> "
                "1024 -> 1024 -> 256): the boundary may track the larger of the two"}


def test_reconcile_skips_pairs_of_another_relation_and_quantities_a_run_lacks():
    runs = [run("A", [down(512)], SEED), run("B", [down(256)], {**SEED, "cudagraph.capture": 256})]
    assert claims.reconcile(runs, [("max_capture_size", "last_polluted"), ("seqs_x_query_len", "first_clean")]) \
        is None
    assert claims.reconcile(runs, [("max_capture_size", "last_polluted"), ("max_capture_size", "last_polluted")]) \
        is None
    eager = [run("E", [down(512)], {**SEED, "cudagraph.enforce_eager": True}), *runs]  # no capture size there
    assert claims.reconcile(eager, [("max_capture_size", "last_polluted"), ("seqs_x_query_len", "last_polluted")]) \
        is None
    # min(512, 512) = 512 and min(256, 512) = 256 fit: the first combiner that fits is named
    assert claims.reconcile(runs, [("max_capture_size", "last_polluted"),
                                   ("seqs_x_query_len", "last_polluted")])["combine"] == "min"


def test_fits_reads_only_resolved_transitions_on_the_named_side():
    found = {"transitions": [down(512), up(600, 700)]}
    assert claims.fits(found, "last_polluted", 512) and claims.fits(found, "first_clean", 513)
    assert not claims.fits(found, "last_polluted", 513) and not claims.fits(found, "last_clean", 600)
    assert not claims.fits({"transitions": []}, "last_polluted", 512)


def test_the_small_texts():
    assert claims._arrow([None, 256, "v2"]) == "null -> 256 -> v2"
    assert claims._claims_text([("max_capture_size", "last_polluted"), ("seqs_x_query_len", "last_polluted"),
                                ("grid_stride_edge", "first_clean")]) == (
        "last polluted = resolved max capture size, max_num_seqs x (K+1); first clean = capture-grid stride edge "
        "(steps of 8 below it, 16 from it)")
    assert claims._transitions_text({"transitions": [up(299), down(400, 410)]}) == "299|300, 400..410"
    assert claims._transitions_text({"transitions": []}) == "none"
    assert claims._matched(run(None, [down(512)], SEED)) == {
        ("max_capture_size", "last_polluted"): 512, ("seqs_x_query_len", "last_polluted"): 512,
        ("batched_tokens_per_query_len", "last_polluted"): 512, ("default_capture_ceiling", "last_polluted"): 512}


def test_one_quantity_on_two_sides_in_different_runs_is_unexplained_and_both_are_named():
    # capture 512 and 256 are the last clean length in a and b, capture 384 and 128 the first clean in c and d
    runs = [run("a", [up(512)], {**SEED, "cudagraph.capture": 512}, "a"),
            run("b", [up(256)], {**SEED, "cudagraph.capture": 256}, "b"),
            run("c", [down(383)], {**SEED, "cudagraph.capture": 384}, "c"),
            run("d", [down(127)], {**SEED, "cudagraph.capture": 128}, "d")]
    claim = claims.tracks(runs)
    assert claim["reason"] == "unexplained"
    assert claim["text"] == ("no single candidate quantity fits the boundary 512|513 -> 256|257 -> 383|384 -> "
                             "127|128 in every run; first clean = resolved max capture size fits only c, d; last "
                             "clean = resolved max capture size fits only a, b")


def test_first_polluted_and_unnamed_runs_in_a_conflict():
    # capture 512/256 are the first polluted length; max_num_seqs x 4 = 256/128 the last polluted: two quantities
    runs = [run(1, [up(511)], {**SEED, "cudagraph.capture": 512}),
            run(2, [up(255)], {**SEED, "cudagraph.capture": 256}),
            run(3, [down(256)], {**SEED, "cudagraph.capture": 512, "sched.max_num_seqs": 64}),
            run(4, [down(128)], {**SEED, "cudagraph.capture": 512, "sched.max_num_seqs": 32})]
    claim = claims.tracks(runs)
    assert claim["reason"] == "conflict"
    assert claim["conflict"]["claims"] == [
        {"quantity": "max_capture_size", "relation": "first_polluted", "runs": ["1", "2"]},
        {"quantity": "seqs_x_query_len", "relation": "last_polluted", "runs": ["3", "4"]}]


def test_reconcile_goes_on_past_pairs_it_cannot_combine():
    # b runs with K=0: max_num_batched_tokens / (K+1) is no candidate there, so pairs with it are passed over
    runs = [run("a", [down(512)], {**SEED, "cudagraph.capture": 512}),
            run("b", [down(256)], {**SEED, "spec.k": 0, "cudagraph.capture": 256})]
    found = claims.reconcile(runs, [("batched_tokens_per_query_len", "last_polluted"),
                                    ("grid_stride_edge", "first_clean"),
                                    ("max_capture_size", "last_polluted"),
                                    ("twice_seqs_x_query_len", "last_polluted")])
    # min(capture, 2 x max_num_seqs x (K+1)): a min(512, 1024) = 512, b min(256, 256) = 256
    assert (found["combine"], found["quantities"], found["values"]) == (
        "min", ["max_capture_size", "twice_seqs_x_query_len"], [512, 256])


def test_a_record_with_no_claim_has_every_field():
    assert claims.tracks([]) == {
        "quantity": None, "relation": None, "label": None, "values": [], "boundaries": [], "knob_values": [],
        "candidates": [], "reason": "too_few_boundaries", "caveat": None, "unresolved": [], "conflict": None,
        "text": "no exact claim: 0 run(s) with a resolved transition, at least 2 are needed"}


def test_an_ambiguous_claim_names_every_quantity_that_fits():
    twins = [run(128, [down(512)], SEED),
             run(64, [down(256)], {**SEED, "sched.max_num_seqs": 64, "cudagraph.capture": 256})]
    assert claims.tracks(twins)["text"] == (
        "ambiguous: in every run the boundary (512|513 -> 256|257) fits each of last polluted = resolved max capture "
        "size, max_num_seqs x (K+1)")


def test_every_static_quantity_is_named():
    # 256 (the stride edge) and 512 (max_num_seqs x 4, its share of the budget, the ceiling) in both runs
    runs = [run(384, [down(256), down(511), down(600)], {**SEED, "cudagraph.capture": 384}),
            run(320, [down(256), down(511), down(700)], {**SEED, "cudagraph.capture": 320})]
    claim = claims.tracks(runs)
    assert claim["reason"] == "unexplained"
    assert claim["text"] == (
        "no single candidate quantity fits the boundary 256|257, 511|512, 600|601 -> 256|257, 511|512, 700|701 in "
        "every run; first clean = max_num_seqs x (K+1) fits every run but never moves; first clean = "
        "max_num_batched_tokens / (K+1) fits every run but never moves; first clean = vLLM's default capture ceiling "
        "fits every run but never moves; last polluted = capture-grid stride edge (steps of 8 below it, 16 from it) "
        "fits every run but never moves")


def test_two_unresolved_runs_name_every_candidate_they_share():
    runs = [run(None, [down(510, 513)], SEED, "base"),
            run(64, [down(250, 260)], {**SEED, "cudagraph.capture": 256, "sched.max_num_seqs": 64}, "small")]
    assert claims.tracks(runs)["text"] == (
        "no exact claim: 0 run(s) with a resolved transition, at least 2 are needed (2 runs without a resolved "
        "transition not counted); unresolved, so never matched exactly: base 510..513 holds resolved max capture "
        "size (512), max_num_seqs x (K+1) (512), max_num_batched_tokens / (K+1) (512), vLLM's default capture "
        "ceiling (512); small 250..260 holds resolved max capture size (256), max_num_seqs x (K+1) (256), "
        "capture-grid stride edge (steps of 8 below it, 16 from it) (256); resolved max capture size, max_num_seqs "
        "x (K+1) lie(s) inside every unresolved transition: consistent with tracking it, not exact")


# -- the model's own thresholds (model.<path>) (mutation testing: docs/MUTATION.md) ------------------------

def model_run(value, transitions, knob_values, model_quantities, name=None) -> dict:
    found = run(value, transitions, knob_values, name)
    found["resolved"] = found["resolved"] | {"model_quantities": model_quantities}
    return found


MODEL = {"model.sliding_window": 701, "model.attention_chunk": 700}


def test_one_resolved_run_at_the_models_threshold_coincides_with_it():
    runs = [model_run(None, [down(700)], SEED, MODEL), model_run(1, [], SEED, MODEL)]
    assert claims.model_claims(runs[0]) == [("model.attention_chunk", "last_polluted"),
                                            ("model.sliding_window", "first_clean")]
    assert claims.model_claims(run(None, [down(512)], SEED)) == []
    claim = claims.tracks(runs)
    assert (claim["quantity"], claim["relation"], claim["label"], claim["values"], claim["reason"]) == (
        "model.attention_chunk", "last_polluted", "model.attention_chunk", [700], "model_threshold")
    assert claim["text"] == ("the transition 700|701 coincides with the model's own threshold (last polluted = "
                             "model.attention_chunk; first clean = model.sliding_window, from its config.json); only "
                             "a run that moves it (model.override.attention_chunk) can tell whether it tracks it "
                             "(1 run without a resolved transition not counted)")


def test_a_boundary_that_stayed_at_the_models_threshold_coincides_with_it():
    mq = {"model.a": 700, "model.b": 701}
    runs = [model_run(None, [down(700)], SEED, mq),
            model_run(384, [down(700)], {**SEED, "cudagraph.capture": 384}, mq)]
    claim = claims.tracks(runs)
    assert (claim["quantity"], claim["relation"], claim["label"], claim["values"], claim["reason"]) == (
        "model.a", "last_polluted", "model.a", [700, 700], "model_threshold")
    # the candidates in rank order (by quantity, not by relation)
    assert claim["candidates"] == [{"quantity": "model.a", "relation": "last_polluted"},
                                   {"quantity": "model.b", "relation": "first_clean"}]
    assert claim["text"] == ("the boundary stayed at 700|701 in every run, where it coincides with the model's own "
                             "threshold (last polluted = model.a; first clean = model.b, from its config.json; none "
                             "of these runs moved it; also last polluted = model.a; first clean = model.b)")


def test_partial_claims_list_the_engines_quantities_before_the_models():
    runs = [model_run("a", [down(300)], SEED, {"model.z": 300}, "a"),
            model_run("b", [down(400)], SEED, {"model.z": 400}, "b"),
            model_run("c", [down(640)], {**SEED, "sched.max_num_seqs": 160}, {}, "c"),
            model_run("d", [down(576)], {**SEED, "sched.max_num_seqs": 144}, {}, "d")]
    claim = claims.tracks(runs)
    assert claim["conflict"] == {"claims": [
        {"quantity": "seqs_x_query_len", "relation": "last_polluted", "runs": ["c", "d"]},
        {"quantity": "model.z", "relation": "last_polluted", "runs": ["a", "b"]}], "reconciled": None}
