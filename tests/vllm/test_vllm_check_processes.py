"""vLLM's configuration check costs one `import vllm` per build for a whole sweep, the reference included.

The seed's study is planned for engine=vllm in process (the real configs, the real planner and provisioning: the
patched copy is made), and vLLM's check script is a stand-in that counts the processes started and answers
"accepted" for every configuration it is given: what is counted is how oneknob groups the sweep's checks. The
script's own behaviour (one import, a fork per environment, the files it read) is tested against the real vLLM in
test_engine_args_knobs and by `make ablate`'s log.
"""

from __future__ import annotations

import json
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import oneknob.config.schema  # noqa: F401  (registers the structured schema)
from oneknob.config.schema import REPO_ROOT
from oneknob.engines.vllm import validate as vllm_validate
from oneknob.plan import jobs as planning

STAND_IN = """import json, sys
spec = json.load(sys.stdin)
with open({calls!r}, "a") as out:
    out.write(json.dumps(spec) + "\\n")
read = {read!r}
groups = spec.get("groups") or [{{"env": spec.get("env"), "configs": spec.get("configs")}}]
answers = [{{"results": [{{"ok": True, "resolved": {{"scheduler_config.max_num_seqs": c.get("max_num_seqs")}}}}
                         for c in g["configs"]], "read": [f for f in spec.get("watch", []) if f in read],
            "spawned": False}} for g in groups]
print(json.dumps({{"ok": True, "vllm_version": "9.9", "groups": answers, "results": answers[0]["results"]}}))
"""


@pytest.fixture
def seed_study(tmp_path, monkeypatch):
    """The seed's study planned for vLLM (7 jobs on this CPU machine: runner=v2 is skipped; one is the patch)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # no check of the machine's cache serves these
    GlobalHydra.instance().clear()
    fixed = [f"paths.root={tmp_path}", f"hydra.sweep.dir={tmp_path}/sweep", "engine=vllm"]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        composer = lambda overrides=(): compose("config", overrides=[*fixed, *overrides],  # noqa: E731
                                                return_hydra_config=True)
        sweep = planning.plan_sweep(composer(), ["experiment=mtp_prompt_logprobs", "engine=vllm"],
                                    lambda overrides: composer(overrides))
    GlobalHydra.instance().clear()
    return [job.plan for job in sweep.jobs]


def _checks(tmp_path, monkeypatch, plans, read=()) -> list[dict]:
    calls = tmp_path / "calls.jsonl"
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN.format(calls=str(calls), read=list(read)))
    monkeypatch.setattr(vllm_validate, "SCRIPT", script)
    said = []
    planning.provision(plans, said.append)
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else [], said


def test_the_seed_study_is_checked_by_one_process_for_both_builds_and_the_reference(tmp_path, monkeypatch,
                                                                                    seed_study):
    patched = [p for p in seed_study if p.knobs.get("vllm.patch")]
    assert len(seed_study) == 7 and len(patched) == 1 and seed_study[0].reference_knobs is not None
    started, said = _checks(tmp_path, monkeypatch, seed_study)
    assert len(started) == 1, said  # was 3: the jobs' environment, the reference's (runner null), the patched copy
    (spec,) = started
    envs = sorted(json.dumps(group["env"], sort_keys=True) for group in spec["groups"])
    assert envs == ['{"VLLM_USE_V2_MODEL_RUNNER": "0"}', "{}"]  # the jobs' (runner=v1) and the reference's
    assert sum(len(group["configs"]) for group in spec["groups"]) == 7  # 6 job configurations + the reference's
    assert spec["watch"] == ["vllm/v1/worker/gpu_model_runner.py"]  # what the fix's diff touches
    # a rerun: every configuration, the patched copy's included, comes from the study's cache
    again, _ = _checks(tmp_path, monkeypatch, seed_study)
    assert len(again) == 1  # (the file of calls is the same: nothing was added)


def test_a_patched_copy_whose_diff_the_check_read_gets_its_own_process(tmp_path, monkeypatch, seed_study):
    started, said = _checks(tmp_path, monkeypatch, seed_study, read=["vllm/v1/worker/gpu_model_runner.py"])
    assert len(started) == 2, said
    alone = started[1]
    assert alone["watch"] == [] and [len(g["configs"]) for g in alone["groups"]] == [1]
    assert any("cannot stand for the patched copy (it read vllm/v1/worker/gpu_model_runner.py)" in line
               for line in said), said
    assert sys.executable  # both processes run this interpreter (the patched copy is on its PYTHONPATH)


def _worker_checker(served: list[dict], own: dict, read: tuple[str, ...] = ()):
    """A prepared worker's checker (oneknob.run.prepared) for this interpreter and the environment `own`: it answers
    every group, except one that sets a variable in `read` otherwise than `own` ("redo", as
    vllm_introspect.validate_imported says of a variable vLLM's import read)."""
    def checker(python, env, knob_envs):
        if python != sys.executable or env.get("PYTHONPATH") or own not in knob_envs:  # the release's build only
            return None

        def serve(spec, env):
            served.append(spec)
            return {"ok": True, "vllm_version": "9.9", "groups": [
                {"redo": stale} if (stale := [v for v in read if group["env"].get(v) != own.get(v)]) else
                _accepted(group) for group in spec["groups"]]}
        return serve
    return checker


def _accepted(group: dict) -> dict:
    """A worker's answer accepting every configuration of a group, having read nothing a diff touches."""
    return {"results": [{"ok": True, "resolved": {}} for _ in group["configs"]], "read": [], "spawned": False}


def test_the_checks_meanwhile_runs_before_the_check_and_its_worker_serves_every_environment_it_can(tmp_path,
                                                                                                  monkeypatch):
    """provision(meanwhile=...): called once, before the check (the stand-in check process answers only once the
    marker meanwhile writes exists: the job's worker imports vLLM while the check runs). Its checker serves every
    environment whose variables vLLM's import did not read (the reference's runner: no check process at all);
    those that come back "redo" go to one process; a cached rerun calls nothing."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    from helpers import job_plan

    seed = job_plan(tmp_path / "seed", "experiment=mtp_prompt_logprobs", engine="vllm")  # its reference: 2 envs
    own = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    marker, calls = tmp_path / "meanwhile", tmp_path / "calls.jsonl"
    served: list[dict] = []
    meanwhiles: list[int] = []

    def meanwhile(read=()):
        meanwhiles.append(1)
        marker.write_text("the worker is importing vLLM")
        return _worker_checker(served, own, read)

    script = tmp_path / "stand_in.py"
    wait = (f"import pathlib, sys, time\nfor _ in range(400):\n    if pathlib.Path({str(marker)!r}).exists(): break\n"
            "    time.sleep(0.05)\nelse:\n    sys.exit('meanwhile was not called before the check')\n")
    script.write_text(wait + STAND_IN.format(calls=str(calls), read=[]))
    monkeypatch.setattr(vllm_validate, "SCRIPT", script)
    said: list[str] = []
    planning.provision([seed], said.append, meanwhile=meanwhile)  # the job's runner and the reference's: the worker
    assert meanwhiles == [1] and not calls.exists(), said
    assert sorted(json.dumps(g["env"]) for g in served[0]["groups"]) == ['{"VLLM_USE_V2_MODEL_RUNNER": "0"}', "{}"]
    assert any("vLLM checks 2 configuration(s) in the job's worker" in line for line in said), said
    planning.provision([seed], said.append, meanwhile=meanwhile)  # cached: no check, nothing started meanwhile
    assert meanwhiles == [1] and len(served) == 1
    said.clear()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-again"))  # a machine whose vLLM import read the runner
    again = job_plan(tmp_path / "again", "experiment=mtp_prompt_logprobs", engine="vllm")
    planning.provision([again], said.append, meanwhile=lambda: meanwhile(read=("VLLM_USE_V2_MODEL_RUNNER",)))
    (spec,) = [json.loads(line) for line in calls.read_text().splitlines()]  # the reference alone, in a process
    assert [g["env"] for g in spec["groups"]] == [{}] and len(served) == 2, said
    assert any("reading VLLM_USE_V2_MODEL_RUNNER, which 1 other environment(s) set otherwise: one process checks "
               "them" in line for line in said), said


def test_the_job_workers_release_leaves_a_patched_copy_a_process_of_its_own(tmp_path, monkeypatch, seed_study):
    """Where the job's worker checks the release's configurations (one import for them and the engine), the patched
    copy does not share a process of the release that would import vLLM again just to watch its files: it gets its
    own, the only check process of the study."""
    calls = tmp_path / "calls.jsonl"
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN.format(calls=str(calls), read=[]))
    monkeypatch.setattr(vllm_validate, "SCRIPT", script)
    served: list[dict] = []
    said: list[str] = []
    planning.provision(seed_study, said.append,
                       meanwhile=lambda: _worker_checker(served, {"VLLM_USE_V2_MODEL_RUNNER": "0"}))
    (spec,) = [json.loads(line) for line in calls.read_text().splitlines()]
    assert spec["watch"] == [] and [len(g["configs"]) for g in spec["groups"]] == [1], said  # the patched copy
    assert sum(len(g["configs"]) for g in served[0]["groups"]) == 7  # 6 job configurations + the reference's
    assert any("vllm.patch=" in line and "checked in a process of its own" in line for line in said), said


def test_a_patched_copy_the_jobs_worker_runs_is_checked_in_that_worker(tmp_path, monkeypatch):
    """A study whose job runs a patched copy, judged by transformers (no vLLM reference): the job's worker runs the
    patched code itself (the overlay on its PYTHONPATH), so it checks its own configuration and no process imports
    vLLM for the check alone; a rerun is served by the study's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    from helpers import job_plan

    plan = job_plan(tmp_path / "study", "vllm.patch=fix-53520-protect-prompt-hidden-states",
                    "reference_engine=transformers", engine="vllm")
    calls = tmp_path / "calls.jsonl"
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN.format(calls=str(calls), read=[]))
    monkeypatch.setattr(vllm_validate, "SCRIPT", script)
    served: list[dict] = []

    def checker(python, env, knob_envs):  # the worker of the patched copy: its overlay first on PYTHONPATH
        if "patched" not in env.get("PYTHONPATH", ""):
            return None
        return lambda spec, env: served.append(spec) or {"ok": True, "vllm_version": "9.9",
                                                         "groups": [_accepted(g) for g in spec["groups"]]}

    said: list[str] = []
    planning.provision([plan], said.append, meanwhile=lambda: checker)
    assert not calls.exists(), said  # no check process: the worker served it
    assert len(served) == 1 and served[0]["watch"] == [] and len(served[0]["groups"][0]["configs"]) == 1, said
    assert any("in the job's worker" in line for line in said), said
    planning.provision([plan], said.append, meanwhile=lambda: checker)
    assert len(served) == 1 and not calls.exists()  # cached
