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
from oneknob.engines import vllm_validate
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


def test_the_checks_meanwhile_runs_before_the_check_and_its_worker_serves_its_own_environment(tmp_path,
                                                                                                 monkeypatch):
    """provision(meanwhile=...): called once, before the check (the stand-in check process answers only once the
    marker meanwhile writes exists: the job's worker imports vLLM while the check runs). Its checker serves the
    one environment it is offered for, so a one-job plan starts no check process; a cached rerun calls nothing."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    from helpers import job_plan

    seed = job_plan(tmp_path / "seed", "experiment=mtp_prompt_logprobs", engine="vllm")  # its reference: 2 envs
    alone = job_plan(tmp_path / "alone", "experiment=mtp_prompt_logprobs", "reference=null", "spec.k=2",
                     engine="vllm")
    marker = tmp_path / "meanwhile"
    served: list[dict] = []

    def meanwhile():
        calls.append(1)
        marker.write_text("the worker is importing vLLM")
        return lambda python, knob_env: (lambda spec, env: served.append(spec) or {
            "ok": True, "vllm_version": "9.9", "groups": [{"results": [{"ok": True, "resolved": {}}
                                                                       for _ in spec["groups"][0]["configs"]],
                                                           "read": [], "spawned": False}]})

    script = tmp_path / "stand_in.py"
    wait = (f"import pathlib, sys, time\nfor _ in range(400):\n    if pathlib.Path({str(marker)!r}).exists(): break\n"
            "    time.sleep(0.05)\nelse:\n    sys.exit('meanwhile was not called before the check')\n")
    script.write_text(wait + STAND_IN.format(calls=str(tmp_path / "calls.jsonl"), read=[]))
    monkeypatch.setattr(vllm_validate, "SCRIPT", script)
    calls: list[int] = []
    planning.provision([seed], print, meanwhile=meanwhile)  # 2 environments: a process, overlapped
    assert calls == [1] and served == [] and len((tmp_path / "calls.jsonl").read_text().splitlines()) == 1
    planning.provision([alone], print, meanwhile=meanwhile)  # its own environment alone: the worker checks it
    assert calls == [1, 1] and len(served) == 1 and len((tmp_path / "calls.jsonl").read_text().splitlines()) == 1
    planning.provision([alone], print, meanwhile=meanwhile)  # cached: no check, nothing started meanwhile
    assert calls == [1, 1] and len(served) == 1
