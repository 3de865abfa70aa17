"""Planning and one job, in process: the composed config -> plans -> a job's outcome, no CLI in between."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import composing, run_python

import oneknob.config.schema  # noqa: F401  (registers the structured schema)
from oneknob.plan import jobs as planning
from oneknob.config.schema import REPO_ROOT
from oneknob.errors import Refused
from oneknob.study.job import run_job
from oneknob.plan.single_variable import GuardError

EXPERIMENTS = sorted(p.stem for p in (REPO_ROOT / "experiments").glob("*.yaml"))


@pytest.fixture
def composer(tmp_path):
    """compose(overrides) of the real configs, with the paths and the sweep dir in tmp_path."""
    with composing(tmp_path, "synthetic") as compose_:
        yield compose_


def sweep_of(composer, *arguments):
    return planning.plan_sweep(composer(), list(arguments), lambda overrides: composer(overrides))


def test_a_knob_list_plans_the_baseline_first_then_each_other_value(composer):
    sweep = sweep_of(composer, "cudagraph.capture=512,256,null")
    assert [job.plan.name for job in sweep.jobs] == ["baseline", "cudagraph.capture=512", "cudagraph.capture=256"]
    assert sweep.baseline.knobs["cudagraph.capture"] is None  # the composed value is in the list
    assert [job.plan.knobs["cudagraph.capture"] for job in sweep.jobs] == [None, 512, 256]
    assert [job.plan.predicted["max_capture_size"] for job in sweep.jobs] == [512, 512, 256]
    assert sweep.varied == "cudagraph.capture" and sweep.notes == []


def test_the_ablation_block_and_the_list_write_the_same_plan(composer):
    from_block = sweep_of(composer, "+ablation.spec.k=[0,1]")
    from_list = sweep_of(composer, "spec.k=0,1,3")
    assert [j.plan.knobs for j in from_block.jobs] == [j.plan.knobs for j in from_list.jobs]
    assert [j.plan.name for j in from_block.jobs] == ["baseline", "spec.k=0", "spec.k=1"]


def test_a_list_replaces_the_ablation_block_and_says_so(composer):
    sweep = sweep_of(composer, "experiment=mtp_prompt_logprobs", "cudagraph.capture=256,384")
    assert [job.plan.name for job in sweep.jobs] == ["baseline", "cudagraph.capture=384"]
    assert sweep.notes == ["the ablation block is not run: the command line varies cudagraph.capture"]


def test_the_plan_carries_the_job_and_survives_its_file(composer, tmp_path):
    plan = sweep_of(composer, "spec.k=0,3", "verdict.tol_nll=0.3", "search.max_probes=9").jobs[1].plan
    again = planning.JobPlan.from_json(plan.to_json())
    assert again == plan
    assert (again.verdict.tol_nll, again.search.max_probes, again.knob) == (0.3, 9, "spec.k")
    assert again.cache_dir == str(tmp_path / ".cache" / "oneknob")
    assert again.corpus.prompt(5, 1) == plan.corpus.prompt(5, 1)


@pytest.mark.parametrize("arguments,message", [
    (["cudagraph.capture=256,512", "spec.k=1,3"], "varies 2 knobs"),
    (["cudagraph.capture=256,512", "seed=0,1"], "varies the knob cudagraph.capture and also seed=0,1"),
    (["+cudagraph.captur=256,512"], "did you mean cudagraph.capture?"),
    (["+ablation.spec.k=[-1]"], "ablation: spec.k=-1"),
    (["lengths=[1,5]"], "lengths: 1 is too short"),
])
def test_refusals_are_raised_while_planning(composer, arguments, message):
    with pytest.raises(Refused, match=message.replace("?", r"\?").replace("[", r"\[")):
        sweep_of(composer, *arguments)
    assert issubclass(GuardError, Refused)


def test_one_job_in_process_from_its_plan(composer, tmp_path):
    plan = planning.plan_job(composer(["cudagraph.capture=256", "lengths=[128,256,384]", "samples=1"]))
    outcome = run_job(plan, tmp_path / "job")
    assert outcome["status"] == "ok" and outcome["transitions"] == [
        {"lo": 256, "hi": 257, "direction": "polluted->clean", "resolved": True, "polluted_samples": 1, "samples": 1}]
    assert outcome["resolved"]["max_capture_size"] == 256
    assert json.loads((tmp_path / "job" / "result.json").read_text())["run_id"] == outcome["run_id"]
    again = run_job(plan, tmp_path / "job2")  # everything cached: no engine
    assert again["points_measured"] == 0 and not again["engine_started"]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("engine", ["synthetic", pytest.param("vllm", marks=pytest.mark.slow)])
def test_every_experiment_file_dry_runs(tmp_path, experiment, engine):
    done = run_python([str(REPO_ROOT / "run.py"), "-m", f"experiment={experiment}", f"engine={engine}", "dry_run=true",
                       f"hydra.sweep.dir={tmp_path}/s"], tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads((tmp_path / "s" / "plan.json").read_text())
    assert plan["jobs"][0]["name"] == "baseline" and len(plan["jobs"]) >= 2
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()
    assert not (tmp_path / ".cache" / "oneknob" / "workers.jsonl").exists()
    assert sorted(p.name for p in Path(tmp_path / "s").iterdir()) == ["plan.json"]
    if engine == "vllm":  # vLLM's own config construction ran for every job (now, or cached: no engine started)
        for job in plan["jobs"]:
            own = job["engine_resolved"]
            assert own["scheduler_config.max_num_seqs"] == job["predicted"]["max_num_seqs"], job["name"]
            assert (own.get("speculative_config.num_speculative_tokens") or 0) == job["predicted"]["spec_k"]
    else:
        assert all("engine_resolved" not in job for job in plan["jobs"])


def _elsewhere(gpu: str) -> str:
    """`gpu`, or where this machine is one, a GPU with the same predictions (a plan for this machine asks its vLLM)."""
    from oneknob.config.resolution import same_device
    from oneknob.provision.provenance import local_device

    return {"H200": "H100", "B200": "B300"}[gpu] if same_device(gpu, local_device().name) else gpu


def _dry_run(tmp_path, *overrides):
    return run_python([str(REPO_ROOT / "run.py"), "-m", "experiment=mtp_prompt_logprobs", "engine=vllm", *overrides,
                       f"hydra.sweep.dir={tmp_path}/s"], tmp_path, timeout=900)


@pytest.mark.parametrize("gpu,baseline_max,lengths_added", [("B200", 1024, [1025, 1280]), ("H200", 512, [])])
def test_a_study_is_planned_for_a_gpu_it_is_not_running_on(tmp_path, gpu, baseline_max, lengths_added):
    gpu = _elsewhere(gpu)
    done = _dry_run(tmp_path, "dry_run=true", f"engine.target_gpu={gpu}")
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads((tmp_path / "s" / "plan.json").read_text())
    jobs = {job["name"]: job for job in plan["jobs"]}
    assert plan["platform"] == "cuda" and plan["defaults"]["device"] == gpu
    assert (plan["defaults"]["default_max_num_seqs"], plan["defaults"]["capture_ceiling"]) == (
        1024, 1024 if gpu in ("B200", "B300") else 512)
    assert jobs["baseline"]["predicted"]["max_capture_size"] == baseline_max
    assert jobs["spec.k=1"]["predicted"]["max_capture_size"] == 512
    assert 'runner="v2"' in jobs  # a GPU runs Model Runner V2, unlike this CPU machine
    assert [L for L in jobs["baseline"]["lengths"] if L > 1024] == lengths_added
    assert "emulat" not in json.dumps(plan["defaults"]).replace('"emulate_cuda_graphs": false', "")
    assert all("engine_resolved" not in job for job in plan["jobs"])  # this CPU machine's vLLM is not the target's
    assert f"not shown: the plan is for {gpu}" in done.stdout + done.stderr


def test_a_study_for_another_gpu_does_not_run_here(tmp_path):
    from oneknob.provision.provenance import local_device

    target = _elsewhere("H200")  # not this machine, whatever it is
    done = _dry_run(tmp_path, f"engine.target_gpu={target}", "lengths=[128]")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"engine.target_gpu={target}: this machine has {local_device().name}" in done.stderr  # cpu here, in CI
    assert "dry_run=true" in done.stderr
