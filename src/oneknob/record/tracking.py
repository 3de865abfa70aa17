"""MLflow, through MlflowClient only (no global "active run" state).

Local default: SQLite at <paths.mlruns>/mlflow.db with artifacts under
<paths.mlruns>/artifacts (MLflow refuses the plain ./mlruns file store).
`tracking.uri` or $MLFLOW_TRACKING_URI point elsewhere, e.g. a shared server.
Writes retry on SQLite's "database is locked", so two sweeps can share a store.

What jobs and sweeps use is `oneknob.record.journaled.JournaledTracker`: the
journal first, this store second; `python -m oneknob sync` replays a journal.
Runs carry the host, PID and start time of the process that owns them, so a
run left RUNNING by a killed process is marked KILLED by the next oneknob run
on that host (`Tracker.reap_stale`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.markup import escape


from oneknob.config.tracking import (  # noqa: F401 (the URI and its check, for the store's callers)
    TrackingError,
    default_uri,
    resolve_uri,
)

PARAM_MAX = 6000


def retry_locked(call: Callable, *args, attempts: int = 12, **kwargs):
    delay = 0.05
    for attempt in range(attempts):
        try:
            return call(*args, **kwargs)
        except Exception as exc:  # MLflow wraps SQLAlchemy's OperationalError in several ways
            if "locked" not in str(exc).lower() or attempt == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


# A store that stops answering mid-run costs minutes with MLflow's default HTTP retries (7, backoff 2, a
# 120 s timeout), with the engine idle: a short budget, then the journal takes over (sync uploads it later).
HTTP_RETRY_BUDGET = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                     "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}


# Without it MLflow 3 opens an experiment on its GenAI pages (traces, none here); this value is its
# "model training" kind, whose landing page is the runs table.
EXPERIMENT_KIND, TRAINING = "mlflow.experimentKind", "custom_model_development"
EXPERIMENT_NOTE = ("oneknob: one parent run per sweep, whose description is the sweep's report; its child runs are "
                   "the jobs, each changing one engine knob, with metric `nll` (and `nll_ref`, `delta_nll`, "
                   "`polluted`) per prompt length as the step.")


def quiet_mlflow() -> None:
    """MLflow's INFO lines about creating and migrating a SQLite store's tables say nothing a user acts on."""
    import logging

    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)


class Tracker:
    def __init__(self, uri: str, experiment: str):
        self.uri = uri
        self.experiment_name = experiment
        try:
            self._open(uri, experiment)
        except TrackingError:
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            raise TrackingError(f"tracking.uri={uri}: the tracking store cannot be used ({reason}); start the "
                                "server, fix the URI or the permissions, or use tracking.uri=null for the local "
                                "store") from None

    def _open(self, uri: str, experiment: str) -> None:
        from mlflow.tracking import MlflowClient

        quiet_mlflow()
        if uri.startswith(("http://", "https://")):
            for key, value in HTTP_RETRY_BUDGET.items():
                os.environ.setdefault(key, value)  # the user's own setting wins
            _probe_server(uri)  # MLflow's own client would retry before giving up
        if uri.startswith("sqlite:///"):
            from oneknob.record import empty_store
            from oneknob.record.store import locked

            # MLflow creates the schema when the client first opens the store; two sweeps starting at
            # once would race on the migration ("duplicate column name"), so one process at a time
            db = Path(uri[len("sqlite:///"):])
            with locked(db.parent / f".{db.name}.init.lock"):
                new = not db.exists()
                seeded = new and empty_store.seed(db)
                self.client = MlflowClient(tracking_uri=uri)
                if new and not seeded:
                    empty_store.keep(db)
                self.experiment_id = self._experiment(experiment)
        else:
            self.client = MlflowClient(tracking_uri=uri)
            self.experiment_id = self._experiment(experiment)

    def _experiment(self, name: str) -> str:
        found = retry_locked(self.client.get_experiment_by_name, name)
        if found is not None:
            if EXPERIMENT_KIND not in found.tags:  # one made by an older oneknob; a kind set by hand stays
                with contextlib.suppress(Exception):  # a cosmetic tag: never a reason not to run
                    retry_locked(self.client.set_experiment_tag, found.experiment_id, EXPERIMENT_KIND, TRAINING)
            return found.experiment_id
        artifacts = None
        if self.uri.startswith("sqlite:///"):
            artifacts = (Path(self.uri[len("sqlite:///"):]).parent / "artifacts" / name).as_uri()
        try:
            return retry_locked(self.client.create_experiment, name, artifact_location=artifacts,
                          tags={EXPERIMENT_KIND: TRAINING, "mlflow.note.content": EXPERIMENT_NOTE})
        except Exception:
            found = self.client.get_experiment_by_name(name)  # another sweep created it first
            if found is None:
                raise
            return found.experiment_id

    # -- runs --------------------------------------------------------------
    def start_run(self, name: str, tags: dict[str, str], parent_run_id: str | None = None,
                  run_id: str | None = None) -> str:
        """A new run; `run_id`: under that id (one a trailing run already printed and journaled)."""
        tags = dict(tags, **{PROCESS_TAG: process_id()})
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        if run_id:
            return create_run_as(self.client, run_id, self.experiment_id, run_name=name, tags=tags).info.run_id
        run = retry_locked(self.client.create_run, self.experiment_id, run_name=name, tags=tags)
        return run.info.run_id

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            retry_locked(self.client.set_tag, run_id, key, str(value))

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, param_text(v)) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):
            retry_locked(self.client.log_batch, run_id, params=items[i:i + 100])

    def log_metrics(self, run_id: str, points: Iterable[tuple]) -> None:
        """(key, value, step) or (key, value, step, timestamp_ms) tuples, logged in batches."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(p[0], float(p[1]), int(p[3]) if len(p) > 3 else now, int(p[2])) for p in points]
        for i in range(0, len(metrics), 500):
            retry_locked(self.client.log_batch, run_id, metrics=metrics[i:i + 500])

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        retry_locked(self.client.log_artifact, run_id, str(path), artifact_path)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        retry_locked(self.client.set_terminated, run_id, status)

    def reap_stale(self) -> list[str]:
        """Mark KILLED the RUNNING runs whose oneknob process on this host is gone (a SIGKILL, a crash)."""
        host = socket.gethostname()
        stale = []
        runs = retry_locked(self.client.search_runs, [self.experiment_id],
                      filter_string="attributes.status = 'RUNNING'", max_results=1000)
        for run in runs:
            owner = run.data.tags.get(PROCESS_TAG, "")
            parts = owner.rsplit(":", 2)
            if len(parts) != 3 or parts[0] != host or process_alive(int(parts[1]), parts[2]):
                continue
            retry_locked(self.client.set_tag, run.info.run_id, "oneknob.stale",
                   f"left RUNNING by process {owner}, which is gone; marked KILLED by process {process_id()}")
            retry_locked(self.client.set_terminated, run.info.run_id, "KILLED")
            stale.append(run.info.run_id)
        return stale


PROCESS_TAG = "oneknob.process"


def create_run_as(client, run_id: str, experiment_id: str, **create):
    """MLflow's create_run on a local store, under the id the journal already gives the run.

    MLflow picks a run's id itself (SqlAlchemyStore.create_run: uuid.uuid4().hex); for a trailing upload the
    id was picked, printed and journaled by the command, in MLflow's format, so MLflow's uuid4 returns it for
    this one call. A second uploader of the same journal finds the run made by the first.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.store.tracking import sqlalchemy_store

    class Preset:
        @staticmethod
        def uuid4():
            return uuid.UUID(hex=run_id)

    saved, sqlalchemy_store.uuid = sqlalchemy_store.uuid, Preset
    try:
        created = retry_locked(client.create_run, experiment_id, **create)
    except Exception as exc:
        try:
            return client.get_run(run_id)  # made meanwhile, by a second uploader of this journal
        except MlflowException:
            raise exc from None
    finally:
        sqlalchemy_store.uuid = saved
    if created.info.run_id != run_id:
        raise TrackingError(f"MLflow created run {created.info.run_id} for the journal's run {run_id}: this "
                            "MLflow no longer takes a run id from uuid4 (oneknob.record.tracking.create_run_as)")
    return created


def _start_ticks(pid: int) -> str:
    """The process start time in clock ticks since boot (so a reused PID is not mistaken for its owner)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def process_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_start_ticks(os.getpid())}"


def process_alive(pid: int, ticks: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return ticks == "?" or _start_ticks(pid) in (ticks, "?")


def _probe_server(uri: str, timeout_s: float = 10.0) -> None:
    """Fail fast, naming the URI, when nothing answers there; any HTTP answer counts as reachable."""
    import requests

    try:
        requests.get(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search", params={"max_results": 1},
                     timeout=timeout_s)
    except requests.RequestException as exc:
        raise TrackingError(f"tracking.uri={uri}: the tracking server does not answer "
                            f"({type(exc).__name__}: {str(exc)[:300]}); start it (make server), fix the URI, "
                            "or use tracking.uri=null for the local store") from None


def param_text(value: Any) -> str:
    if isinstance(value, (dict, list)):  # readable back with json.loads, as compare does
        text = json.dumps(value, default=str)
    else:
        text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return text if len(text) <= PARAM_MAX else text[: PARAM_MAX - 3] + "..."


def flat_params(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}{key}": value for key, value in values.items()}


def reap_stale_runs(tracker, console) -> None:
    """Runs left RUNNING by a killed oneknob process (SIGKILL, OOM, power) are marked KILLED."""
    try:
        stale = tracker.reap_stale()
    except Exception as exc:  # never a reason not to run
        console.print(f"[yellow]could not check for stale runs: {type(exc).__name__}: {escape(str(exc))}[/]")
        return
    if stale:
        console.print(f"[yellow]marked {len(stale)} run(s) KILLED that a killed oneknob process left RUNNING: "
                      f"{', '.join(stale)}[/]")
