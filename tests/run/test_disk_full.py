"""A full disk during a job: the run still ends (FAILED, naming the disk), no temporary file is left behind,
and a sweep goes on with its next job. The disk fills at one write site at a time (tests/enospc.py makes
writes to chosen paths fail with ENOSPC, no privileges needed); the jobs run in process, from their plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from enospc import FullDisk, full_disk_env
from helpers import job_plan as plan_of
from helpers import mlflow_client, mlflow_runs, run_cli, seed_store, worker_records

from oneknob.study.job import run_job

JOB = ["cudagraph.capture=256", "lengths=[200,300]", "samples=1"]


@pytest.fixture
def job_plan(tmp_path, monkeypatch):
    """plan(overrides): one job's plan from the real configs, its store and cache in tmp_path."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    seed_store(tmp_path)
    return lambda *overrides: plan_of(tmp_path, *JOB, *overrides)


def _assert_ended_naming_the_disk(tmp_path, outcome, what: str) -> None:
    runs = mlflow_runs(tmp_path)
    assert runs and not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    [job] = [r for r in runs if r.data.tags.get("oneknob.role") == "job"]
    assert job.info.run_id == outcome["run_id"] and job.info.status == "FAILED"
    assert outcome["status"] == "failed" and job.data.tags["oneknob.status"] == "failed"
    error = job.data.tags["oneknob.error"]
    assert error == outcome["error"][:1000]
    assert error.startswith("disk full: cannot write ") and "No space left on device" in error, error
    assert what in error, error
    assert "the file system mounted at /" in error, error
    assert not list(tmp_path.rglob("*.tmp*")), list(tmp_path.rglob("*.tmp*"))


# (where the disk fills, what the error names, the trigger: None fills it on the first write there)
SITES = {
    "journal, first point": ("*/job/journal.jsonl", "/job/journal.jsonl", '"kind": "point"'),
    "point cache": ("*/.cache/oneknob/points/*/points.jsonl", "/points.jsonl", None),
    "cached resolved config": ("*/.cache/oneknob/points/*/meta.json*", "/meta.json", None),
    "resolved_config.json": ("*/job/resolved_config.json*", "/job/resolved_config.json", None),
    "points.csv": ("*/job/points.csv", "/job/points.csv", None),
    "result.json": ("*/job/result.json*", "/job/result.json", None),
    "artifact store": ("*/mlruns/artifacts/*/points.csv", "points.csv into MLflow's artifact store", None),
    "reference": ("*/.cache/oneknob/references/*.json*", "/.cache/oneknob/references/", None),
}


@pytest.mark.parametrize("site", SITES)
def test_a_full_disk_fails_the_job_with_a_run_that_ends_and_names_it(job_plan, tmp_path, monkeypatch, site):
    pattern, what, trigger = SITES[site]
    # a trailing upload copies artifacts in its own process: the full artifact store is this process's here
    trail = ("tracking.trail=false",) if site == "artifact store" else ()
    plan = job_plan(*trail) if site == "reference" else job_plan("reference=null", *trail)
    disk = FullDisk([pattern], trigger)
    disk.install(monkeypatch)
    outcome = run_job(plan, tmp_path / "job")  # never raises
    assert disk.hits, f"nothing was written to {pattern}"
    _assert_ended_naming_the_disk(tmp_path, outcome, what)
    if site == "reference":
        [reference] = mlflow_runs(tmp_path, role="reference")
        assert reference.info.status == "FAILED" and "No space left" in reference.data.tags["oneknob.error"]


def test_a_journal_that_cannot_take_the_run_fails_it_before_any_engine_starts(job_plan, tmp_path, monkeypatch):
    FullDisk(["*/job/journal.jsonl"]).install(monkeypatch)
    outcome = run_job(job_plan("reference=null"), tmp_path / "job")
    _assert_ended_naming_the_disk(tmp_path, outcome, "the journal")
    assert worker_records(tmp_path, "start") == []


def test_an_error_txt_the_disk_cannot_take_leaves_the_engine_error(job_plan, tmp_path, monkeypatch):
    FullDisk(["*/job/error.txt"]).install(monkeypatch)
    outcome = run_job(job_plan("reference=null", "engine.fault.crash_at_length=300"), tmp_path / "job")
    [job] = mlflow_runs(tmp_path, role="job")
    assert job.info.status == "FAILED" and "exited with code 4" in job.data.tags["oneknob.error"]
    assert outcome["bookkeeping"][0].startswith("disk full: cannot write error.txt"), outcome
    assert not (tmp_path / "job" / "error.txt").exists()  # not an empty or truncated one


def test_a_resumed_job_does_not_log_its_failed_attempts_error(job_plan, tmp_path):
    failed = run_job(job_plan("reference=null", "engine.fault.crash_at_length=300"), tmp_path / "job")
    assert failed["status"] == "failed" and (tmp_path / "job" / "error.txt").exists()
    resumed = run_job(job_plan("reference=null"), tmp_path / "job")  # the same job dir, as a rerun with
    assert resumed["status"] == "ok"                                 # a fixed hydra.sweep.dir gives it
    client = mlflow_client(tmp_path)
    logged = {a.path for a in client.list_artifacts(resumed["run_id"])}
    assert "error.txt" not in logged and "error.previous.txt" not in logged, logged
    assert "exited with code 4" in (tmp_path / "job" / "error.previous.txt").read_text()
    assert not (tmp_path / "job" / "error.txt").exists()
    assert "oneknob.error" not in client.get_run(resumed["run_id"]).data.tags


def test_a_full_disk_in_one_job_of_a_cli_sweep_fails_it_alone_without_a_traceback(tmp_path):
    rc, out = run_cli(tmp_path, "cudagraph.capture=256,512", "lengths=[200,300]", "samples=1",
                      "hydra.sweep.dir=s", multirun=True, env=full_disk_env(f"{tmp_path}/s/0/result.json*"))
    assert rc == 1, out
    assert "Traceback" not in out, out
    assert "1 of 2 job(s) failed" in out and f"disk full: cannot write {tmp_path}/s/0/result.json" in out, out
    runs = mlflow_runs(tmp_path)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    jobs = {r.info.run_name: r for r in mlflow_runs(tmp_path, role="job")}
    assert jobs["baseline"].info.status == "FAILED" and jobs["cudagraph.capture=512"].info.status == "FINISHED"
    assert "No space left on device" in jobs["baseline"].data.tags["oneknob.error"]
    assert not list(tmp_path.rglob("*.tmp*"))
    assert json.loads(Path(tmp_path, "s/1/result.json").read_text())["status"] == "ok"
