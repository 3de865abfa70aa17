"""oneknob's own threads kept off the CPUs its engines compute on.

vLLM's CPU build binds the threads of its model runner to some of the CPUs it may use and leaves the others to
"other processes" (VLLM_CPU_OMP_THREADS_BIND=auto; on 2 cores, core 0 computes and core 1 is left to the front end
and the scheduler). oneknob's orchestrator (it judges, journals and caches a point while the engine computes the
next) is such another process, but the kernel does not know it: on the engine's core it
preempts the one thread every request waits for, which cannot move. Measured on 2 cores (benchmarks/RESULTS.md,
"oneknob off the engine's core"): the same job's requests, alternately with and without this, took 2-3 % less
engine time with it.

So, while an engine whose threads are bound runs (engine_ready, engine_gone), every thread of this process, and
what it starts meanwhile, is bound to the CPUs no engine thread is bound to, and so are the unbound
threads of the engine's worker (vLLM's front end runs there, and reads an answer while the engine computes the
next request: oneknob.run.worker._score); with no such engine left, this process is back on the CPUs it was
started with. A worker or worker host started meanwhile takes those back first thing (adopt_launch, from
LAUNCH_ENV), so vLLM's own binding in it sees the CPUs it would have seen without oneknob. Nothing changes where no
engine thread is bound (vLLM on a GPU, VLLM_CPU_OMP_THREADS_BIND=nobind, the synthetic engine), where the engines
are bound to every CPU this process may use, or without CPU affinity (not Linux).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

LAUNCH_ENV = "ONEKNOB_LAUNCH_CPUS"  # the orchestrator's CPUs, before any of this: a worker's own again

_AFFINITY = hasattr(os, "sched_getaffinity")
_launch: frozenset[int] = frozenset(os.sched_getaffinity(0)) if _AFFINITY else frozenset()
_bound: dict[int, frozenset[int]] = {}  # engine (its worker's PID) -> the CPUs its threads are bound to
_lock = threading.Lock()


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # gone, or no /proc
        return []


def bound_cpus(pids: Iterable[int]) -> frozenset[int]:
    """The CPUs that threads of these processes are bound to, where narrower than the CPUs this process started
    with (a thread that may run anywhere it may is bound to nothing)."""
    found: set[int] = set()
    for pid in pids:
        for tid in _threads(pid):
            try:
                cpus = os.sched_getaffinity(tid)
            except OSError:  # ended meanwhile
                continue
            if cpus < _launch:
                found |= cpus
    return frozenset(found)


def engine_ready(worker_pid: int, tree: Iterable[int]) -> tuple[frozenset[int], frozenset[int]] | None:
    """An engine is ready in `worker_pid`'s process tree (`tree`: its other PIDs): this process's threads move
    off the CPUs its threads are bound to. Returns (those CPUs, the CPUs this process now runs on), None where no
    engine thread is bound."""
    bound = bound_cpus([worker_pid, *tree]) if _AFFINITY else frozenset()
    if not bound:
        return None
    with _lock:
        _bound[worker_pid] = bound
        own = _apply()
    if own != _launch:  # the worker itself is oneknob's too (vLLM's front end runs in it): its unbound threads
        _move(worker_pid, own, unbound_only=True)  # go there as well; the engine's own threads stay where bound
    return bound, own


def engine_gone(worker_pid: int) -> None:
    """The engine of `worker_pid` has stopped: the CPUs it was bound to are this process's again (once no other
    engine is bound to them)."""
    with _lock:
        if _bound.pop(worker_pid, None) is not None:
            _apply()


def _apply() -> frozenset[int]:
    free = _launch.difference(*_bound.values())
    target = free if free and _bound else _launch
    _move(os.getpid(), target)
    return target


def _move(pid: int, cpus: frozenset[int], unbound_only: bool = False) -> None:
    """Every thread of `pid` onto `cpus` (with `unbound_only`, those that may run on every CPU this process
    started with)."""
    for tid in _threads(pid):
        try:
            if not unbound_only or os.sched_getaffinity(tid) >= _launch:
                os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def launch_env() -> dict[str, str]:
    """The environment entry that gives a worker this process's CPUs as they were before any engine ran."""
    return {LAUNCH_ENV: ",".join(map(str, sorted(_launch)))} if _launch else {}


def adopt_launch() -> None:
    """In a worker or a worker host, first thing: run on the orchestrator's CPUs as they were at its start,
    whatever the CPUs of the thread that started this process were."""
    text = os.environ.get(LAUNCH_ENV)
    if not text or not _AFFINITY:
        return
    try:
        os.sched_setaffinity(0, {int(cpu) for cpu in text.split(",")})
    except (OSError, ValueError):  # CPUs taken away since (a cgroup's cpuset changed): keep what it has
        pass
