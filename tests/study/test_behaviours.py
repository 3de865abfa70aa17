"""Behaviours README documents, end to end, each asserted on its exact outcome (status, exit code, note).

Through the real CLI on the synthetic engine (a few seconds a sweep) where the behaviour is the sweep's:
the single-variable policies (refuse, the no-op skip and run_noops, a pin that cannot restore its field),
MLFLOW_TRACKING_URI. In process where composing the plan is the whole behaviour: the CPU build's runner=v2
skip. Every test here was checked by breaking the behaviour in src (docs/MUTATION.md lists how).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import empty_store, metric_steps, mlflow_runs, run_cli, worker_records
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import oneknob.config.schema  # noqa: F401  (registers the structured schema)
from oneknob.plan import jobs as planning
from oneknob.config.schema import REPO_ROOT

GRID = "lengths=[256,512,513,1024]"
EXPERIMENT = "behaviours"  # named here: the synthetic engine's default experiment is not this file's business


def sweep(tmp_path, *overrides: str) -> dict:
    rc, out = run_cli(tmp_path, *overrides, GRID, "samples=1", f"tracking.experiment={EXPERIMENT}", multirun=True)
    assert rc == 0, out
    (path,) = Path(tmp_path).glob("multirun/*/summary.json")
    summary = json.loads(path.read_text())
    return {"out": " ".join(out.split()), "summary": summary, "runs": {r["name"]: r for r in summary["runs"]},
            "report": (path.parent / "report.md").read_text(),
            "jobs": {r.info.run_name: r for r in mlflow_runs(tmp_path, EXPERIMENT, role="job")}}


def pairs(run: dict) -> list[tuple]:
    return [(t["lo"], t["hi"], t["direction"]) for t in run["transitions"]]


# -- single_variable.side_effects=refuse ------------------------------------------------------------------

def test_side_effects_refuse_measures_nothing_of_a_variant_that_moves_another_field(tmp_path):
    found = sweep(tmp_path, "spec.k=0,3", "single_variable.side_effects=refuse")
    k0 = found["runs"]["spec.k=0"]
    note = "refused: spec.k also moved max_capture_size 512 -> 256 (single_variable.side_effects=refuse)"
    assert (k0["status"], k0["points"], k0["transitions"], k0["pinned"]) == ("refused", [], [], {})
    assert k0["check"]["side_effects"] == ["max_capture_size"] and k0["check"]["note"] == note
    assert f"spec.k=0: {note}" in found["summary"]["notes"]
    assert f"spec.k=0: refused - {note}" in found["out"]
    assert metric_steps(tmp_path, found["jobs"]["spec.k=0"].info.run_id) == []  # not one point measured
    assert found["jobs"]["spec.k=0"].data.tags["oneknob.status"] == "refused"
    assert pairs(found["runs"]["baseline"]) == [(512, 513, "polluted->clean")]


# -- no-ops: skipped unless single_variable.run_noops=true ----------------------------------------------------

NOOP = "cudagraph.capture=null,512"  # K=3, max_num_seqs=128: vLLM's default capture size is 512 already


def test_a_variant_that_changes_nothing_in_the_engine_is_skipped(tmp_path):
    found = sweep(tmp_path, NOOP)
    noop = found["runs"]["cudagraph.capture=512"]
    assert (noop["status"], noop["points"], noop["check"]["diff"]) == ("noop", [], {})
    assert noop["check"]["note"] == ("no-op: its resolved config differs from the baseline's in nothing; not "
                                     "measured (single_variable.run_noops=true measures it)")
    assert metric_steps(tmp_path, found["jobs"]["cudagraph.capture=512"].info.run_id) == []
    # its engine started only to resolve the config; the reference and the baseline measured
    assert len(worker_records(tmp_path, role="job")) == 2


def test_run_noops_measures_the_noop_variant(tmp_path):
    found = sweep(tmp_path, NOOP, "single_variable.run_noops=true", "search.suspects=false")  # the grid's lengths
    noop = found["runs"]["cudagraph.capture=512"]
    assert noop["status"] == "ok" and pairs(noop) == [(512, 513, "polluted->clean")]
    assert noop["check"]["note"] == "no-op: its resolved config differs from the baseline's in nothing"
    assert metric_steps(tmp_path, found["jobs"]["cudagraph.capture=512"].info.run_id) == [256, 512, 513, 1024]


# -- pin, and the fallback to flag when the pin cannot restore the field --------------------------------------

def test_a_pin_that_does_not_restore_the_field_is_flagged_and_measured(tmp_path):
    """K=2 on the V1 runner: capture sizes round to multiples of K+1, so the max capture size is 498 even
    with cudagraph.capture=512 pinned; the variant runs, tagged confounded, and the report says why."""
    found = sweep(tmp_path, "spec.k=2,3")
    k2 = found["runs"]["spec.k=2"]
    assert (k2["status"], k2["confounded"], k2["pinned"]) == ("confounded", True, {"cudagraph.capture": 512})
    assert k2["resolved"]["max_capture_size"] == 498 and k2["check"]["side_effects"] == ["max_capture_size"]
    assert k2["check"]["note"] == (
        "pinned cudagraph.capture=512 (the baseline's resolved value) to undo max_capture_size 512 -> 498; pinning "
        "did not restore max_capture_size: flagged. confounded: spec.k also moved max_capture_size 512 -> 498")
    job = found["jobs"]["spec.k=2"]
    assert job.data.tags["oneknob.confounded"] == "true"
    assert job.data.params["knob.cudagraph.capture"] == "512" and job.data.params["knob.spec.k"] == "2"
    assert pairs(k2) == [(498, 499, "polluted->clean")]  # measured: the boundary follows the 498


# -- the CPU build cannot start Model Runner V2 -----------------------------------------------------------------

@pytest.fixture
def composer(tmp_path):
    GlobalHydra.instance().clear()
    fixed = [f"paths.root={tmp_path}", f"hydra.sweep.dir={tmp_path}/sweep"]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        yield lambda overrides=(): compose("config", overrides=[*fixed, *overrides], return_hydra_config=True)
    GlobalHydra.instance().clear()


@pytest.mark.cpu_build  # this machine's vLLM is the CPU build: a GPU host plans runner=v2
def test_the_cpu_build_skips_runner_v2_and_says_so(composer):
    study = ["experiment=mtp_prompt_logprobs"]
    cpu = planning.plan_sweep(composer(["engine=vllm"]), [*study, "engine=vllm"],
                              lambda overrides: composer(["engine=vllm", *overrides]))
    names = [job.plan.name for job in cpu.jobs]
    assert 'runner="v2"' not in names and names[0] == "baseline" and len(names) == 7
    assert cpu.notes == ['runner="v2" not run here: runner=v2: vLLM\'s Model Runner V2 needs Triton, which '
                         "vLLM's CPU build lacks (vLLM refuses to start); use runner=v1 or runner=null on CPU, "
                         "or a GPU"]
    # the skip is the CPU build's: the simulation (a GPU's rules) plans runner=v2
    synthetic = planning.plan_sweep(composer(["engine=synthetic"]), [*study, "engine=synthetic"],
                                    lambda overrides: composer(["engine=synthetic", *overrides]))
    assert 'runner="v2"' in [job.plan.name for job in synthetic.jobs]
    assert not [note for note in synthetic.notes if "runner" in note]


# -- MLFLOW_TRACKING_URI --------------------------------------------------------------------------------------

def test_mlflow_tracking_uri_from_the_environment_is_where_runs_go(tmp_path):
    elsewhere = tmp_path / "elsewhere" / "mlflow.db"
    elsewhere.parent.mkdir()
    shutil.copyfile(empty_store(), elsewhere)
    uri = f"sqlite:///{elsewhere}"
    named = f"tracking.experiment={EXPERIMENT}"
    rc, out = run_cli(tmp_path, "lengths=[256,512]", "samples=1", "search.suspects=false", named,
                      env={"MLFLOW_TRACKING_URI": uri})
    assert rc == 0, out
    (job,) = mlflow_runs(uri, EXPERIMENT, role="job")
    assert job.info.status == "FINISHED" and metric_steps(uri, job.info.run_id) == [256, 512]
    assert mlflow_runs(tmp_path, EXPERIMENT) == []  # nothing in the default store under ./mlruns
    # tracking.uri on the command line wins over the environment
    rc, out = run_cli(tmp_path, "lengths=[256,512]", "samples=1", named,
                      f"tracking.uri=sqlite:///{tmp_path}/mlruns/mlflow.db", env={"MLFLOW_TRACKING_URI": uri})
    assert rc == 0, out
    assert len(mlflow_runs(tmp_path, EXPERIMENT, role="job")) == 1
    assert len(mlflow_runs(uri, EXPERIMENT, role="job")) == 1
