"""What a job of a sweep whose jobs run side by side waits for, and where it finds it.

    <sweep dir>/baseline.json       the baseline job writes {"knobs", "resolved"} once its engine resolved, and adds
                                    "transitions" once it is measured (oneknob.study.job)
    <sweep dir>/ended/<index>       the sweep writes it when that job's launch returned, however the job ended
    <sweep dir>/ended/reference     ... when the references it measures ahead are measured, or failed

A variant needs two things of the baseline: its resolved config (the single-variable diff, and the pins it
calls for) and its transitions (lengths the variant probes too, so the jump across them is compared in both
runs). It starts its engine meanwhile and waits for the first once that is up, for the second once it measured
its own grid (oneknob.study.job); a job waits for the reference before it judges anything. A wait ends when
what it waits for is there, when the job it waits for ended without it (the job goes on as a sequential sweep's
would: the baseline is missing), or when the sweeping process is gone; a sweep's interrupt ends it in a job
thread (oneknob.run.stopping). Outside a side-by-side sweep nothing waits: the baseline ran first.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from oneknob.plan.jobs import SweepContext
from oneknob.run import stopping

POLL_S = 0.1
REFERENCE = "reference"


def ended_path(sweep_dir: str | Path, what: str | int) -> Path:
    return Path(sweep_dir) / "ended" / str(what)


def mark_ended(sweep_dir: str | Path, what: str | int) -> None:
    path = ended_path(sweep_dir, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def _sweep_gone(sweep: SweepContext) -> bool:
    if sweep.pid is None or sweep.host != socket.gethostname():
        return False
    try:
        os.kill(sweep.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _published(sweep: SweepContext) -> dict[str, Any]:
    try:
        return json.loads(sweep.baseline_path.read_text())
    except (OSError, ValueError):  # not written yet (it is written atomically: never half)
        return {}


def baseline(sweep: SweepContext, key: str, wait: bool = True) -> dict[str, Any] | None:
    """baseline.json once it holds `key` ("resolved", "transitions"); None where the baseline ended without it.
    Without `wait`, or outside a side-by-side sweep, what is there now."""
    while True:
        published = _published(sweep)
        # the baseline itself waits for nothing; a follow-up's run (`against`) was written whole before it began
        if key in published or not wait or not sweep.side_by_side or sweep.publishes_baseline or sweep.against:
            return published if key in published else None
        if ended_path(sweep.dir, 0).exists() or _sweep_gone(sweep):
            published = _published(sweep)  # it may have written it just before it ended
            return published if key in published else None
        stopping.sleep(POLL_S)


def has_ended(sweep: SweepContext | None, what: str | int) -> bool:
    """Whether the sweep marked `what` ended already (False outside a side-by-side sweep)."""
    return sweep is not None and sweep.side_by_side and ended_path(sweep.dir, what).exists()


def wait_ended(sweep: SweepContext | None, what: str | int) -> None:
    """Until the sweep marked `what` ended (the references measured ahead); at once outside a side-by-side sweep."""
    while sweep is not None and sweep.side_by_side and not ended_path(sweep.dir, what).exists() \
            and not _sweep_gone(sweep):
        stopping.sleep(POLL_S)
