"""Isolation: a worker that crashes or hangs fails its job only; Ctrl-C stops the worker and keeps points.

Lengths [200, 300, 400, 600] put the two jobs' bisections in different places:
capture=256 probes 250 (between 200 and 300), capture=512 never does. So a
fault at 250 hits the first job only, and the second shows the sweep went on.
"""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from helpers import (RUN_PY, cache_points, cli_env, job_journals, journal_records, metric_steps, mlflow_client,
                     mlflow_runs, python_module, run_cli, start_cli, wait_for, worker_records)

SWEEP = ("cudagraph.capture=256,512", "lengths=[200,300,400,600]", "samples=1")


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
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=cli_env())
    assert again.returncode == 1, again.stderr  # the same injected crash fails the same job again
    assert "1 of 2 job(s) failed" in again.stderr and "baseline: failed" in again.stderr
    assert "cudagraph.capture=512: polluted->clean at 512|513" in again.stderr
    assert "11 cached / 0 measured" in again.stderr  # the finished job came from the cache ...
    assert len(worker_records(tmp_path, "start", role="job")) == starts + 1  # ... and started no engine
    fixed = subprocess.run(command + ["engine.fault.crash_at_length=null"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env=cli_env())
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


def test_one_ctrl_c_stops_the_worker_keeps_points_and_marks_the_run_killed(tmp_path):
    proc = start_cli(tmp_path, *SWEEP, "engine.fault.delay_s=0.3", multirun=True)
    try:
        wait_for(lambda: job_journals(tmp_path) and len(journal_records(job_journals(tmp_path)[0], "point")) >= 2,
                 timeout=60, what="two journaled points")
        worker = worker_records(tmp_path, "start", role="job")[-1]["pid"]
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: once
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = (tmp_path / "cli.log").read_text()
    assert rc != 0, out
    assert "interrupted" in out, out
    assert_dead(worker)
    assert any(r["pid"] == worker for r in worker_records(tmp_path, "stop"))
    job = mlflow_runs(tmp_path, role="job")[0]
    assert job.info.status == "KILLED"
    assert mlflow_runs(tmp_path, role="sweep")[0].info.status == "KILLED"
    kept = sorted(p["length"] for p in journal_records(job_journals(tmp_path)[0], "point"))
    # journal first: the interrupt may fall between a point's journal line and its MLflow write ...
    assert len(kept) >= 2 and set(metric_steps(tmp_path, job.info.run_id)) <= set(kept)
    rc, synced = python_module(tmp_path, "oneknob.sync")
    assert rc == 0, synced
    assert metric_steps(tmp_path, job.info.run_id) == kept  # ... and sync brings MLflow level
    assert sum(len(points) for points in cache_points(tmp_path).values()) == len(kept)
    assert len(mlflow_runs(tmp_path, role="job")) == 1  # the second job never started
