"""A real `mlflow server` on 127.0.0.1 for tests, and small REST helpers to read it.

One server per test session (it takes 10-20 s to start on two cores): test
modules import the `mlflow_server` fixture from here, and each test writes to
its own experiment. The server runs in its own process group, so stopping it
also stops the uvicorn worker it starts; the fixture's finalizer always does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import empty_store, free_port

MLFLOW = Path(sys.executable).with_name("mlflow")
START_TIMEOUT_S = 120


@dataclass
class MlflowServer:
    uri: str
    root: Path
    process: subprocess.Popen

    @classmethod
    def start(cls, root: Path) -> MlflowServer:
        port = free_port()
        shutil.copyfile(empty_store(), root / "db")  # schema already migrated: starts ~10 s sooner
        log = open(root / "server.log", "wb")
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")  # no GenAI job runners
        env.pop("MLFLOW_TRACKING_URI", None)
        process = subprocess.Popen(
            [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{root}/db",
             "--artifacts-destination", str(root / "art"), "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        server = cls(f"http://127.0.0.1:{port}", root, process)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {process.returncode}:\n{server.log_tail()}")
            try:
                with urllib.request.urlopen(f"{server.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return server
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        server.stop()
        raise RuntimeError(f"mlflow server not healthy after {START_TIMEOUT_S} s:\n{server.log_tail()}")

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)  # the group we started: server and its worker
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=15)

    def log_tail(self, chars: int = 4000) -> str:
        return (self.root / "server.log").read_text(errors="replace")[-chars:]

    # -- REST (what any client on the network sees) ------------------------
    def api(self, path: str, body: dict | None = None, **query) -> dict:
        url = f"{self.uri}/api/2.0/mlflow/{path}"
        if query:
            url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def experiment_id(self, name: str) -> str:
        return self.api("experiments/get-by-name", experiment_name=name)["experiment"]["experiment_id"]

    def runs(self, experiment: str) -> list[dict]:
        """Every run of an experiment, each as {id, name, status, tags, params, metrics}."""
        found, token = [], None
        while True:
            body = {"experiment_ids": [self.experiment_id(experiment)], "max_results": 1000}
            if token:
                body["page_token"] = token
            page = self.api("runs/search", body)
            found += [_run(r) for r in page.get("runs", [])]
            token = page.get("next_page_token")
            if not token:
                return found

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """(step, value) of a metric, sorted by step."""
        points, token = [], None
        while True:
            query = {"run_id": run_id, "metric_key": key, "max_results": 25000}
            if token:
                query["page_token"] = token
            page = self.api("metrics/get-history", **query)
            points += [(int(m.get("step", 0)), m["value"]) for m in page.get("metrics", [])]
            token = page.get("next_page_token")
            if not token:
                return sorted(points)


def _run(raw: dict) -> dict:
    data = raw.get("data", {})
    return {"id": raw["info"]["run_id"], "name": raw["info"].get("run_name"), "status": raw["info"]["status"],
            "tags": {t["key"]: t["value"] for t in data.get("tags", [])},
            "params": {p["key"]: p["value"] for p in data.get("params", [])},
            "metrics": {m["key"]: m["value"] for m in data.get("metrics", [])}}


_shared: dict[str, MlflowServer] = {}


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> MlflowServer:
    """One server for the whole session, however many modules import this fixture."""
    if "server" not in _shared:
        _shared["server"] = MlflowServer.start(tmp_path_factory.mktemp("mlflow-server"))
    yield _shared["server"]
    server = _shared.pop("server", None)
    if server is not None:
        server.stop()


@pytest.fixture
def experiment() -> str:
    """A fresh experiment name, so tests sharing the server never see each other's runs."""
    return f"test-{uuid.uuid4().hex[:10]}"
