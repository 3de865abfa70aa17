"""Journal first, MLflow second: an unreachable store at the start refuses; mid-run the job goes on, then sync."""

import os
import signal
import subprocess
import sys

import pytest
from helpers import (free_port, job_journals, journal_records, metric_steps, mlflow_runs, python_module, run_cli,
                     start_cli, wait_for, worker_records)

# MLflow's HTTP client retries for ~4 minutes by default; a test has no such patience.
FAST_FAILING_CLIENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def test_unreachable_store_at_start_refuses_before_any_engine(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    rc, out = run_cli(tmp_path, "cudagraph.capture=256,512", f"tracking.uri={uri}", multirun=True,
                      env=FAST_FAILING_CLIENT)
    assert rc == 2, out
    assert f"tracking.uri={uri}: the tracking server does not answer" in out and "ConnectionError" in out, out
    assert worker_records(tmp_path) == []


def test_unreachable_store_at_start_of_a_single_run_names_the_uri(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    rc, out = run_cli(tmp_path, f"tracking.uri={uri}", env=FAST_FAILING_CLIENT)
    assert rc == 2 and f"tracking.uri={uri}: the tracking server does not answer" in out, out
    assert "nothing was started and no run was recorded" in out, out
    assert worker_records(tmp_path) == []


def _start_server(tmp_path, port):
    db = tmp_path / "server" / "mlflow.db"
    db.parent.mkdir()
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
         "--default-artifact-root", str(tmp_path / "server" / "artifacts"), "--no-serve-artifacts",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    log.close()
    import requests

    def up():
        try:
            return requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok
        except requests.RequestException:
            return server.poll() is not None  # died: stop waiting, the assert below says so
    wait_for(up, timeout=120, every=0.5, what="mlflow server")
    assert server.poll() is None, (tmp_path / "server.log").read_text()
    return server, db


@pytest.mark.slow
def test_server_stopped_mid_run_then_sync_uploads_the_rest_once(tmp_path):
    port = free_port()
    server, db = _start_server(tmp_path, port)
    try:
        sweep = start_cli(tmp_path, "cudagraph.capture=256,512", "lengths=[200,300,400,600]", "samples=1",
                          "search.suspects=false", "engine.fault.delay_s=0.25", f"tracking.uri=http://127.0.0.1:{port}",
                          multirun=True, env=FAST_FAILING_CLIENT)
        wait_for(lambda: job_journals(tmp_path) and len(journal_records(job_journals(tmp_path)[0], "point")) >= 2,
                 timeout=120, what="two journaled points")
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # the outage
        server.wait()
    rc = sweep.wait(timeout=240)
    out = (tmp_path / "cli.log").read_text()
    assert rc == 3, out  # all jobs finished, MLflow incomplete
    assert "unreachable" in out and "python -m oneknob sync" in out, out
    journals = job_journals(tmp_path)
    assert len(journals) == 2  # the second job ran too, into its journal
    lengths = {j: sorted({p["length"] for p in journal_records(j, "point")}) for j in journals}
    # the variant (capture=512) probes its 11 lengths and the baseline's transition 256|257
    assert lengths[journals[0]][-1] == 600 and len(lengths[journals[1]]) == 13

    store = f"sqlite:///{db}"  # the server's own store, written directly while the server is down
    for attempt in range(2):  # the second sync finds nothing to do
        rc, synced = python_module(tmp_path, "oneknob", "sync", "--tracking-uri", store)
        assert rc == 0, synced
        if attempt == 1:
            assert "(created)" not in synced and "+" not in synced, synced
    jobs = mlflow_runs(store, role="job")
    assert len(jobs) == 2 and all(r.info.status == "FINISHED" for r in jobs), [r.info.status for r in jobs]
    for journal in journals:
        [run_id] = {p["run_id"] for p in journal_records(journal, "point")}
        [run] = [r for r in jobs if run_id in (r.info.run_id, r.data.tags.get("oneknob.journal_run_id"))]
        assert metric_steps(store, run.info.run_id) == lengths[journal]
        assert journal_records(journal, "synced")
    assert mlflow_runs(store, role="sweep")[0].info.status == "FINISHED"
