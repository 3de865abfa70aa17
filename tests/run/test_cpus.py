"""oneknob's own threads off the CPUs an engine's threads are bound to (oneknob.run.cpus).

vLLM's CPU build binds its model runner's threads to some CPUs (tests/conftest.py turns that off for the suite's
engines, so they can share the machine); here a process that binds itself stands in for it, and the worker is a
real one (the synthetic engine binds nothing). Linux with at least 2 CPUs, as CI has.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from helpers import job_plan

from oneknob.run import cpus, hosts
from oneknob.run.executor import Worker
from oneknob.run.hosts import Forked

LAUNCH = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
pytestmark = pytest.mark.skipif(len(LAUNCH) < 2, reason="needs CPU affinity and 2 CPUs")


def _bound_process(cpus_: set[int]) -> subprocess.Popen:
    """A process with a thread bound to `cpus_` (as vLLM's model runner's are) beside its unbound main thread (as
    vLLM's front end in the worker), once it says so."""
    code = ("import os, threading, time\n"
            "bound = threading.Event()\n"
            "def compute():\n"
            f"    os.sched_setaffinity(0, {sorted(cpus_)})\n"
            "    bound.set()\n"
            "    time.sleep(120)\n"
            "threading.Thread(target=compute, daemon=True).start()\n"
            "bound.wait()\n"
            "print(threading.get_native_id(), flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    proc.main_thread = int(proc.stdout.readline())
    return proc


def _allowed(pid: int) -> frozenset[int]:
    return frozenset(os.sched_getaffinity(pid))


def test_while_a_bound_engine_runs_every_thread_of_oneknob_leaves_its_cpus_and_a_worker_started_then_does_not(
        tmp_path, monkeypatch):
    engine_cpu = min(LAUNCH)
    engine = _bound_process({engine_cpu})
    done = threading.Event()
    earlier = threading.Thread(target=done.wait, daemon=True)  # a thread started before the engine was ready
    earlier.start()
    try:
        assert cpus.engine_ready(engine.pid, []) == ({engine_cpu}, LAUNCH - {engine_cpu})
        assert _allowed(0) == _allowed(earlier.native_id) == LAUNCH - {engine_cpu}
        threads = {tid: _allowed(tid) for tid in map(int, os.listdir(f"/proc/{engine.pid}/task"))}
        assert threads[engine.main_thread] == LAUNCH - {engine_cpu}  # the worker's own (front end) thread moved
        assert {engine_cpu} in threads.values()  # the engine's compute thread stays where it was bound
        # a worker started by a thread that runs off the engine's CPUs takes the launch CPUs back: vLLM's binding
        # in it must see what it would have seen without oneknob
        plan = job_plan(tmp_path, "cudagraph.capture=256")
        worker = Worker(dict(plan.worker, knobs=plan.knobs), tmp_path / "worker.log", start_timeout_s=60,
                        request_timeout_s=60)
        try:
            worker.start()
            assert _allowed(worker.proc.pid) == LAUNCH
            assert worker.score(list(range(1, 40)))["logprobs"]
        finally:
            worker.stop()
        assert "oneknob's own threads run on" not in (tmp_path / "worker.log").read_text()  # it binds nothing
        # and a worker host started then (vLLM's import, then forks: the synthetic engine stands in, as in
        # tests/run/test_hosting.py), and the worker it forks
        monkeypatch.setattr(hosts, "_hostable", lambda spec: True)
        with hosts.hosting():
            forked = Worker(dict(plan.worker, knobs=plan.knobs), tmp_path / "forked.log", start_timeout_s=60,
                            request_timeout_s=60)
            try:
                forked.start()
                assert isinstance(forked.proc, Forked)
                assert _allowed(forked.proc.host.proc.pid) == _allowed(forked.proc.pid) == LAUNCH
            finally:
                forked.stop()
        assert _allowed(0) == LAUNCH - {engine_cpu}  # its stop is not the bound engine's
    finally:
        cpus.engine_gone(engine.pid)
        engine.kill()
        engine.wait()
    assert _allowed(0) == _allowed(earlier.native_id) == LAUNCH
    done.set()


def test_an_engine_bound_to_every_cpu_or_to_none_moves_nothing():
    everywhere = _bound_process(set(LAUNCH))
    try:
        assert cpus.engine_ready(everywhere.pid, []) is None
        assert _allowed(0) == LAUNCH
    finally:
        everywhere.kill()
        everywhere.wait()


def test_two_bound_engines_keep_oneknob_off_both_until_the_last_is_gone():
    first, second = sorted(LAUNCH)[:2]
    if len(LAUNCH) == 2:  # both engines on one CPU: oneknob keeps the other until both are gone
        second = first
    a, b = _bound_process({first}), _bound_process({second})
    try:
        cpus.engine_ready(a.pid, [])
        cpus.engine_ready(b.pid, [])
        off = LAUNCH - {first, second}
        assert _allowed(0) == off
        cpus.engine_gone(a.pid)
        assert _allowed(0) == LAUNCH - {second}
    finally:
        cpus.engine_gone(a.pid)
        cpus.engine_gone(b.pid)
        for proc in (a, b):
            proc.kill()
            proc.wait()
    assert _allowed(0) == LAUNCH
