"""A one-job run on a local store leaves MLflow to an uploader that trails its journal (oneknob.record.trail):
the command never imports MLflow, yet every run lands under the id it printed, with the status it ended with."""

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from helpers import (cli_command, cli_env, journal_records, mlflow_client, mlflow_runs, run_cli, start_cli,
                     stop_group, wait_for)

from oneknob.record import empty_store, trail

ONE = ("lengths=[200,300,400,600]", "samples=1", "search.suspects=false")


def _journal(tmp_path, name="one") -> Path:
    return tmp_path / name / "journal.jsonl"


def _printed_run(out: str) -> tuple[str | None, str]:
    """(experiment id, run id) of the MLflow link a one-job run ends with; no experiment id while its uploader
    had yet to make the experiment (MLflow's /runs/<id> route finds it)."""
    found = re.search(r"MLflow \(make ui, then open\): http://127.0.0.1:5000/#/(?:experiments/(\d+)/)?runs/([0-9a-f]{32})"
                      r"\?workflowType=machine_learning$", out, re.M)
    assert found, out
    return found[1], found[2]


def _uploaders(tmp_path) -> list[int]:
    """The uploaders of this test's store (their entry is under tmp_path), not another test's."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes() if proc.name.isdigit() else b""
            if b"oneknob.record.uploader" in command and str(tmp_path).encode() in command:
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_one_job_run_never_imports_mlflow_and_its_runs_land_as_the_journaled_calls_said(tmp_path):
    run_dir = tmp_path / "one"
    done = subprocess.run([cli_command()[0], "-X", "importtime", *cli_command(*ONE, f"hydra.run.dir={run_dir}")[1:]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180, env=cli_env())
    assert done.returncode == 0, done.stdout + done.stderr
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "mlflow" not in imported and "sqlalchemy" not in imported and "oneknob" in imported
    experiment_id, run_id = _printed_run(done.stdout + done.stderr)

    client = mlflow_client(tmp_path)  # waits for the uploader
    assert experiment_id is None  # a new store: the command did not wait for the uploader to make it
    assert client.get_experiment_by_name("oneknob-synthetic").experiment_id == client.get_run(run_id).info.experiment_id
    started = journal_records(_journal(tmp_path), "run")
    assert {r["run_id"] for r in started} >= {run_id} and all(r["trail"] for r in started)  # the reference too
    for record in started:
        run = client.get_run(record["run_id"])
        end = next(r for r in journal_records(_journal(tmp_path), "end") if r["run_id"] == record["run_id"])
        assert run.info.status == end["status"] == "FINISHED"
        assert run.info.start_time == int(record["time"] * 1000) and run.info.end_time == int(end["time"] * 1000)
    assert "done" in (run_dir / "upload.log").read_text()
    assert not list((tmp_path / "mlruns" / ".mlflow.db.uploads").iterdir())  # nothing left in flight

    # the same job with the command writing MLflow itself: the same record
    rc, out = run_cli(tmp_path, *ONE, "tracking.trail=false", "cache=false", "hydra.run.dir=sync")
    assert rc == 0, out
    assert not (tmp_path / "sync" / "upload.log").exists()
    assert not any("trail" in r for r in journal_records(_journal(tmp_path, "sync"), "run"))
    experiment_id, written_id = _printed_run(out)
    assert experiment_id == client.get_run(written_id).info.experiment_id  # known by now
    trailed, written = (client.get_run(run_id), client.get_run(written_id))
    assert trailed.data.params == written.data.params
    assert {k: v for k, v in trailed.data.tags.items() if k != "oneknob.process"} == \
        {k: v for k, v in written.data.tags.items() if k != "oneknob.process"}
    assert trailed.data.metrics.keys() == written.data.metrics.keys()
    for key in ("nll", "delta_nll"):
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, key)] == \
            [(m.step, m.value) for m in client.get_metric_history(written.info.run_id, key)]
    assert sorted(a.path for a in client.list_artifacts(run_id)) == \
        sorted(a.path for a in client.list_artifacts(written.info.run_id))


@pytest.mark.slow  # a job killed mid-run
def test_a_killed_one_job_command_leaves_its_run_killed_with_every_journaled_point(tmp_path):
    proc = start_cli(tmp_path, *ONE, "reference=null", "engine.fault.delay_s=0.3", "hydra.run.dir=one")
    try:
        wait_for(lambda: len(journal_records(_journal(tmp_path), "point")) >= 2, timeout=60, what="two points")
    finally:
        stop_group(proc, signal.SIGKILL)  # the command's group; its uploader is in a session of its own
        proc.wait()
    [run] = mlflow_runs(tmp_path)  # once its uploader is done
    assert run.info.status == "KILLED"
    assert "left RUNNING by process" in run.data.tags["oneknob.stale"]
    journaled = {m[2] for r in journal_records(_journal(tmp_path), "metrics") for m in r["metrics"] if m[0] == "nll"}
    uploaded = {m.step for m in mlflow_client(tmp_path).get_metric_history(run.info.run_id, "nll")}
    assert journaled and uploaded == journaled


@pytest.mark.slow  # two jobs
def test_an_upload_whose_uploader_died_is_finished_by_the_next_one(tmp_path):
    proc = start_cli(tmp_path, *ONE, "reference=null", "engine.fault.delay_s=0.3", "hydra.run.dir=one")
    mine = wait_for(lambda: _uploaders(tmp_path), timeout=60, what="the job's uploader")
    for pid in mine:
        os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=120) == 3  # EXIT_TRACKING: the command saw its uploader fail
    log = (tmp_path / "cli.log").read_text()
    assert "MLflow lacks part of it: python -m oneknob sync" in log, log
    run_id = re.search(r"MLflow run ([0-9a-f]{32})", log)[1]
    assert trail.wait(trail_uri := f"sqlite:///{tmp_path}/mlruns/mlflow.db", timeout_s=0)  # its entry is left
    # the next one-job run's uploader takes it over
    rc, out = run_cli(tmp_path, *ONE, "reference=null", "hydra.run.dir=two")
    assert rc == 0, out
    assert trail.wait(trail_uri) == []
    run = mlflow_client(tmp_path).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["points_measured"] > 0
    assert "taking over the upload of" in (tmp_path / "two" / "upload.log").read_text()


def test_without_an_empty_store_the_command_opens_mlflow_itself_and_later_runs_trail(tmp_path):
    """The first store under a new MLflow version is made by MLflow in the command (its errors stop it there);
    the template it leaves lets the next run trail."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    rc, out = run_cli(tmp_path, *ONE, "reference=null", "hydra.run.dir=first", env=env)
    assert rc == 0, out
    assert not (tmp_path / "first" / "upload.log").exists()
    rc, out = run_cli(tmp_path, *ONE, "reference=null", "hydra.run.dir=second", env=env)
    assert rc == 0, out
    assert (tmp_path / "second" / "upload.log").exists()
    assert len(mlflow_runs(tmp_path)) == 2


def test_usable_is_a_local_store_on_this_mlflows_schema(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert not trail.usable(f"sqlite:///{tmp_path}/mlflow.db")  # no template yet: MLflow makes the store
    template = empty_store.template()
    template.parent.mkdir(parents=True)
    with sqlite3.connect(template) as con:
        con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32))")
        con.execute("INSERT INTO alembic_version VALUES ('abc123')")
        con.execute("CREATE TABLE experiments (experiment_id INTEGER, name TEXT, lifecycle_stage TEXT)")
    assert trail.usable(f"sqlite:///{tmp_path}/new/mlflow.db")  # a new store: made from the template
    assert not trail.usable("http://127.0.0.1:5000") and not trail.usable("postgresql://u@h/db")
    assert not trail.usable("sqlite:////proc/nope/mlflow.db")  # no such directory can be made: the command refuses
    older = tmp_path / "older.db"
    shutil.copyfile(template, older)
    with sqlite3.connect(older) as con:
        con.execute("UPDATE alembic_version SET version_num = 'old'")
    assert not trail.usable(f"sqlite:///{older}")  # MLflow would migrate it: the command opens it itself
    shutil.copyfile(template, same := tmp_path / "same.db")
    assert trail.usable(f"sqlite:///{same}")
    (tmp_path / "garbage.db").write_text("not sqlite")
    assert not trail.usable(f"sqlite:///{tmp_path / 'garbage.db'}")
    with sqlite3.connect(same) as con:
        con.execute("INSERT INTO experiments VALUES (4, 'x', 'active'), (5, 'y', 'deleted')")
    assert trail.experiment_id(f"sqlite:///{same}", "x") == "4"
    assert trail.experiment_id(f"sqlite:///{same}", "y") is None


def test_wait_returns_at_once_for_other_stores_and_names_an_upload_nobody_finishes(tmp_path):
    assert trail.wait("http://127.0.0.1:5000") == [] and trail.wait(f"sqlite:///{tmp_path}/none.db") == []
    folder = tmp_path / ".mlflow.db.uploads"
    folder.mkdir()
    (entry := folder / "x.json").write_text(json.dumps({"journal": "j"}))
    start = time.monotonic()
    assert trail.wait(f"sqlite:///{tmp_path}/mlflow.db", timeout_s=5) == [entry]  # unlocked: its uploader is gone
    assert time.monotonic() - start < 1


def test_a_local_store_whose_directory_cannot_be_made_is_still_refused_before_anything_runs(tmp_path):
    rc, out = run_cli(tmp_path, *ONE, "tracking.uri=sqlite:////proc/nope/mlflow.db")
    assert rc == 2, out
    assert "tracking.uri=sqlite:////proc/nope/mlflow.db: the tracking store cannot be used" in out, out
    assert "nothing was started and no run was recorded" in out and not list(tmp_path.rglob("journal.jsonl"))


def test_the_uploader_replays_a_growing_journal_in_its_pauses_and_at_most_max_lag_behind():
    from oneknob.record.uploader import MAX_LAG_S, POLL_S, QUIET_S, Pace

    pace, now, size = Pace(), 0.0, 100
    assert pace.due(size, now) is False  # the run's first lines: written a moment ago
    now += QUIET_S
    assert pace.due(size, now) is True  # quiet since (an engine starting): replayed
    assert pace.due(size, now + POLL_S) is False  # nothing new
    replays, start = [], now + 1.0
    now = start
    while now < start + 3 * MAX_LAG_S:  # a job measuring: a point every poll
        size += 50
        if pace.due(size, now):
            replays.append(now - start)
        now += POLL_S
    assert replays and all(b - a <= MAX_LAG_S + POLL_S for a, b in zip([0.0, *replays], replays))
    assert len(replays) <= 3  # not one replay per poll while it grows
    assert pace.due(size, now + QUIET_S) is True  # the job's end: the rest goes at once
