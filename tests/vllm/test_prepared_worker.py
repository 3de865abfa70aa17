"""The one job's worker is started while vLLM's configuration check runs, and the check runs in it.

A one-job command whose configuration vLLM has not checked on this machine paid two `import vllm` before its
engine's first request: the check's process, then the worker's. Now the worker starts as the check is due
(`provision(meanwhile=...)`, oneknob.run.prepared), imports its engine, checks its own environment's configurations in
a fork of itself (vllm_introspect.validate_imported) and starts its engine only when the job asks, after every
configuration was accepted. A worker that is never started records no engine start and is ended.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import IN_PROCESS, job_plan, own_user_cache, run_cli, worker_records

from oneknob.run.executor import Worker


def _worker(tmp_path, name="worker"):
    plan = job_plan(tmp_path, "cudagraph.capture=256")
    return Worker(dict(plan.worker, knobs=plan.knobs), tmp_path / f"{name}.log", start_timeout_s=60,
                  request_timeout_s=60, record_path=tmp_path / f"{name}.jsonl")


def _events(path: Path) -> list[str]:
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_prepared_worker_starts_its_engine_only_when_asked(tmp_path):
    worker = _worker(tmp_path)
    worker.prepare()
    assert worker.proc.poll() is None and _events(tmp_path / "worker.jsonl") == []  # no engine start recorded
    ready = worker.start()
    assert ready.pid == worker.proc.pid and _events(tmp_path / "worker.jsonl") == ["start"]
    assert len(worker.score([i % 200 + 1 for i in range(300)])["logprobs"]) == 299
    worker.stop()
    assert _events(tmp_path / "worker.jsonl") == ["start", "stop"]


@pytest.mark.parametrize("grace_s", [30.0, 0.0])
def test_a_prepared_worker_never_started_ends_and_records_nothing(tmp_path, grace_s):
    worker = _worker(tmp_path)
    worker.prepare()
    proc = worker.proc
    worker.stop(grace_s=grace_s)
    assert proc.returncode == (0 if grace_s else -15) and worker.proc is None  # said bye, or was terminated
    assert not (tmp_path / "worker.jsonl").exists()


def test_a_prepared_worker_serves_only_its_own_interpreter_and_environment_and_goes_to_its_job(tmp_path):
    """oneknob.run.prepared: vllm_validate's checker is offered for the worker's interpreter and knob environment
    only; a sweep's job takes the worker offered for its directory and knobs; one not taken is ended, its log
    gone when this process made it and kept when it was there before."""
    from oneknob.config import knobs
    from oneknob.run import prepared as prepared_mod

    vllm_plan = job_plan(tmp_path / "vllm", "runner=v1", engine="vllm")
    on_vllm = prepared_mod.Prepared(vllm_plan, tmp_path / "vllm")
    build = {"PATH": "/bin"}
    on_vllm.worker = Worker(dict(vllm_plan.worker, knobs=vllm_plan.knobs, engine="vllm"), tmp_path / "unused.log",
                            start_timeout_s=60, request_timeout_s=60, env=build)  # no process needed to offer a check
    python = on_vllm.worker.python
    own = knobs.engine_args(vllm_plan.knobs, vllm_plan.worker["settings"]).env
    assert own == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert on_vllm.checker(python, build, [own]) is not None
    assert on_vllm.checker(python, build, [{}, own]) is not None  # the others forked with their variables
    assert on_vllm.checker("/elsewhere/python", build, [own]) is None and on_vllm.checker(python, build, [{}]) is None
    # the same interpreter with a patched copy's overlay on PYTHONPATH is another build
    assert on_vllm.checker(python, dict(build, PYTHONPATH="/builds/patched"), [own]) is None
    plan = job_plan(tmp_path, "runner=v1")
    prepared = prepared_mod.Prepared(plan, tmp_path / "0")
    checker = prepared()
    worker = prepared.worker
    assert checker(worker.python, worker.env, [own]) is None  # the synthetic engine checks nothing itself
    prepared.offer()
    assert prepared_mod.take(tmp_path / "1", plan.knobs) is None  # another job's directory
    assert prepared_mod.take(tmp_path / "0", dict(plan.knobs, runner="v2")) is None  # other knobs
    assert prepared_mod.take(tmp_path / "0", plan.knobs) is worker
    assert prepared_mod.take(tmp_path / "0", plan.knobs) is None  # once
    worker.start()  # the job's session started it: discard leaves it to the session
    prepared.discard()
    assert worker.proc is not None and worker.proc.poll() is None
    worker.stop()
    again = prepared_mod.Prepared(plan, tmp_path / "0")
    again()
    again.offer()
    proc = again.worker.proc
    again.discard()  # no job took it
    assert proc.poll() is not None and prepared_mod.take(tmp_path / "0", plan.knobs) is None
    assert (tmp_path / "0" / "worker.log").exists()  # the first worker's log: made before `again`
    fresh = prepared_mod.Prepared(plan, tmp_path / "sweep" / "0")
    fresh()
    fresh.discard()
    assert not (tmp_path / "sweep").exists()  # the folders it made for its log go with it (a refusal)


def test_a_job_whose_configuration_needs_no_check_still_has_its_worker_import_its_engine_ahead(tmp_path):
    """No check is due (the synthetic engine checks nothing; on vLLM, a configuration checked on this machine before):
    the job's worker is still started as soon as the configuration is accepted, so its engine's import overlaps the
    job's setup (the store, its files) rather than following it; it is the job's one worker, and it measures. A
    dry run starts none."""
    rc, out = run_cli(tmp_path / "one", "lengths=[64]", "samples=1", "reference=null")
    assert rc == 0, out
    (log,) = (tmp_path / "one").rglob("worker.log")
    marks = [line for line in log.read_text().splitlines() if line.startswith("oneknob: worker started")]
    assert marks == ["oneknob: worker started (job, importing its engine ahead)"], log.read_text()[-2000:]
    assert len(worker_records(tmp_path / "one", event="start")) == 1
    rc, out = run_cli(tmp_path / "dry", "lengths=[64]", "samples=1", "reference=null", "dry_run=true")
    assert rc == 0 and not list((tmp_path / "dry").rglob("worker.log")), out


def test_a_fork_of_the_worker_checks_another_environment_only_where_vllms_import_did_not_read_what_differs():
    """vllm_introspect._against: a reference whose environment differs from the job's worker in a VLLM_* variable
    vLLM's import never read is checked in a fork of that worker (the variable changed there); one that differs
    in a variable the import read, or in one not VLLM_* (C code may read it at load), or any difference where the
    import iterated the whole environment, needs an import of its own."""
    from oneknob.engines.vllm.standalone.introspect import _against

    imported = {"PATH": "/bin", "VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_TARGET_DEVICE": "cpu"}
    read = ["VLLM_TARGET_DEVICE", "VLLM_PLUGINS"]
    reference = {"PATH": "/bin", "VLLM_TARGET_DEVICE": "cpu", "VLLM_X": "1"}
    assert _against(imported, reference, read, False) == ({"VLLM_USE_V2_MODEL_RUNNER": None, "VLLM_X": "1"}, [])
    assert _against(imported, dict(imported, VLLM_TARGET_DEVICE="cuda"), read, False) == (
        {"VLLM_TARGET_DEVICE": "cuda"}, ["VLLM_TARGET_DEVICE"])
    assert _against(imported, dict(imported, VLLM_PLUGINS="x"), read, False)[1] == ["VLLM_PLUGINS"]  # read, unset
    assert _against(imported, dict(imported, OMP_NUM_THREADS="2"), read, False)[1] == ["OMP_NUM_THREADS"]
    assert _against(imported, reference, read, True)[1] == ["VLLM_USE_V2_MODEL_RUNNER", "VLLM_X"]
    assert _against(imported, dict(imported), read, True) == ({}, [])  # its own environment: always a fork


def _worker_processes(marker: str) -> list[int]:
    """PIDs of oneknob workers whose environment holds `marker` (this test's own machine cache)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except (OSError, ValueError):
            continue
        if b"oneknob.run.worker" in cmdline and marker.encode() in environ:
            found.append(int(entry))
    return found


@pytest.mark.slow
@pytest.mark.vllm
def test_vllms_check_runs_in_the_jobs_worker_which_then_starts_or_is_ended(tmp_path):
    """Real vLLM, a machine cache of checks of the test's own: the check is done by the job's worker (no check
    process), whose engine then starts and measures (oneknob's plugin still loads: the check ran in a fork); a
    configuration vLLM refuses is refused the same way, and its worker is ended with no engine started."""
    cache = tmp_path / "machine"
    env = {**own_user_cache(cache), **IN_PROCESS}
    for name, multirun, k in (("one", False, 0), ("sweep", True, 1)):  # a command's one job; a sweep's baseline
        rc, out = run_cli(tmp_path / name, "lengths=[64]", "samples=1", "reference=null", f"spec.k={k}",
                          "oracles=[nll]", multirun=multirun, engine="vllm", timeout=900, env=env)
        assert rc == 0, out
        assert "vLLM checks 1 configuration(s) in the job's worker" in out and "in one process" not in out, out
        assert len(worker_records(tmp_path / name)) == len(worker_records(tmp_path / name, event="stop")) == 1
        (log,) = (tmp_path / name).rglob("worker.log")  # the prepared worker's log is its job's, and only one
        assert log.read_text().count("oneknob: worker started") == 1
        assert (log.parent / "resolved_config.json").exists()  # the job's own directory
    rc, out = run_cli(tmp_path / "refused", "lengths=[64]", "samples=1", "reference=null", "spec.k=0",
                      "engine_args.max_num_batched_tokens=256", "engine_args.enable_chunked_prefill=false",
                      engine="vllm", timeout=900, env=env)
    said = " ".join(out.split())
    assert rc == 2 and "engine_args.max_num_batched_tokens=256: vLLM 0.32.0 refuses it:" in said, out
    assert "vLLM checks 1 configuration(s) in the job's worker" in said and "nothing was started" in said
    assert worker_records(tmp_path / "refused") == []
    assert not list((tmp_path / "refused").rglob("worker.log"))  # the command made it: gone with the worker
    assert _worker_processes(str(cache)) == []
