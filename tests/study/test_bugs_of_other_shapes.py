"""Bugs oneknob was not built for (issue 22), through the CLI on the synthetic engine with a real MLflow store:
a reference that is length-dependent by design (engine.fault.reference_switch: the reference-side shape), the
store that never loses a measurement (run A, run B with longer lengths, rerun A), a one-length island at a
candidate threshold the grid misses, and variants that clear or pollute every length.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import mlflow_runs, run_cli, worker_records

DOWN, UP = "polluted->clean", "clean->polluted"
# The simulated model declares a length field at 300 and its reference scores prompts of <= 300 tokens differently
MODEL = "+engine.fault.model_config={rope_scaling:{original_max_position_embeddings:300},max_position_embeddings:4096}"
SWITCH = ("engine.fault.reference_switch=300", MODEL)
FIELD = "model.rope_scaling.original_max_position_embeddings"


def sweep(tmp_path, *overrides: str, rc: int = 0) -> dict:
    code, out = run_cli(tmp_path, *overrides, multirun=True)
    assert code == rc, out
    paths = sorted(Path(tmp_path).glob("multirun/*/summary.json"))
    summary = json.loads(paths[-1].read_text()) if paths else {"runs": []}
    report = (paths[-1].parent / "report.md").read_text() if paths else ""
    return {"out": " ".join(out.split()), "summary": summary, "runs": {r["name"]: r for r in summary["runs"]},
            "report": report}


def pairs(run: dict) -> list[tuple]:
    return [(t["lo"], t["hi"], t["direction"], t["resolved"]) for t in run["transitions"]]


def verdicts(run: dict) -> dict[int, bool]:
    return {p["length"]: p["polluted"] for p in run["points"]}


def test_a_reference_length_dependent_by_design_is_measured_per_length_and_the_transition_tracks_the_model(
        tmp_path):
    # engine.fault.pollute=false: the job itself is clean; it differs from its reference only where the
    # reference's own scoring switches (<= 300 tokens), as vLLM does from HF on a longrope model
    found = sweep(tmp_path, *SWITCH, "engine.fault.pollute=false", "reference_per_length=true",
                  "lengths=[128,256,384,512,1024]", "samples=1")
    base = found["runs"]["baseline"]
    assert pairs(base) == [(300, 301, DOWN, True)]  # 300 and 301 are suspect probes: not in the grid
    assert {L for L, p in verdicts(base).items() if p} == {128, 129, 255, 256, 257, 299, 300}  # probed <= 300
    assert (f"the transition 300|301 coincides with the model's own threshold (last polluted = {FIELD}, from its "
            "config.json)") in found["report"]
    assert f"last polluted 300 = {FIELD}" in found["report"]  # the confounds name it too
    measured = len(verdicts(base))  # the reference is measured at every length the job probed, once each
    assert measured == 13  # 5 grid lengths + 8 suspects (q - 1, q, q + 1 of the in-range candidates)
    assert (f"Reference: reference_per_length=true; reference measured per length: {measured} length(s) x 1 "
            "sample(s)") in found["report"]
    assert f"300 ({FIELD}), 301 ({FIELD} + 1)" in found["report"]  # the suspect probes, listed with why
    warning = ("the simulated model declares ['max_position_embeddings', 'rope_scaling']: scoring may change at "
               "those lengths")  # as logged, less its level, time and file:line
    assert found["report"].count(warning) == 1  # the one run's environment, in the header
    assert f"baseline: engine warning: {warning}" in found["out"]
    (job,) = mlflow_runs(tmp_path, role="job")
    assert json.loads(job.data.tags["oneknob.engine_warnings"]) == [warning]
    assert job.data.params[f"model_config.{FIELD.removeprefix('model.')}"] == "300"
    assert job.data.params["model_config.max_position_embeddings"] == "4096"


def test_auto_stops_a_length_dependent_simulated_reference_and_names_the_engine_and_where_it_changes(tmp_path):
    found = sweep(tmp_path, *SWITCH, "engine.fault.pollute=false", "lengths=[128,256,384,512,1024]", "samples=1",
                  rc=1)
    out = found["out"]
    assert "on engine=synthetic: the reference config is itself length-dependent: measured at 128 tokens" in out
    assert f"it changes between 300 and 301: {FIELD} = 300" in out
    assert "This is already the default reference" in out and "reference_per_length=true" in out
    assert "Pick a reference with graphs off" not in out  # never the setting already in use


def test_the_store_never_loses_a_measurement_so_a_rerun_gives_the_same_verdicts(tmp_path):
    """Run A (all lengths below the reference's switch: its prefix check holds), run B with longer lengths
    (the check fails: stopped), then B measured per length, then rerun A: A's verdicts, from A's own stored
    reference. Before issue 22 B replaced A's stored reference and the rerun failed its check."""
    a = (*SWITCH, "lengths=[128,200,256]", "samples=1")
    first = sweep(tmp_path, *a)
    sweep(tmp_path, *SWITCH, "lengths=[128,512,1024]", "samples=1", rc=1)
    sweep(tmp_path, *SWITCH, "lengths=[128,512,1024]", "samples=1", "reference_per_length=true")
    again = sweep(tmp_path, *a)
    assert verdicts(again["runs"]["baseline"]) == verdicts(first["runs"]["baseline"])
    assert set(verdicts(first["runs"]["baseline"]).values()) == {True}  # the seed's fault: polluted <= 512
    (folder,) = (Path(tmp_path) / ".cache" / "oneknob" / "references").glob("*/")
    assert {p.name for p in folder.glob("long-*")} == {"long-256.k5.json", "long-1024.k5.json"}
    assert len(worker_records(tmp_path, role="reference")) == 3  # A's, B's, B per length; the rerun: none


def test_a_one_length_island_at_a_candidate_threshold_missing_from_the_grid_is_found(tmp_path):
    grid = ("engine.fault.edge=null", "engine.fault.islands=[[512,512]]", "lengths=[128,256,384,640,768,1024]",
            "samples=1")
    found = sweep(tmp_path, *grid)
    base = found["runs"]["baseline"]
    assert pairs(base) == [(511, 512, UP, True), (512, 513, DOWN, True)]
    assert ("512 (resolved max capture size, max_num_seqs x (K+1), max_num_batched_tokens / (K+1), vLLM's default "
            "capture ceiling)") in found["report"]
    blind = sweep(tmp_path / "blind", *grid, "search.suspects=false")  # the grid alone never sees it
    assert pairs(blind["runs"]["baseline"]) == []


def test_a_variant_that_clears_every_length_and_one_polluted_everywhere_are_never_unchanged(tmp_path):
    cleared = sweep(tmp_path, "spec.k=3,0", "lengths=[128,256,384,512]", "samples=1")
    versus = cleared["runs"]["spec.k=0"]["versus_baseline"]
    assert versus["relation"] == "cleared" and versus["polluted"] == []
    assert versus["text"].startswith("cleared: polluted at 128, ")
    assert "\n- spec.k=0 (pinned cudagraph.capture=512) cleared it\n" in cleared["report"]
    appeared = sweep(tmp_path / "gt", "cudagraph.capture=null,64", "engine.fault.side=gt",
                     "lengths=[128,256,384,512]", "samples=1")
    versus = appeared["runs"]["cudagraph.capture=64"]["versus_baseline"]
    assert pairs(appeared["runs"]["baseline"]) == [] and pairs(appeared["runs"]["cudagraph.capture=64"]) == []
    assert versus["relation"] == "appeared" and versus["polluted_baseline"] == []
    assert versus["text"].startswith("appeared: polluted at 128, ") and "clean in the baseline" in versus["text"]
