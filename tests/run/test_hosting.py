"""A sweep's workers forked from one process that imported the engine (oneknob.run.hosts.hosting).

The vLLM engine is the one whose import is worth sharing (its `prepare`); here the synthetic engine stands in for
it (`_hostable` patched), so the host's life and the forked workers' are checked in seconds: a forked worker
must be what a started one is (its own session and log, the protocol, its exit code, a kill), and the host must
end with the block. tests/vllm/test_vllm_cli.py checks a real vLLM sweep's workers share their host.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys

import pytest
from helpers import job_plan, wait_for, worker_records

from oneknob.run import hosts
from oneknob.run.executor import Worker, WorkerDied
from oneknob.run.hosts import Forked
from oneknob.run.procs import proc_stat


def _worker(tmp_path, plan, name: str) -> Worker:
    return Worker(dict(plan.worker, knobs=plan.knobs), tmp_path / f"{name}.log", start_timeout_s=60,
                  request_timeout_s=60, record_path=tmp_path / ".cache/oneknob/workers.jsonl")


def test_workers_forked_from_one_host_behave_as_started_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(hosts, "_hostable", lambda spec: True)
    plan = job_plan(tmp_path, "cudagraph.capture=256")
    with hosts.hosting():
        first = _worker(tmp_path, plan, "first")
        first.prepare()  # the host imports; the worker is forked when first used
        assert first.proc is None
        ready = first.start()
        assert isinstance(first.proc, Forked) and ready.pid == first.proc.pid
        assert os.getsid(first.proc.pid) == first.proc.pid  # a session of its own, as a started worker's
        if importlib.util.find_spec("setproctitle"):  # named as a started worker is, in `ps`, not as its host
            title = open(f"/proc/{first.proc.pid}/cmdline").read().replace("\0", " ").split()
            assert title == [sys.executable, "-m", "oneknob.run.worker"], title
        assert len(first.score([i % 200 + 1 for i in range(300)])["logprobs"]) == 299
        host = first.proc.host
        first.stop()

        second = _worker(tmp_path, plan, "second")
        second.start()
        assert second.proc.host is host and second.proc.pid != ready.pid
        os.kill(second.proc.pid, signal.SIGKILL)
        wait_for(lambda: second.proc.poll() is not None, timeout=10, what="the host to report the kill")
        assert second.proc.returncode == -signal.SIGKILL
        with pytest.raises(WorkerDied, match="killed by signal 9"):
            second.score([5, 6, 7])
        second.stop()
    assert host.proc.returncode == 0  # the block's end ended it
    stops = worker_records(tmp_path, "stop")
    assert [r["returncode"] for r in stops] == [0, -signal.SIGKILL]
    assert {r["host"] for r in worker_records(tmp_path)} == {host.proc.pid}
    assert "oneknob: worker started" in (tmp_path / "second.log").read_text()


def test_a_host_that_cannot_import_leaves_its_workers_to_start_as_before(tmp_path, monkeypatch):
    """The host's import fails (here: an engine module that raises on load): the worker starts by itself, and
    the host's reason is in the log of the worker that needed it."""
    monkeypatch.setattr(hosts, "_hostable", lambda spec: True)
    plan = job_plan(tmp_path, "cudagraph.capture=256")
    worker = _worker(tmp_path, plan, "worker")
    worker.env = dict(os.environ, ONEKNOB_TEST_HOST_FAILS="1", PYTHONPATH=str(tmp_path / "site"))
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if os.environ.get('ONEKNOB_TEST_HOST_FAILS') and sys.argv[-1:] == ['host']:\n"
        "    import oneknob.engines.base as base\n"
        "    def load(name):\n"
        "        raise ImportError('no engine here')\n"
        "    base.load = load\n")
    with hosts.hosting():
        worker.start()
        assert not isinstance(worker.proc, Forked)  # started as before
        assert len(worker.score([5, 6, 7])["logprobs"]) == 2
        worker.stop()
    assert "ImportError: no engine here" in (tmp_path / "worker.log").read_text()


def test_a_worker_whose_host_is_gone_still_serves_and_is_stopped(tmp_path, monkeypatch):
    """Nobody reports the exit code of a worker whose host was killed: it is watched under /proc instead, and
    the code it exited with is lost (reported as SIGKILL)."""
    monkeypatch.setattr(hosts, "_hostable", lambda spec: True)
    plan = job_plan(tmp_path, "cudagraph.capture=256")
    with hosts.hosting():
        worker = _worker(tmp_path, plan, "worker")
        worker.start()
        host = worker.proc.host
        os.kill(host.proc.pid, signal.SIGKILL)
        host.proc.wait()
        assert worker.proc.poll() is None
        assert len(worker.score([5, 6, 7])["logprobs"]) == 2
        pid = worker.proc.pid
        worker.stop()
    assert worker_records(tmp_path, "stop")[0]["returncode"] == -signal.SIGKILL
    stat = proc_stat(pid)
    assert stat is None or stat[1] in "ZX"  # ended (a zombie until init, its parent now, reaps it)


def test_a_new_host_ends_the_idle_ones(tmp_path, monkeypatch):
    """A host per interpreter and environment; a bisection meets a new build at every probe, so a new host ends
    those that forked and have no worker running, and keeps one whose worker still runs."""
    monkeypatch.setattr(hosts, "_hostable", lambda spec: True)
    plan = job_plan(tmp_path, "cudagraph.capture=256")
    workers = []
    with hosts.hosting():
        for name in ("a", "b", "c"):
            worker = _worker(tmp_path, plan, name)
            worker.env = dict(os.environ, ONEKNOB_TEST_BUILD=name)  # another environment: another host
            worker.start()
            workers.append(worker)
            if name == "a":
                worker.stop()
        a, b, c = (w.proc.host if w.proc else None for w in workers)
        first = worker_records(tmp_path)[0]["host"]
        assert a is None and b is not c  # a's worker stopped; b's still runs
        assert proc_stat(first) is None or proc_stat(first)[1] in "ZX"  # a's host ended
        assert b.alive() and c.alive()  # b's worker runs: its host stays
        for worker in workers[1:]:
            worker.stop()
    assert not b.alive() and not c.alive()


def test_a_host_forks_for_another_knob_environment_only_where_the_engine_says_its_import_allows(tmp_path,
                                                                                                monkeypatch):
    """A sweep's reference and jobs differ in their knobs' variables (the runner's). A host asked to fork a worker of
    another knob environment asks its engine which of the variables that change its import read (vLLM's `stale`,
    vllm_introspect.import_recorded); the synthetic engine cannot tell, so the host refuses, saying which
    variables, and the worker gets a host of its own environment. Real vLLM's answer (the runner's variable is
    not read at import: one host for the reference and the jobs) is checked by test_vllm_cli."""
    monkeypatch.setattr(hosts, "_hostable", lambda spec: True)
    v1, v2 = job_plan(tmp_path, "runner=v1"), job_plan(tmp_path, "runner=v2")
    with hosts.hosting():
        first = _worker(tmp_path, v1, "v1")
        first.start()
        other = _worker(tmp_path, v2, "v2")
        other.start()
        assert other.proc.host is not first.proc.host
        assert first.proc.host.refused == {'{"VLLM_USE_V2_MODEL_RUNNER": "1"}': ["VLLM_USE_V2_MODEL_RUNNER"]}
        assert len(other.score([5, 6, 7])["logprobs"]) == 2
        again = _worker(tmp_path, v2, "again")
        again.start()  # the refusal is remembered: straight to the host of its environment
        assert again.proc.host is other.proc.host
        third = _worker(tmp_path, job_plan(tmp_path, "runner=null"), "third")
        third.start()  # refused by both hosts in turn: a third, of its own environment (not a worker of its own)
        assert isinstance(third.proc, Forked) and third.proc.host not in (first.proc.host, other.proc.host)
        assert first.proc.host.refuses(third.spec) and other.proc.host.refuses(third.spec)
        for worker in (first, other, again, third):
            worker.stop()
    assert [r["returncode"] for r in worker_records(tmp_path, "stop")] == [0, 0, 0, 0]
