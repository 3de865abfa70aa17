"""MLflow logging: points per second into SQLite and into a local `mlflow server`, as oneknob logs them.

A point is one prompt length of one run, logged the way Job._log_length does it: one
`Tracker.log_metrics` call (one MLflow log_batch) with the five per-length metrics of a job with a
reference (nll, polluted, nll_ref, delta_nll, max_abs_delta_logprob) at step = length. Also timed:
the same through `JournaledTracker` (what jobs use: the fsynced journal record first, then MLflow in
batches at most 2 s late; the clock stops once the last batch is in MLflow).
The server is started here (127.0.0.1, a free port, its own SQLite store, one worker,
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false) and stopped here, by its process group.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.common import load, tmpdir
from oneknob.record.journaled import JournaledTracker
from oneknob.record.tracking import Tracker

KEYS = ("nll", "polluted", "nll_ref", "delta_nll", "max_abs_delta_logprob")


def _points(length: int) -> list[tuple]:
    return [(key, 1.0 + length * 1e-4 + i, length) for i, key in enumerate(KEYS)]


def _rate(tracker, points: int) -> float:
    run_id = tracker.start_run("bench", {"oneknob.role": "bench"})
    started = time.perf_counter()
    for length in range(2, 2 + points):
        tracker.log_metrics(run_id, _points(length))
    getattr(tracker, "drain", lambda: None)()  # JournaledTracker batches metrics: count them once in MLflow
    elapsed = time.perf_counter() - started
    tracker.finish(run_id, "FINISHED")
    return points / elapsed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, root: Path):
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        env.pop("MLFLOW_TRACKING_URI", None)
        started = time.perf_counter()
        self.process = subprocess.Popen(
            [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
             f"sqlite:///{root}/server.db", "--artifacts-destination", str(root / "artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        while True:
            if self.process.poll() is not None or time.perf_counter() - started > 180:
                self.stop()
                raise RuntimeError(f"mlflow server did not come up; log {self.log}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.25)
        self.start_s = time.perf_counter() - started

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # the group we started: the server and its worker
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def bench(points: int, repeats: int, log=print) -> dict:
    root = tmpdir("mlflow")
    server = Server(root)
    log(f"  mlflow server up in {server.start_s:.1f} s at {server.uri}")
    try:
        stores = {"sqlite": f"sqlite:///{root}/client.db", "server": server.uri}
        trackers = {name: Tracker(uri, "bench") for name, uri in stores.items()}
        journaled = {name: JournaledTracker(root / f"journal-{name}.jsonl", uri, "bench-journaled")
                     for name, uri in stores.items()}
        rates: dict[str, list[float]] = {f"{n}/{kind}": [] for n in stores for kind in ("Tracker", "JournaledTracker")}
        loads = []
        for _ in range(repeats):  # in turns: sqlite, server, sqlite, server, ...
            loads.append(load())
            for name in stores:
                rates[f"{name}/Tracker"].append(_rate(trackers[name], points))
                rates[f"{name}/JournaledTracker"].append(_rate(journaled[name], points))
        log("  mlflow: " + ", ".join(f"{k} {sorted(v)[len(v) // 2]:.0f}/s" for k, v in rates.items()))
    finally:
        server.stop()
    return {"points": points, "repeats": repeats, "rates": rates, "server_start_s": server.start_s, "loads": loads}


def markdown(result: dict) -> str:
    lines = ["| store | logged through | points/s, median (min..max) | metric values/s (x5) | ms per point |",
             "|---|---|---|---|---|"]
    for key, values in result["rates"].items():
        store_name, via = key.split("/")
        med = sorted(values)[len(values) // 2]
        lines.append(f"| {store_name} | {via} | **{med:.0f}** ({min(values):.0f}..{max(values):.0f}) | "
                     f"{med * len(KEYS):.0f} | {1000 / med:.1f} |")
    lines.append("")
    lines.append(f"- {result['points']} points (lengths) per run, {result['repeats']} runs per row in turns; "
                 f"server start {result['server_start_s']:.1f} s; load before each turn: {', '.join(result['loads'])}")
    return "\n".join(lines)
