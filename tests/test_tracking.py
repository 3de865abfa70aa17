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
