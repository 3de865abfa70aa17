"""Isolation: a worker that crashes or hangs fails its job only; Ctrl-C stops the worker and keeps points.

Lengths [200, 300, 400, 600] put the two jobs' bisections in different places:
capture=256 probes 250 (between 200 and 300), capture=512 never does. So a
fault at 250 hits the first job only, and the second shows the sweep went on.
A test that acts mid-run waits for a state it can see (a worker log's line,
a workers.jsonl record, a journal), never for a fixed time.
"""

import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from helpers import (RUN_PY, cache_points, job_journals, job_plan, journal_records, metric_steps, mlflow_client,
                     mlflow_runs, process_gone, process_tree, python_module, run_cli, run_python, start_cli, wait_for,
                     worker_records)

from oneknob.config.schema import REPO_ROOT
from oneknob.run.executor import Worker
from oneknob.run.procs import descendants

# search.suspects=false: these tests inject faults at lengths the plain grid + bisection probes (the suspect
# probes of the capture sizes, 256|257 and 512|513, would settle the search before it reaches them)
SWEEP = ("cudagraph.capture=256,512", "lengths=[200,300,400,600]", "samples=1", "search.suspects=false")


def _jobs_by_capture(tmp_path):
    return {int(r.data.params["knob.cudagraph.capture"]): r for r in mlflow_runs(tmp_path, role="job")}


def _artifact_text(tmp_path, run_id, name):
    path = mlflow_client(tmp_path).download_artifacts(run_id, name, str(tmp_path / f"dl-{run_id}"))
    return open(path).read()


def _crashed_sweep(tmp_path) -> str:
    rc, out = run_cli(tmp_path, *SWEEP, "engine.fault.crash_at_length=250", multirun=True)
    assert rc == 1, out
    return out


def test_crash_mid_sweep_fails_one_job_keeps_its_points_and_the_sweep_goes_on(tmp_path):
    out = _crashed_sweep(tmp_path)
    assert "1 of 2 job(s) failed" in out and "exited with code 4 during request of 250 tokens" in out, out
    jobs = _jobs_by_capture(tmp_path)
    crashed, survived = jobs[256], jobs[512]  # 256 is the baseline (the list's first value): it runs first
    assert crashed.info.status == "FAILED" and survived.info.status == "FINISHED"
    assert "exited with code 4" in crashed.data.tags["oneknob.error"]
    assert "injected crash at length 250" in _artifact_text(tmp_path, crashed.info.run_id, "worker.log")
    assert "injected crash at length 250" in _artifact_text(tmp_path, crashed.info.run_id, "error.txt")
    # the points measured before the crash are kept: MLflow, journal, cache
    assert metric_steps(tmp_path, crashed.info.run_id) == [200, 300, 400, 600]
    journal = job_journals(tmp_path)[0]
    assert sorted(p["length"] for p in journal_records(journal, "point")) == [200, 300, 400, 600]
    assert sum(len(points) for points in cache_points(tmp_path).values()) == 4 + 11
    assert "retry: python" in out


@pytest.mark.slow
def test_the_printed_retry_command_remeasures_only_the_failed_job(tmp_path):
    out = _crashed_sweep(tmp_path)
    retry = [line.split("retry: ", 1)[1].split("  (")[0] for line in out.splitlines() if "retry: " in line]
    assert len(retry) == 1, out
    command = shlex.split(retry[0])
    assert command[0] == "python" and command[1].endswith("run.py") and command[2] == "-m", command
    assert "cudagraph.capture=256,512" in command, command
    command[:2] = [sys.executable, str(RUN_PY)]
    starts = len(worker_records(tmp_path, "start", role="job"))
    again = run_python(command[1:], tmp_path, timeout=120)
    assert again.returncode == 1, again.stderr  # the same injected crash fails the same job again
    assert "1 of 2 job(s) failed" in again.stderr and "baseline: failed" in again.stderr
    assert "cudagraph.capture=512: polluted->clean at 512|513" in again.stderr
    assert "11 cached / 0 measured" in again.stderr  # the finished job came from the cache ...
    assert len(worker_records(tmp_path, "start", role="job")) == starts + 1  # ... and started no engine
    fixed = run_python(command[1:] + ["engine.fault.crash_at_length=null"], tmp_path, timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    assert "polluted->clean at 256|257" in fixed.stderr and "4 cached / 6 measured" in fixed.stderr, fixed.stderr
    retried = [r for r in mlflow_runs(tmp_path, role="job") if r.info.status == "FINISHED"
               and r.data.params["knob.cudagraph.capture"] == "256"]
    assert len(retried) == 1 and metric_steps(tmp_path, retried[0].info.run_id) == [
        200, 250, 256, 257, 259, 262, 275, 300, 400, 600]


def test_hang_hits_the_request_timeout_and_the_sweep_goes_on(tmp_path):
    started = time.monotonic()
    rc, out = run_cli(tmp_path, *SWEEP, "engine.fault.hang_at_length=250", "engine.request_timeout_s=1",
                      multirun=True)
    assert rc == 1, out
    assert time.monotonic() - started < 60  # a hung worker is killed at once, not after a grace period
    jobs = _jobs_by_capture(tmp_path)
    hung = jobs[256]
    assert hung.info.status == "FAILED" and jobs[512].info.status == "FINISHED"
    assert "request of 250 tokens timed out after 1 s" in hung.data.tags["oneknob.error"]
    assert "injected hang at length 250" in _artifact_text(tmp_path, hung.info.run_id, "worker.log")
    assert metric_steps(tmp_path, hung.info.run_id) == [200, 300, 400, 600]
    for stop in worker_records(tmp_path, "stop"):
        assert_dead(stop["pid"])


def test_crash_during_engine_start_fails_each_job_with_its_log(tmp_path):
    rc, out = run_cli(tmp_path, *SWEEP, "engine.fault.crash_on_start=true", "reference=null", multirun=True)
    assert rc == 1, out
    assert "2 of 2 job(s) failed" in out and out.count("retry: python") == 1, out
    jobs = mlflow_runs(tmp_path, role="job")
    assert len(jobs) == 2 and all(r.info.status == "FAILED" for r in jobs)
    for run in jobs:
        assert "exited with code 3 during engine start" in run.data.tags["oneknob.error"]
        assert "injected crash during start" in _artifact_text(tmp_path, run.info.run_id, "worker.log")
    assert len(worker_records(tmp_path, "start", role="job")) == 2  # the second job was still tried
    parent = mlflow_runs(tmp_path, role="sweep")[0]
    assert parent.info.status == "FAILED"


def assert_dead(pid: int) -> None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    # a zombie is dead too (reaped by its parent later)
    with open(f"/proc/{pid}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] == "Z", f"worker {pid} still alive"


def _logged(path_glob: str, tmp_path, text: str) -> bool:
    return any(text in p.read_text(errors="replace") for p in tmp_path.glob(path_glob))


def _interrupt(proc, tmp_path, worker: int) -> int:
    """One Ctrl-C (SIGINT to the CLI's process group, as a terminal sends it); the CLI's exit code. The hung
    `worker` gets no grace period (30 s): it is stopped within seconds of the signal, as its stop record's time
    says (the CLI's own exit, MLflow included, is given longer: a loaded machine slows it, not the kill)."""
    try:
        sent = time.time()
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    (stopped,) = [r["time"] for r in worker_records(tmp_path, "stop") if r["pid"] == worker]
    assert stopped - sent < 20, f"the hung worker was stopped {stopped - sent:.1f} s after Ctrl-C: it was waited for"
    return code


def test_one_ctrl_c_stops_the_worker_keeps_points_and_marks_the_run_killed(tmp_path):
    proc = start_cli(tmp_path, *SWEEP, "engine.fault.hang_at_length=250", multirun=True)
    try:  # the job measures 200, 300, 400 and 600, then hangs on 250: interrupted there, every time
        wait_for(lambda: _logged("multirun/*/0/worker.log", tmp_path, "injected hang at length 250"),
                 timeout=60, what="the job's worker hanging at 250")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    worker = worker_records(tmp_path, "start", role="job")[-1]["pid"]
    rc = _interrupt(proc, tmp_path, worker)
    out = (tmp_path / "cli.log").read_text()
    assert rc == 130, out
    assert "interrupted" in out and "Traceback" not in out, out
    assert_dead(worker)
    assert any(r["pid"] == worker for r in worker_records(tmp_path, "stop"))
    job = mlflow_runs(tmp_path, role="job")[0]
    assert job.info.status == "KILLED"
    assert mlflow_runs(tmp_path, role="sweep")[0].info.status == "KILLED"
    kept = sorted(p["length"] for p in journal_records(job_journals(tmp_path)[0], "point"))
    assert kept == [200, 300, 400, 600]
    # journal first: MLflow gets metrics in batches, so it may lack the last points ...
    assert set(metric_steps(tmp_path, job.info.run_id)) <= set(kept)
    rc, synced = python_module(tmp_path, "oneknob", "sync")
    assert rc == 0, synced
    assert metric_steps(tmp_path, job.info.run_id) == kept  # ... and sync brings MLflow level
    assert sum(len(points) for points in cache_points(tmp_path).values()) == len(kept)
    assert len(mlflow_runs(tmp_path, role="job")) == 1  # the second job never started


def test_ctrl_c_while_the_reference_is_measured_marks_the_reference_run_killed(tmp_path):
    # the reference measures 200, then hangs on 600 (its longest length): interrupted there, every time
    proc = start_cli(tmp_path, *SWEEP, "engine.fault.hang_at_length=600", multirun=True)
    try:
        wait_for(lambda: _logged(".cache/oneknob/references/*.worker.log", tmp_path, "injected hang at length 600"),
                 timeout=60, what="the reference's worker hanging at 600")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    [worker] = [r["pid"] for r in worker_records(tmp_path, "start", role="reference")]
    rc = _interrupt(proc, tmp_path, worker)
    out = (tmp_path / "cli.log").read_text()
    assert rc == 130, out
    assert "Traceback" not in out, out
    assert_dead(worker)
    # the sweep measures the reference before the baseline's job takes the host's one device set: no job run began
    assert {r.data.tags["oneknob.role"]: r.info.status for r in mlflow_runs(tmp_path)} == {
        "reference": "KILLED", "sweep": "KILLED"}
    assert not list(tmp_path.glob(".cache/oneknob/references/*/*.json"))  # nothing half-measured is kept


def test_stopping_a_worker_kills_its_descendants_in_a_session_of_their_own(tmp_path):
    """killpg reaches the worker's process group only; a child that called setsid() is found under /proc."""
    escaped = tmp_path / "escaped.pid"
    python = tmp_path / "python"  # the worker's interpreter, which first starts a child that leaves the group
    python.write_text(f"#!/bin/sh\n{sys.executable} -c 'import os, sys, time; os.setsid(); "
                      f"open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(600)' {escaped} &\n"
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    plan = job_plan(tmp_path, "cudagraph.capture=256")
    worker = Worker(dict(plan.worker, knobs=plan.knobs), tmp_path / "worker.log", start_timeout_s=60,
                    request_timeout_s=60, python=str(python))
    worker.start()
    pid = int(wait_for(lambda: escaped.exists() and escaped.read_text(), timeout=30, what="the escaped child"))
    try:
        assert pid in descendants(worker.proc.pid) and os.getsid(pid) != os.getsid(worker.proc.pid)
        worker.stop()
        assert_dead(pid)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)  # our own child's child, if the executor left it
        except ProcessLookupError:
            pass


def test_a_ctrl_c_during_a_workers_graceful_stop_still_ends_the_worker(tmp_path):
    """The signal lands while stop() waits for the worker to wind down (the end of a job): the interrupt unwinds
    only after the worker's process group is killed and reaped (it was left running, and the engine with it)."""
    plan = job_plan(tmp_path, "cudagraph.capture=256")
    worker = Worker(dict(plan.worker, knobs=plan.knobs), tmp_path / "worker.log", start_timeout_s=60,
                    request_timeout_s=60)
    worker.start()
    proc, wait = worker.proc, worker.proc.wait

    def interrupted_wait(timeout=None):
        if timeout is not None and timeout > 10:  # the graceful wait (30 s; _end's are 10 s and unbounded), as a
            # Ctrl-C arriving then would end it
            raise KeyboardInterrupt
        return wait(timeout=timeout)

    proc.wait = interrupted_wait
    with pytest.raises(KeyboardInterrupt):
        worker.stop()
    assert proc.returncode is not None and worker.proc is None
    assert_dead(proc.pid)


def hanging_checkpoint(tmp_path) -> Path:
    """The tiny model's config and tokenizer, and a weights file that is a FIFO nobody writes: vLLM's engine core
    blocks in open() when it loads the weights, so its start never ends, however fast or slow the machine."""
    from oneknob.provision import tiny_model

    source, model = tiny_model.ensure(REPO_ROOT / "models" / "tiny-mtp"), tmp_path / "hanging-model"
    model.mkdir()
    for name in ("config.json", "generation_config.json", "special_tokens_map.json", "tokenizer.json",
                 "tokenizer_config.json"):
        shutil.copyfile(source / name, model / name)
    os.mkfifo(model / "model.safetensors")
    return model


@pytest.mark.slow
@pytest.mark.vllm
def test_a_vllm_worker_timing_out_on_start_fails_its_job_and_leaves_no_engine_process(tmp_path):
    """An engine start that hangs once vLLM's engine core loads the weights (hanging_checkpoint), capped at 120 s:
    the engine core is up well before the cap (~25 s on an idle 2-core machine), so the kill finds vLLM's processes
    mid-start. A cap that raced the start instead (25 s on a model that loads) was reached before vLLM had started
    any process on a loaded machine, and then checked nothing of vLLM's. ~150 s alone, ~220 s in the suite."""
    proc = start_cli(tmp_path, "cudagraph.capture=256", "lengths=[128]", "samples=1", "reference=null",
                     f"model.path={hanging_checkpoint(tmp_path)}", "model.build=null", "engine.start_timeout_s=120",
                     multirun=True, engine="vllm")
    seen: dict[int, tuple[str, str]] = {}
    since: dict[int, float] = {}  # when each was first seen, seconds after the CLI started

    def ended() -> bool:  # every process the CLI ever had below it, until it exits
        found = process_tree(proc.pid)
        seen.update(found)
        for pid in found:
            since.setdefault(pid, round(time.monotonic() - started, 1))
        return proc.poll() is not None

    started = time.monotonic()
    try:
        wait_for(ended, timeout=400, every=0.2, what="the sweep to end")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = (tmp_path / "cli.log").read_text()
    assert proc.returncode == 1, out
    jobs = mlflow_runs(tmp_path, role="job")
    assert len(jobs) == 1 and jobs[0].info.status == "FAILED", out
    assert "engine start timed out after 120 s" in jobs[0].data.tags["oneknob.error"]
    workers = [r["pid"] for r in worker_records(tmp_path, "start", role="job")]
    assert len(workers) == 1 and set(workers) <= set(seen)
    # vLLM's engine core, blocked on the weights: spawned by multiprocessing, renamed by setproctitle soon after
    engines = [pid for pid, (_, cmdline) in seen.items() if "EngineCore" in cmdline or "spawn_main" in cmdline]
    assert engines, f"no vLLM engine core was seen below the worker: {seen}, first seen at (s): {since}"
    alive = {pid: cmdline for pid, (ticks, cmdline) in seen.items() if not process_gone(pid, ticks)}
    assert not alive, alive
