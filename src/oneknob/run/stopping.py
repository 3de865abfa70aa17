"""Stopping every job of a sweep whose jobs run side by side in this process's threads.

A signal (Ctrl-C, SIGTERM: oneknob.study.terminal turns both into KeyboardInterrupt) reaches the main thread
only; the threads that drive the other jobs' workers learn of it here: the sweep calls `stop_all()`, and every
place a job thread waits (an answer from its worker, a worker host's fork, a free device, the baseline's
results) calls `check()` or `sleep()`, which raise KeyboardInterrupt in that thread once it is set. The job then
ends as it does on Ctrl-C: its run KILLED, its worker killed, its points kept.
"""

from __future__ import annotations

import threading

_stop = threading.Event()


def stop_all() -> None:
    _stop.set()


def reset() -> None:
    """A new sweep starts: nothing is stopping."""
    _stop.clear()


def requested() -> bool:
    return _stop.is_set()


def check() -> None:
    if _stop.is_set():
        raise KeyboardInterrupt("stopped with the sweep")


def sleep(seconds: float) -> None:
    """time.sleep, ended by stop_all() (KeyboardInterrupt)."""
    if _stop.wait(seconds):
        raise KeyboardInterrupt("stopped with the sweep")
