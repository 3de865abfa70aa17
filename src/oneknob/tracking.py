"""MLflow, through MlflowClient only (no global "active run" state).

Local default: SQLite at <paths.mlruns>/mlflow.db with artifacts under
<paths.mlruns>/artifacts (MLflow refuses the plain ./mlruns file store).
`tracking.uri` or $MLFLOW_TRACKING_URI point elsewhere, e.g. a shared server.
Writes retry on SQLite's "database is locked", so two sweeps can share a store.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

PARAM_MAX = 6000
_URI = re.compile(r"^(sqlite:///.+|https?://[^/\s]+.*|file:///.+|postgresql(\+\w+)?://.+|mysql(\+\w+)?://.+)$")


class TrackingError(RuntimeError):
    pass


def resolve_uri(configured: str | None, mlruns: str | Path) -> str:
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        if not _URI.match(uri):
            raise TrackingError(
                f"tracking.uri={uri}: not a tracking URI oneknob can use; give "
                "sqlite:///<absolute path>/mlflow.db, http://host:port, or null for the local store")
        return uri
    mlruns = Path(mlruns).resolve()
    try:
        mlruns.mkdir(parents=True, exist_ok=True)
        probe = mlruns / ".oneknob-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise TrackingError(f"paths.mlruns={mlruns}: cannot write there ({exc.strerror}); make it writable "
                            "or set paths.mlruns / tracking.uri elsewhere") from None
    return f"sqlite:///{mlruns}/mlflow.db"


def _retry(call: Callable, *args, attempts: int = 12, **kwargs):
    delay = 0.05
    for attempt in range(attempts):
        try:
            return call(*args, **kwargs)
        except Exception as exc:  # MLflow wraps SQLAlchemy's OperationalError in several ways
            if "locked" not in str(exc).lower() or attempt == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


class Tracker:
    def __init__(self, uri: str, experiment: str):
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = self._experiment(experiment)

    def _experiment(self, name: str) -> str:
        try:
            found = _retry(self.client.get_experiment_by_name, name)
            if found is not None:
                return found.experiment_id
            artifacts = None
            if self.uri.startswith("sqlite:///"):
                artifacts = (Path(self.uri[len("sqlite:///"):]).parent / "artifacts" / name).as_uri()
            try:
                return _retry(self.client.create_experiment, name, artifact_location=artifacts)
            except Exception:
                found = self.client.get_experiment_by_name(name)  # another sweep created it first
                if found is None:
                    raise
                return found.experiment_id
        except Exception as exc:
            raise TrackingError(f"tracking.uri={self.uri}: the tracking store cannot be used "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); start the "
                                "server, fix the URI, or use tracking.uri=null for the local store") from None

    # -- runs --------------------------------------------------------------
    def start_run(self, name: str, tags: dict[str, str], parent_run_id: str | None = None) -> str:
        tags = dict(tags)
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = _retry(self.client.create_run, self.experiment_id, run_name=name, tags=tags)
        return run.info.run_id

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            _retry(self.client.set_tag, run_id, key, str(value))

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, _param_text(v)) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):
            _retry(self.client.log_batch, run_id, params=items[i:i + 100])

    def log_metrics(self, run_id: str, points: Iterable[tuple[str, float, int]]) -> None:
        """(key, value, step) triples, logged in batches."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, int(step)) for key, value, step in points]
        for i in range(0, len(metrics), 500):
            _retry(self.client.log_batch, run_id, metrics=metrics[i:i + 500])

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        _retry(self.client.log_artifact, run_id, str(path), artifact_path)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        _retry(self.client.set_terminated, run_id, status)


def _param_text(value: Any) -> str:
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return text if len(text) <= PARAM_MAX else text[: PARAM_MAX - 3] + "..."


def flat_params(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}{key}": value for key, value in values.items()}
