"""A worker's processes under /proc: their state, the whole tree below a worker (whatever its process group or
session), and the reaping of what outlived its group's signals. Shared by the executor and its worker hosts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def proc_stat(pid: int) -> tuple[int, str, str] | None:
    """(parent PID, state, start time in clock ticks) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], fields[19]


def descendants(pid: int) -> dict[int, str]:
    """{PID: start ticks} of every process below `pid`, whatever its process group or session."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
            ticks[int(entry)] = stat[2]
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = ticks[child]
                todo.append(child)
    return found


def kill_stragglers(processes: dict[int, str], wait_s: float = 10.0) -> list[int]:
    """SIGKILL those of `processes` still running (the same PID and start time: a reused PID is left
    alone) and wait until they are gone; returns their PIDs."""
    def running(pid: int) -> bool:
        stat = proc_stat(pid)
        return stat is not None and stat[2] == processes[pid] and stat[1] not in "ZX"

    stragglers = [pid for pid in processes if running(pid)]
    for pid in stragglers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while any(running(pid) for pid in stragglers) and time.monotonic() < deadline:
        time.sleep(0.05)
    return stragglers
