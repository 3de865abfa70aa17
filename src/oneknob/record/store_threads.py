"""The daemon threads of oneknob's store (record/store.py): the journal's fsyncs and the point cache's writes,
each off the measuring thread. Daemons, so that Python never joins them at exit: the store waits at exit for what
it needs, with a limit."""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path


class Served:
    """Requests, put under a condition, served by one daemon thread of the process (a daemon: Python never joins it
    at exit, so no interrupt can leave the exit waiting on it; each user waits for what it needs itself)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def _running(self) -> None:
        """The serving thread, started if it is not (the caller holds the condition)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def _nap_until(self, work: Callable[[], bool]) -> None:
        """(the serving thread, holding the condition) Until there is work: naps of a second at most, as a SIGTERM
        or Ctrl-C raised in the main thread between a request and its notify would leave the request unserved."""
        while not work():
            self._cond.wait(timeout=1.0)


class Fsyncs(Served):
    """fsync off the measuring thread. append_jsonl writes a record (and hands it to the OS) at once, so a
    killed process loses nothing; the fsync, which only a machine crash needs, runs in one background thread,
    coalesced per file (one fsync for the records of several lengths when the disk is slow). `wait()` returns once
    every file appended to so far is fsynced, raising the first failure: the journal's tracker waits before
    anything reaches MLflow (so MLflow never holds what the journal might lose) and when a run ends, and the
    process waits at exit. A point measured in the last ms before a machine crash may be lost: measured again."""

    def __init__(self) -> None:
        super().__init__("oneknob-fsync")
        self._pending: dict[Path, None] = {}
        self._busy = False
        self._error: OSError | None = None

    def ask(self, path: Path) -> None:
        with self._cond:
            self._pending[Path(path)] = None
            self._running()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._nap_until(lambda: bool(self._pending))
                paths, self._pending, self._busy = list(self._pending), {}, True
            for path in paths:
                try:
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                except OSError as exc:
                    exc.filename = exc.filename or str(path)
                    with self._cond:
                        self._error = self._error or exc
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> None:
        with self._cond:
            if self._pending:  # an ask() cut short before it started the thread
                self._running()
            self._cond.wait_for(lambda: not self._pending and not self._busy, timeout=timeout)
            error, self._error = self._error, None
        if error is not None:
            raise error


class Writer(Served):
    """The point cache's writes, in order, by a daemon thread of its own; those not done when the process ends are
    waited for at exit (60 s at most).

    Not a ThreadPoolExecutor: Python joins its workers at exit, and it knows a worker only once `Thread.start()` has
    returned. start() waits for the new thread to run, and oneknob's SIGTERM handler (or Ctrl-C) raises in the main
    thread wherever it is: an interrupt landing there left a running worker that nothing would ever stop, and the
    interrupted command waited for it forever at exit (CI, stop 48: the exit watchdog's stacks named
    `oneknob-cache_0`). A daemon thread is never joined. An interrupt in submit() leaves at worst a second thread
    on the same queue; each cache has one write in flight at a time (PointCache.write joins the last), and drain()
    counts what any thread is still doing."""

    def __init__(self) -> None:
        super().__init__("oneknob-cache")
        self._queue: collections.deque[tuple[Future, Callable, tuple]] = collections.deque()
        self._busy = 0

    def submit(self, fn: Callable, *args) -> Future:
        future: Future = Future()
        with self._cond:
            self._queue.append((future, fn, args))
            self._running()
            self._cond.notify()
        return future

    def _run(self) -> None:
        while True:
            with self._cond:
                self._nap_until(lambda: bool(self._queue))
                (future, fn, args), self._busy = self._queue.popleft(), self._busy + 1
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # the caller's, when it waits on the future
                future.set_exception(exc)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def drain(self, timeout: float) -> None:
        """Every write submitted so far done, or `timeout` seconds passed."""
        with self._cond:
            if self._queue:  # a submit() cut short before its thread ran
                self._running()
            self._cond.wait_for(lambda: not self._queue and not self._busy, timeout=timeout)
