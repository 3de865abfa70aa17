"""Never lose a point, never measure one twice: cache, resume after SIGKILL, two sweeps on one store."""

import collections
import json
import signal
from pathlib import Path

import pytest
from helpers import (cache_points, job_journals, journal_records, metric_steps, mlflow_runs, run_cli, start_cli,
                     stop_group, wait_for, worker_records)

# search.suspects=false: these tests inject faults at lengths the plain grid + bisection probes (the suspect
# probes of the capture sizes, 256|257 and 512|513, would settle the search before it reaches them)
SWEEP = ("cudagraph.capture=256,512", "lengths=[200,300,400,600]", "samples=1", "search.suspects=false")


def _assert_each_point_once(tmp_path):
    for config, points in cache_points(tmp_path).items():
        duplicated = [p for p, n in collections.Counter(points).items() if n > 1]
        assert not duplicated, f"cache {config}: {duplicated} stored more than once"


def _assert_finished_runs_log_each_length_once(tmp_path):
    finished = [r for r in mlflow_runs(tmp_path, role="job") if r.info.status == "FINISHED"]
    assert finished
    for run in finished:
        steps = metric_steps(tmp_path, run.info.run_id)
        assert len(steps) == len(set(steps)), f"{run.info.run_name}: {steps}"
    return finished


def _cached(tmp_path) -> int:
    """Points in the cache so far; a line being appended as it is read counts as not there yet."""
    try:
        return sum(len(p) for p in cache_points(tmp_path).values())
    except ValueError:
        return 0


@pytest.mark.slow  # a sweep, a kill, a second sweep
def test_sigkill_mid_sweep_then_rerun_resumes_at_the_missing_points(tmp_path):
    proc = start_cli(tmp_path, *SWEEP, "engine.fault.delay_s=0.2", multirun=True)
    try:
        # the cache, not the journal: a length's points reach points.jsonl one request after the journal
        # (PointCache.write), so three journaled points may be two cached ones when the kill lands
        wait_for(lambda: _cached(tmp_path) >= 3, timeout=60, what="three cached points")
    finally:
        stop_group(proc, signal.SIGKILL)  # no cleanup at all: the orchestrator just vanishes
        proc.wait()
    before = sum(len(p) for p in cache_points(tmp_path).values())
    assert before >= 3
    [killed] = [r for r in mlflow_runs(tmp_path, role="job")]
    assert killed.info.status == "RUNNING"  # nobody was left to say otherwise

    rc, out = run_cli(tmp_path, *SWEEP, "engine.fault.delay_s=0.2", multirun=True)
    assert rc == 0, out
    assert "marked 2 run(s) KILLED that a killed oneknob process left RUNNING" in out, out  # the job and the sweep
    stale = {r.info.run_id: r for r in mlflow_runs(tmp_path)}[killed.info.run_id]
    assert stale.info.status == "KILLED" and "left RUNNING by process" in stale.data.tags["oneknob.stale"]
    _assert_each_point_once(tmp_path)
    finished = _assert_finished_runs_log_each_length_once(tmp_path)
    assert len(finished) == 2
    resumed = next(r for r in finished if r.data.params["knob.cudagraph.capture"] == "256")
    assert resumed.data.metrics["points_cached"] == before  # measured only what the kill left missing
    assert f"{before} cached / {10 - before} measured" in out, out


@pytest.mark.slow  # three CLI sweeps
def test_rerun_of_a_finished_sweep_starts_no_engine_and_cache_false_measures_afresh(tmp_path):
    rc, out = run_cli(tmp_path, *SWEEP, multirun=True)
    assert rc == 0, out
    starts = len(worker_records(tmp_path, "start"))
    stored = cache_points(tmp_path)

    rc, out = run_cli(tmp_path, *SWEEP, multirun=True)
    assert rc == 0, out
    assert len(worker_records(tmp_path, "start")) == starts  # no engine, not even to read its config
    # capture=512 also probes the baseline's transition 256|257: 11 lengths + 2
    assert "10 cached / 0 measured" in out and "13 cached / 0 measured" in out, out

    rc, out = run_cli(tmp_path, *SWEEP, "cache=false", multirun=True)
    assert rc == 0, out
    assert len(worker_records(tmp_path, "start", role="job")) == 4
    assert "0 cached / 10 measured" in out and "0 cached / 13 measured" in out, out
    _assert_each_point_once(tmp_path)  # fresh points replaced the cached ones
    assert {k: sorted(v) for k, v in cache_points(tmp_path).items()} == {k: sorted(v) for k, v in stored.items()}
    for run in mlflow_runs(tmp_path, role="job"):
        assert "points_cached" in run.data.metrics and "points_measured" in run.data.metrics


def test_cached_resolved_config_is_checked_on_the_first_fresh_engine_start(tmp_path):
    rc, out = run_cli(tmp_path, "lengths=[300,400]", "samples=1", "cudagraph.capture=256")
    assert rc == 0, out
    [meta_path] = list(Path(tmp_path, ".cache/oneknob/points").glob("*/meta.json"))
    meta = json.loads(meta_path.read_text())
    meta["resolved"]["max_capture_size"] = 999  # as if the engine had resolved the config differently then
    meta_path.write_text(json.dumps(meta))

    rc, out = run_cli(tmp_path, "lengths=[300,400]", "samples=1", "cudagraph.capture=256")
    assert rc == 0 and "2 cached / 0 measured" in out, out  # complete in the cache: no engine, no check

    rc, out = run_cli(tmp_path, "lengths=[300,400,500]", "samples=1", "cudagraph.capture=256")
    assert rc == 0, out
    assert "differently from its cached record (max_capture_size: cached 999, engine now 256)" in out, out
    assert "dropped 2 cached point(s)" in out and "0 cached / 3 measured" in out, out
    assert json.loads(meta_path.read_text())["resolved"]["max_capture_size"] == 256
    _assert_each_point_once(tmp_path)


@pytest.mark.slow
def test_two_sweeps_at_once_on_one_fresh_sqlite_store_lose_nothing(tmp_path):
    sweeps = {"a": "cudagraph.capture=256,384", "b": "cudagraph.capture=512,640"}
    procs = {name: start_cli(tmp_path, knob, "lengths=[200,300,400,600,700]", "samples=1",  # both race to create
                             f"hydra.sweep.dir=multirun/{name}", multirun=True, log_name=f"{name}.log")  # the store
             for name, knob in sweeps.items()}
    for name, proc in procs.items():
        assert proc.wait(timeout=300) == 0, (tmp_path / f"{name}.log").read_text()
    jobs = mlflow_runs(tmp_path, role="job")
    assert len(jobs) == 4 and all(r.info.status == "FINISHED" for r in jobs)
    assert len(mlflow_runs(tmp_path, role="sweep")) == 2
    by_id = {r.info.run_id: r for r in jobs}
    for journal in job_journals(tmp_path):
        points = journal_records(journal, "point")
        [run_id] = {p["run_id"] for p in points}
        assert metric_steps(tmp_path, run_id) == sorted({p["length"] for p in points}), by_id[run_id].info.run_name
    _assert_each_point_once(tmp_path)


def test_a_lengths_points_reach_the_cache_while_the_next_request_runs(tmp_path, monkeypatch):
    """The point cache's JSON (every logprob of a length, milliseconds holding the GIL) is handed to its writer
    once a later request is sent, not between two requests; the last length's at the job's end. A write that
    fails surfaces with that request's answer, and the worker's protocol stays in step."""
    from helpers import job_plan, seed_store

    from oneknob.record import store
    from oneknob.run import executor
    from oneknob.study.job import run_job

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    seed_store(tmp_path)
    events = []
    send, write = executor.Worker._send, store.PointCache.write

    def sending(self, message):
        if message["op"] == "score":
            events.append(f"score {len(executor.unpack(message['tokens'], 'q'))}")
        send(self, message)

    def writing(self):
        events.append(f"write {len(self._unwritten)}")
        write(self)

    monkeypatch.setattr(executor.Worker, "_send", sending)
    monkeypatch.setattr(store.PointCache, "write", writing)
    outcome = run_job(job_plan(tmp_path, "cudagraph.capture=256", "lengths=[200,300,400]", "samples=1",
                               "reference=null", "search.suspects=false", "search.bisect=false"),
                      tmp_path / "job")
    assert outcome["status"] == "ok", outcome
    # each request goes out one ahead of the answer awaited (EngineSession.expect), so 400 is sent before 200's
    # points are handed over, and each length's write runs while a later request is in the engine
    assert events[:5] == ["score 200", "score 300", "score 400", "write 1", "write 1"], events
    assert events[5:] == ["write 1"], events  # the last length's: at the job's end
    assert sorted(length for _, length in cache_points(tmp_path).popitem()[1]) == [200, 300, 400]

    worker = executor.worker_for(job_plan(tmp_path, "cudagraph.capture=256"), {"cudagraph.capture": 256},
                                 tmp_path / "w.log")
    worker.start()
    try:
        def full_disk():
            raise OSError(28, "No space left on device", "points.jsonl")
        with pytest.raises(OSError, match="No space left"):
            worker.score(list(range(1, 50)), sent=full_disk)
        assert len(worker.score(list(range(1, 60)))["logprobs"]) == 58  # the answer above was read: in step
    finally:
        worker.stop()
