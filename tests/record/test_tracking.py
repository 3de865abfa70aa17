"""The tracking store's pre-flight: which store (tracking.uri, $MLFLOW_TRACKING_URI, the local SQLite), what it refuses,
and concurrency (no MLflow server needed)."""

import multiprocessing as mp
import re

import pytest

from oneknob.record.tracking import resolve_uri


def _probe_many(mlruns: str, times: int) -> None:
    for _ in range(times):
        resolve_uri(None, mlruns)


def test_concurrent_sweeps_do_not_trip_each_others_write_probe(tmp_path):
    """Two sweeps starting at once on one fresh mlruns/ must both pass the writability check."""
    context = mp.get_context("fork")
    workers = [context.Process(target=_probe_many, args=(str(tmp_path / "mlruns"), 300)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    assert list((tmp_path / "mlruns").iterdir()) == []  # every probe cleaned up


def test_the_store_is_tracking_uri_else_mlflow_tracking_uri_else_the_local_sqlite(tmp_path, monkeypatch):
    from oneknob.record.tracking import default_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    local = f"sqlite:///{(tmp_path / 'mlruns').resolve()}/mlflow.db"
    assert default_uri(tmp_path / "mlruns") == local
    assert resolve_uri(None, tmp_path / "mlruns") == local and (tmp_path / "mlruns").is_dir()  # probed
    env = f"sqlite:///{tmp_path}/elsewhere/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env)
    assert default_uri(tmp_path / "other") == env
    assert resolve_uri(None, tmp_path / "other") == env and not (tmp_path / "other").exists()  # not probed
    configured = "http://127.0.0.1:5000"
    assert resolve_uri(configured, tmp_path / "other") == configured  # tracking.uri wins


@pytest.mark.parametrize("uri,says", [
    ("file:///tmp/mlruns", "tracking.uri=file:///tmp/mlruns: MLflow refuses the plain file store"),
    ("mlruns", "tracking.uri=mlruns: MLflow refuses the plain file store"),
    ("ftp://host/x", "tracking.uri=ftp://host/x: not a tracking URI oneknob can use"),
])
def test_a_store_oneknob_cannot_use_is_refused_naming_it(tmp_path, uri, says):
    from oneknob.record.tracking import TrackingError

    with pytest.raises(TrackingError, match=re.escape(says)):
        resolve_uri(uri, tmp_path / "mlruns")


def _schema(db) -> dict:
    """A SQLite store's tables, schema version and rows that are not runs (artifact paths relative to it)."""
    import os
    import sqlite3

    con = sqlite3.connect(db)
    try:
        # as sets of lines: MLflow's own migrations write a table's constraints in varying order
        tables = {name: sorted(line.strip(" ,") for line in (sql or "").splitlines())
                  for name, sql in con.execute("SELECT name, sql FROM sqlite_master")}
        rows = {"alembic": con.execute("SELECT * FROM alembic_version").fetchall(),
                "workspaces": con.execute("SELECT * FROM workspaces").fetchall(),
                "experiments": [(i, name, where.replace(str(db.parent), "<store>").replace(os.getcwd(), "<cwd>"), stage)
                                for i, name, where, stage in con.execute(
                                    "SELECT experiment_id, name, artifact_location, lifecycle_stage "
                                    "FROM experiments ORDER BY experiment_id")]}
    finally:
        con.close()
    return {"tables": tables, "rows": rows}


def test_a_new_local_store_is_a_copy_of_an_empty_one_and_reads_as_mlflow_made_it(tmp_path, monkeypatch):
    """The first new store MLflow makes becomes the template (less the Default experiment); the next new store
    is a copy, which MLflow opens as its own: same tables, schema version and rows as a store MLflow made, the
    Default experiment under that store's own artifact root (MLflow adds it on open). A template MLflow's schema
    check refuses is not copied, and is made anew."""
    import sqlite3

    from oneknob.record import empty_store
    from oneknob.record.tracking import Tracker

    def edit(db, sql):
        con = sqlite3.connect(db)
        with con:
            con.execute(sql)
        con.close()

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    template = empty_store.template()
    assert template.parent == tmp_path / "xdg" / "oneknob" and not template.exists()
    for name in ("made", "copied", "native", "refused", "cwd"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # MLflow puts its Default experiment under the working directory's mlruns

    assert Tracker(f"sqlite:///{tmp_path}/made/mlflow.db", "oneknob").experiment_id == "1"  # MLflow's migrations
    assert template.is_file() and _schema(template)["rows"]["experiments"] == []  # no Default experiment
    edit(template, "CREATE TABLE copied_from_the_template (x INTEGER)")  # to tell a copy from a store MLflow made
    assert empty_store.seed(tmp_path / "no-such-folder" / "mlflow.db") is False  # left to MLflow's own error

    assert Tracker(f"sqlite:///{tmp_path}/copied/mlflow.db", "oneknob").experiment_id == "1"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other-cache"))  # no template: MLflow makes this one
    assert Tracker(f"sqlite:///{tmp_path}/native/mlflow.db", "oneknob").experiment_id == "1"
    copied, native = _schema(tmp_path / "copied" / "mlflow.db"), _schema(tmp_path / "native" / "mlflow.db")
    assert copied["tables"].pop("copied_from_the_template") and copied == native
    assert native["rows"]["experiments"][0] == (0, "Default", "<cwd>/mlruns/0", "active")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    edit(template, "UPDATE alembic_version SET version_num = 'not-a-revision'")
    assert Tracker(f"sqlite:///{tmp_path}/refused/mlflow.db", "oneknob").experiment_id == "1"
    assert _schema(tmp_path / "refused" / "mlflow.db") == native
    assert _schema(template)["rows"]["alembic"] == native["rows"]["alembic"]  # made anew from MLflow's store
