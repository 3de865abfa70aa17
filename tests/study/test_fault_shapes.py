"""Verdicts that hold for any fault shape, through the CLI on the synthetic engine (engine.fault.*).

Each shape a real engine bug can have - polluted above an edge, first clean at it, an island, another
quantity as the edge, a shift just over tolerance, one sample of several - is configured, run as a sweep,
and checked where a user looks: summary.json, report.md and the MLflow runs. Plus the verdict rule itself,
absolute mode, a reference that checks itself, and the engine's recorded defaults in the notes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from helpers import metric_steps, mlflow_client, mlflow_runs, run_cli, worker_records

from oneknob.config.schema import VerdictConfig
from oneknob.verdict.judge import judge, tolerance_edge, verdict_of

LENGTHS = "lengths=[128,256,384,512,640,768,1024]"
DOWN, UP = "polluted->clean", "clean->polluted"
WORDS = ("the engine reads a prompt and scores every token of it with the model while the scheduler "
         "batches requests into steps and the graph replays a captured shape when the step fits").split()


def sweep(tmp_path, *overrides: str, rc: int = 0) -> dict:
    code, out = run_cli(tmp_path, *overrides, multirun=True)
    assert code == rc, out
    (path,) = Path(tmp_path).glob("multirun/*/summary.json")
    summary = json.loads(path.read_text())
    jobs = {r.info.run_name: r for r in mlflow_runs(tmp_path, role="job")}
    return {"out": out, "summary": summary, "runs": {r["name"]: r for r in summary["runs"]},
            "report": (path.parent / "report.md").read_text(), "jobs": jobs}


def pairs(run: dict) -> list[tuple]:
    return [(t["lo"], t["hi"], t["direction"], t["resolved"]) for t in run["transitions"]]


def first_transition(job) -> tuple:
    m = job.data.metrics
    return m["boundary_lo"], m["boundary_hi"], m["boundary_direction"], m["boundary_resolved"], m["transitions"]


def corpus(tmp_path, samples: int = 3, tokens: int = 1100) -> list[str]:
    """A corpus whose samples start with SAMPLE0, SAMPLE1, ... (byte tokens: one character each)."""
    text = ""
    for i in range(samples):
        rng = random.Random(i)
        body = " ".join(rng.choice(WORDS) for _ in range(tokens))
        text += (f"SAMPLE{i} " + body)[:tokens]
    path = Path(tmp_path) / "corpus.txt"
    path.write_text(text)
    return [f"corpus.path={path}", f"corpus.sample_tokens={tokens}", f"samples={samples}"]


# -- shapes ---------------------------------------------------------------------------------------------

def test_polluted_above_the_capture_size_is_clean_to_polluted_and_tracked_as_last_clean(tmp_path):
    found = sweep(tmp_path, "cudagraph.capture=null,256", "engine.fault.side=gt", LENGTHS)
    runs, jobs = found["runs"], found["jobs"]
    assert pairs(runs["baseline"]) == [(512, 513, UP, True)]
    assert pairs(runs["cudagraph.capture=256"]) == [(256, 257, UP, True)]
    assert first_transition(jobs["baseline"]) == (512, 513, -1, 1, 1)
    assert first_transition(jobs["cudagraph.capture=256"]) == (256, 257, -1, 1, 1)
    assert "boundary_last_polluted" not in jobs["baseline"].data.metrics  # it would not be true here
    detail = found["summary"]["tracks_detail"]["cudagraph.capture"]
    assert (detail["quantity"], detail["relation"], detail["values"]) == ("max_capture_size", "last_clean", [512, 256])
    assert ("- cudagraph.capture=256 moved it to 256|257; the boundary tracks the resolved max capture size in these "
            "runs (last clean = it: 512 -> 256)\n") in found["report"]
    assert "- baseline: clean->polluted at 512|513 (last clean 512, first polluted 513)\n" in found["report"]
    assert "| 512\\|513 c->p |" in found["report"]
    confound = found["summary"]["confounds"]["transitions"][0]
    assert ("max_capture_size", "last_clean") in {(m["quantity"], m["relation"]) for m in confound["matches"]}
    assert runs["baseline"]["nll_polluted"] > runs["baseline"]["nll_clean"] + 5  # by verdict, not by side


def test_first_clean_at_the_capture_size_is_tracked_as_first_clean(tmp_path):
    found = sweep(tmp_path, "cudagraph.capture=null,256", "engine.fault.side=lt", LENGTHS)
    assert pairs(found["runs"]["baseline"]) == [(511, 512, DOWN, True)]
    assert pairs(found["runs"]["cudagraph.capture=256"]) == [(255, 256, DOWN, True)]
    assert found["summary"]["tracks"] == {"cudagraph.capture": "max_capture_size"}
    assert ("cudagraph.capture=256 moved it to 255|256; the boundary tracks the resolved max capture size in these "
            "runs (first clean = it: 512 -> 256)") in found["report"]
    assert ("next experiment: none needed: the runs of this sweep already tested it (511|512 tracks the resolved max "
            "capture size") in found["report"] and "383|384" not in found["report"]  # capture=256 was that run
    assert found["jobs"]["baseline"].data.metrics["boundary_last_polluted"] == 511  # the seed's shape: true


def test_an_island_is_two_transitions_of_the_baseline_and_is_called_non_monotone(tmp_path):
    found = sweep(tmp_path, "cudagraph.capture=null,256", "engine.fault.edge=null", "engine.fault.islands=[[300,400]]",
                  LENGTHS)
    baseline = found["runs"]["baseline"]
    assert pairs(baseline) == [(299, 300, UP, True), (400, 401, DOWN, True)]
    assert first_transition(found["jobs"]["baseline"]) == (299, 300, -1, 1, 2)
    shape = ("non-monotone: 2 transitions (clean->polluted at 299|300, polluted->clean at 400|401); "
             "polluted at 300..400")
    assert baseline["shape"] == shape and f"baseline: {shape}" in found["summary"]["notes"]
    assert (f"- baseline: {shape}\n  - clean->polluted at 299|300 (last clean 299, first polluted 300)\n"
            "  - polluted->clean at 400|401 (last polluted 400, first clean 401)\n") in found["report"]
    assert found["summary"]["confounds"]["text"] == ("clean->polluted at 299|300: no candidate quantity equals 299 "
                                                     "or 300; polluted->clean at 400|401: no candidate quantity "
                                                     "equals 400 or 401")
    assert found["summary"]["tracks_detail"]["cudagraph.capture"]["reason"] == "never_moved"


def test_a_small_probe_budget_leaves_unresolved_transitions_and_no_exact_claim(tmp_path):
    # search.suspects=false: the suspect probes at 512/513 and 256/257 would resolve both transitions at once
    found = sweep(tmp_path, "cudagraph.capture=null,256", "search.max_probes=13", "search.suspects=false", LENGTHS)
    runs = found["runs"]
    assert pairs(runs["baseline"]) == [(512, 514, DOWN, False)]
    assert pairs(runs["cudagraph.capture=256"]) == [(256, 258, DOWN, False)]
    assert first_transition(found["jobs"]["baseline"]) == (512, 514, 1, 0, 1)
    assert "boundary_last_polluted" not in found["jobs"]["baseline"].data.metrics
    detail = found["summary"]["tracks_detail"]["cudagraph.capture"]
    assert detail["quantity"] is None and detail["reason"] == "unresolved"
    assert "resolved max capture size lie(s) inside every unresolved transition: consistent with tracking it, " \
           "not exact" in detail["text"]
    assert found["summary"]["confounds"]["text"] == (
        "polluted->clean at 512..514 is unresolved: resolved max capture size (512), max_num_seqs x (K+1) (512), "
        "max_num_batched_tokens / (K+1) (512), vLLM's default capture ceiling (512) lie inside 512..514, none is "
        "matched exactly")
    budget = ("the probe budget ran out (search.max_probes=13, 13 probes) before 512..514 narrowed to adjacent "
              "lengths: raise it, e.g. search.max_probes=14")
    assert f"  - unresolved: {budget}\n" in found["report"] and f"baseline: {budget}" in found["summary"]["notes"]
    assert "| 512..514 p->c (unresolved) |" in found["report"]
    assert "boundary tracks the" not in found["report"]


def test_an_edge_at_max_num_seqs_times_query_len_is_tracked_to_it(tmp_path):
    found = sweep(tmp_path, "engine.fault.edge=seqs_x_query_len", "sched.max_num_seqs=128,64", LENGTHS)
    assert pairs(found["runs"]["baseline"]) == [(512, 513, DOWN, True)]
    assert pairs(found["runs"]["sched.max_num_seqs=64"]) == [(256, 257, DOWN, True)]
    assert found["runs"]["sched.max_num_seqs=64"]["resolved"]["max_capture_size"] == 512  # capture stayed
    assert ("sched.max_num_seqs=64 moved it to 256|257; the boundary tracks max_num_seqs x (K+1) in these runs "
            "(last polluted = it: 512 -> 256)") in found["report"]


def test_a_shift_just_over_tolerance_labels_the_edge_of_the_relative_tolerance(tmp_path):
    found = sweep(tmp_path, "cudagraph.capture=null,256", "engine.fault.shift=0.17",
                  "lengths=[128,256,384,512,640,1024]", *corpus(tmp_path, samples=1))
    baseline = found["runs"]["baseline"]
    assert pairs(baseline) == [(183, 184, UP, True), (512, 513, DOWN, True)]
    assert pairs(found["runs"]["cudagraph.capture=256"]) == [(183, 184, UP, True), (256, 257, DOWN, True)]
    edge = baseline["transitions"][0]["tolerance"]
    assert (edge["only"], edge["length"], edge["delta_nll"]) == ("rtol_nll", 183, pytest.approx(0.17, abs=1e-6))
    assert "tolerance" not in baseline["transitions"][1]  # the engine's own edge
    # a shift of every logprob leaves the top-k sets and their renormalised KL alone: topk is clean, nll is not
    assert ("  - nll: clean->polluted at 183|184 (last clean 183, first polluted 184); an edge of the relative "
            "tolerance alone: at 183, |delta NLL| 0.1700 > verdict.tol_nll=0.1 but <= verdict.rtol_nll=0.05 x "
            "NLL_ref (0.17") in found["report"]
    assert any(note.startswith("baseline: non-monotone: 2 transitions (clean->polluted at 183|184, polluted->clean "
                               "at 512|513); polluted at 184..512; 183|184 is an edge of the relative tolerance alone")
               for note in found["summary"]["notes"]), found["summary"]["notes"]
    assert found["summary"]["tracks"] == {"cudagraph.capture": "max_capture_size"}  # the tolerance edge never moved


def test_one_polluted_sample_of_three_pollutes_the_length_and_is_reported(tmp_path):
    found = sweep(tmp_path, "cudagraph.capture=null,256", "engine.fault.prompt_prefix=SAMPLE1", LENGTHS,
                  "search.suspects=false", *corpus(tmp_path, samples=3))  # the grid's lengths only, as listed
    baseline = found["runs"]["baseline"]
    assert pairs(baseline) == [(512, 513, DOWN, True)]
    assert (baseline["transitions"][0]["polluted_samples"], baseline["transitions"][0]["samples"]) == (1, 3)
    assert [s["length"] for s in baseline["split_samples"]] == [128, 256, 384, 512]
    assert {(s["polluted"], s["samples"]) for s in baseline["split_samples"]} == {(1, 3)}
    assert ("- baseline: polluted->clean at 512|513 (last polluted 512, first clean 513); its polluted side 512 "
            "is polluted in 1 of 3 samples\n") in found["report"]
    assert ("  - polluted in 1 of 3 samples at 128, 256, 384, 512 (a length counts as polluted when any sample "
            "is)\n") in found["report"]
    assert any(note.startswith("baseline: samples disagree at 128 (polluted in 1 of 3 samples), ")
               for note in found["summary"]["notes"])
    history = mlflow_client(tmp_path).get_metric_history(found["jobs"]["baseline"].info.run_id, "polluted_samples")
    assert {int(m.step): m.value for m in history}[512] == 1
    assert "samples disagree: 128 (polluted in 1 of 3 samples)" in found["out"]


# -- the verdict rule and absolute mode ------------------------------------------------------------------

@pytest.mark.parametrize("delta,nll_ref,polluted", [
    (0.2, 10.0, False),   # over tol_nll (0.1), under 5 % of NLL_ref (0.5): clean
    (0.08, 1.0, False),   # over 5 % of NLL_ref (0.05), under tol_nll: clean
    (0.2, 1.0, True),     # over both: polluted
    (-0.2, 1.0, True),    # either sign
])
def test_polluted_needs_both_the_absolute_and_the_relative_tolerance(delta, nll_ref, polluted):
    reference = [-nll_ref] * 9
    point = judge(10, 0, [-(nll_ref + delta)] * 9, 0.0, reference, VerdictConfig())
    assert point.polluted is polluted and point.delta_nll == pytest.approx(delta)


def test_any_polluted_sample_pollutes_the_length_and_tolerance_edges_are_named():
    verdict, reference = VerdictConfig(), [-4.0] * 9
    clean = judge(10, 0, [-4.0] * 9, 0.0, reference, verdict)
    bad = judge(10, 1, [-5.0] * 9, 0.0, reference, verdict)
    assert verdict_of([clean, clean, bad]) == "polluted" and verdict_of([clean, clean]) == "clean"
    near = judge(10, 0, [-4.15] * 9, 0.0, reference, verdict)  # 0.15 > tol_nll, <= 0.2 = 5 % of 4
    assert not near.polluted
    assert tolerance_edge([clean, near], verdict)["only"] == "rtol_nll" and tolerance_edge([clean], verdict) is None


def test_absolute_mode_judges_by_max_nll_and_measures_no_reference(tmp_path):
    code, out = run_cli(tmp_path, "reference=null", "verdict.max_nll=8", LENGTHS)
    assert code == 0, out
    (job,) = mlflow_runs(tmp_path, role="job")
    assert first_transition(job) == (512, 513, 1, 1, 1) and job.data.params["reference"] == "null"
    assert mlflow_runs(tmp_path, role="reference") == [] and worker_records(tmp_path, role="reference") == []
    assert metric_steps(tmp_path, job.info.run_id, "nll_ref") == []
    code, out = run_cli(tmp_path, "reference=null", "verdict.max_nll=20", LENGTHS)  # garbage is 10-16 nats
    assert code == 0, out
    assert "all clean over 128..1024" in " ".join(out.split())


# -- the reference checks itself -------------------------------------------------------------------------

def test_a_reference_equal_to_the_job_is_refused_before_anything_starts(tmp_path):
    code, out = run_cli(tmp_path, "cudagraph.capture=null,256", "reference.cudagraph.enforce_eager=false",
                        "reference.spec.k=3", "+reference.sched.max_num_seqs=128", LENGTHS,  # runner: null both
                        multirun=True)
    assert code == 2, out
    assert "refused: reference=" in out and "it is this job's own requested config" in out, out
    assert mlflow_runs(tmp_path) == [] and worker_records(tmp_path) == []


def test_a_length_dependent_reference_stops_the_sweep_and_records_no_verdict(tmp_path):
    overrides = ("cudagraph.capture=null,256", "reference.cudagraph.enforce_eager=false",
                 "+reference.cudagraph.capture=384", "reference.spec.k=3", "+reference.sched.max_num_seqs=128",
                 "+reference.runner=v1", LENGTHS)
    found = sweep(tmp_path, *overrides, rc=1)
    assert "the reference config is itself length-dependent: measured at 128 tokens (sample 0)" in found["out"]
    assert "cudagraph.capture=256: not run: the baseline stopped the sweep" in found["out"]
    assert found["summary"]["notes"][-1] == ("cudagraph.capture=256: not run: the baseline stopped the sweep, as "
                                             "every job would fail the way it did")
    assert found["summary"]["predictions"]["text"] == ("resolution rules: no run resolved a config, so nothing was "
                                                       "checked")
    (job,) = found["jobs"].values()  # the variant never started
    assert job.info.status == "FAILED" and job.data.tags["oneknob.error"].startswith("reference=")
    assert "graphs off and no speculation" in job.data.tags["oneknob.error"]
    assert metric_steps(tmp_path, job.info.run_id) == [] and "transitions" not in job.data.metrics
    (reference,) = mlflow_runs(tmp_path, role="reference")
    assert reference.info.status == "FAILED" and "length-dependent" in reference.data.tags["oneknob.error"]
    assert worker_records(tmp_path, role="job") == []  # no job engine started
    code, out = run_cli(tmp_path, *overrides, multirun=True)  # again: the stored check fails, no engine starts
    assert code == 1 and "itself length-dependent" in out, out
    assert len(worker_records(tmp_path, role="reference")) == 1


# -- notes use the engine's recorded defaults; bad shapes are refused ---------------------------------------

def test_notes_compare_with_the_engines_recorded_defaults(tmp_path):
    from oneknob.explain import analysis

    found = sweep(tmp_path, "cudagraph.capture=null,256", "engine.default_max_num_seqs=64",
                  "engine.default_runner=v1", "sched.max_num_seqs=null", "runner=null", LENGTHS)
    baseline = found["runs"]["baseline"]
    assert (baseline["resolved"]["max_num_seqs"], baseline["resolved"]["runner"]) == (64, "v1")
    assert baseline["defaults"]["default_max_num_seqs"] == 64 and baseline["defaults"]["default_runner"] == "v1"
    assert found["summary"]["predictions"]["mismatches"] == {}
    assert not any("resolved differently" in note for note in found["summary"]["notes"])
    assumed = baseline | {"defaults": baseline["defaults"] | {"default_max_num_seqs": 256, "default_runner": "v2"}}
    assert analysis._check_prediction(assumed)  # the check is sharp: assumed defaults would be flagged


@pytest.mark.parametrize("override,message", [
    ("engine.fault.side=ge", "engine.fault.side=ge: must be le"),
    ("engine.fault.edge=capture", "engine.fault.edge=capture: not a quantity of the resolved config"),
    ("engine.fault.islands=[[400,300]]", "engine.fault.islands: [400, 300] is not a range"),
])
def test_a_fault_shape_the_engine_cannot_express_is_refused(tmp_path, override, message):
    code, out = run_cli(tmp_path, override, LENGTHS)
    assert code == 2 and message in out, out
    assert mlflow_runs(tmp_path) == []
