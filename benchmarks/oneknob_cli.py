"""oneknob's real command line (run.py), with two timestamps recorded for benchmarks.overhead.

    BENCH_TIMING=/tmp/t.json python -m benchmarks.oneknob_cli [run.py overrides...]

The hooks wrap `JobProgress.engine_ready` (called when the worker reports the engine ready) and
`JobProgress.point` (called after a length is measured, judged, journaled, cached and logged to
MLflow) and change nothing else: this is `python run.py ...` with a stopwatch attached.
"""

import atexit
import json
import os
import sys
import time

from oneknob.console import JobProgress

marks: dict = {"ready": [], "point": []}
_engine_ready, _point = JobProgress.engine_ready, JobProgress.point


def engine_ready(self, ready):
    marks["ready"].append(time.perf_counter())
    return _engine_ready(self, ready)


def point(self, length, verdict, nll):
    result = _point(self, length, verdict, nll)
    marks["point"].append((length, time.perf_counter(), nll))
    return result


def dump():
    with open(os.environ["BENCH_TIMING"], "w") as f:
        json.dump(marks, f)


if __name__ == "__main__":
    JobProgress.engine_ready, JobProgress.point = engine_ready, point
    atexit.register(dump)
    import runpy

    entry = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run.py")
    sys.argv = [entry, *sys.argv[1:]]
    runpy.run_path(entry, run_name="__main__")
