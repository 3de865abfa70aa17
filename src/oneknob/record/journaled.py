"""The journal first, MLflow second: what jobs and sweeps record through (`JournaledTracker`).

Every call is journaled (fsynced) before MLflow sees it, so a store that fails mid-run, or one that trails
the job in an uploader of its own (oneknob.record.trail), loses nothing; the store itself is
oneknob.record.tracking.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from oneknob.config import commands
from oneknob.record import tags as run_tags
from oneknob.record.tracking import PROCESS_TAG, Tracker, TrackingError, _param_text, process_id

UPLOAD_WAIT_S = 120  # how long a trailing run that falls back to writing MLflow waits for its uploader


class JournaledTracker:
    """The journal first, MLflow second.

    Every call is appended (fsynced) to `journal` as a record that
    `python -m oneknob sync` can replay, then tried on MLflow. The first MLflow
    failure is reported once; later calls only go to the journal. With
    `required=False` an unreachable store at the start is tolerated too (a job
    inside a sweep whose store answered at the start): runs then get local ids,
    and sync creates them.

    Metrics reach MLflow in batches, at most `metrics_flush_s` late: a SQLite
    commit (~7 ms of CPU) per prompt length would sit between two engine
    requests, on a machine whose cores the engine needs. Every other call
    flushes them first, so a failure surfaces there, and the journal already
    holds what was lost.

    With `trail` (a one-job run on a local store, oneknob.record.trail) this process never opens MLflow:
    run ids are picked here, every call goes to the journal only, and the first run starts an uploader that
    replays it into MLflow; `close()` says the journal is complete.

    A local write that fails (the journal, or an artifact copied into a local
    store: a full disk) is no outage: it is reported once, kept in
    `disk_problem` for the job to fail on, and MLflow still gets every call,
    so no run is left RUNNING for want of disk space.
    """

    metrics_flush_s = 2.0

    def __init__(self, journal: Path, uri: str, experiment: str, *, required: bool = True, console=None,
                 tags: dict[str, str] | None = None, trail: bool = False):
        self.journal = Path(journal)
        self.uri, self.experiment = uri, experiment
        # every run's: the git commit, and the user's `tags` (oneknob.record.tags.user_tags)
        self.run_tags = run_tags.git() | (tags or {})
        self.console = console
        self.problem: str | None = None
        self.disk_problem: str | None = None  # the first local write that failed
        self._pending: dict[str, list] = {}  # run id -> metrics not yet in MLflow
        self._pending_since: float | None = None
        self._pending_lock = threading.Lock()
        self._sending: threading.Thread | None = None  # a batch of metrics on its way to MLflow
        self.upload = None  # with `trail`: the uploader (record.trail), started with the first run
        self.trailing = trail
        if trail:  # MLflow is the uploader's, not this process's: run ids are picked here
            self.tracker = None
            return
        try:
            self.tracker: Tracker | None = Tracker(uri, experiment)
        except TrackingError as exc:
            if required:
                raise
            self.tracker = None
            self._lost(exc)

    @property
    def ok(self) -> bool:
        self.drain()
        if self.problem is None and self.upload is not None and self.upload.failed():
            self.problem = f"its uploader failed (see {self.upload.log})"
        return self.problem is None

    def __getattr__(self, name):  # client, experiment_id, reap_stale, ... of the live tracker
        if name == "experiment_id" and self.__dict__.get("trailing"):
            return self._trailing_experiment()
        if name in ("tracker", "_pending") or self.__dict__.get("tracker") is None:
            raise AttributeError(f"{name}: the tracking store at {self.uri} is unreachable")
        self.drain()
        return getattr(self.tracker, name)

    def drain(self) -> None:
        """The journal on disk (fsynced), then the buffered metrics sent; the first failure marks the store
        lost. Every other call to MLflow comes after this, so MLflow never holds what the journal lacks."""
        if self._sending is not None:  # a batch sent from the background: it goes first
            self._sending.join()
            self._sending = None
        self._send()

    def _send(self) -> None:
        from oneknob.record.store import durable

        try:
            durable()
        except OSError as exc:
            self._disk(exc, exc.filename or self.journal, f"the journal {self.journal}")
        with self._pending_lock:
            pending, self._pending, self._pending_since = self._pending, {}, None
        for run_id, metrics in pending.items():
            if self.problem or self.tracker is None:
                return
            try:
                self.tracker.log_metrics(run_id, metrics)
            except Exception as exc:
                self._lost(exc)

    def _send_soon(self) -> None:
        """The buffered metrics to MLflow from a thread of their own (a SQLite commit, ~7 ms of CPU, and the
        journal's fsync it waits for), so the next request need not wait; drain() joins it."""
        if self._sending is not None and self._sending.is_alive():
            return
        self._sending = threading.Thread(target=self._send, name="oneknob-metrics", daemon=True)
        self._sending.start()

    def _journal(self, kind: str, run_id: str, **fields) -> None:
        from oneknob.record.store import append_jsonl

        try:
            append_jsonl(self.journal, {"kind": kind, "run_id": run_id, "time": time.time(), **fields})
        except OSError as exc:
            self._disk(exc, self.journal, f"the journal {self.journal}")

    def _disk(self, exc: OSError, path, what: str) -> None:
        from oneknob.record.store import write_problem

        if self.disk_problem is None:
            self.disk_problem = write_problem(exc, path, what)
            if self.console:
                self.console.print(f"[red]{self.disk_problem}[/]")
        if self.trailing:
            self._stop_trailing()

    def _local_artifacts(self, run_id: str) -> str | None:
        """Where a run's artifacts are, when that is a directory here (a write there names no file)."""
        from urllib.parse import unquote, urlparse

        try:
            uri = urlparse(self.tracker.client.get_run(run_id).info.artifact_uri)
        except Exception:
            return None
        return unquote(uri.path) if uri.scheme == "file" else None

    def _lost(self, exc: BaseException) -> None:
        self.problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        if self.console:
            self.console.print(f"[yellow]tracking store {self.uri} unreachable ({self.problem}); measuring on "
                               f"into {self.journal}; upload later with: "
                               f"{commands.sync(self.journal.parent, tracking_uri=self.uri)}[/]")

    def _call(self, method: str, *args) -> None:
        self.drain()
        if self.tracker is None or self.problem:
            return
        try:
            getattr(self.tracker, method)(*args)
        except Exception as exc:
            from oneknob.record.store import DISK_FULL

            if isinstance(exc, OSError) and exc.errno in DISK_FULL:  # this machine's disk, not the store
                what = f"{Path(args[1]).name} into MLflow's artifact store" if method == "log_artifact" else method
                self._disk(exc, exc.filename or self._local_artifacts(args[0]), what)
                return
            self._lost(exc)

    def start_run(self, name: str, tags: dict[str, str], parent_run_id: str | None = None) -> str:
        self.drain()
        tags = self.run_tags | tags
        run_id = None
        if self.tracker is not None and not self.problem:
            try:
                run_id = self.tracker.start_run(name, tags, parent_run_id=parent_run_id)
            except Exception as exc:
                self._lost(exc)
        local = run_id is None
        run_id = run_id or uuid.uuid4().hex  # sync creates the run from the journal
        trailing = self.trailing
        self._journal("run", run_id, name=name, tags=dict(tags, **{PROCESS_TAG: process_id()}),
                      parent_run_id=parent_run_id, experiment=self.experiment, tracking_uri=self.uri, local=local,
                      **({"trail": True} if trailing else {}))
        if self.trailing and self.upload is None:
            from oneknob.record.trail import Upload

            try:
                self.upload = Upload(self.journal, self.uri, self.experiment)
            except OSError as exc:
                self._disk(exc, exc.filename, "the MLflow upload's files")
        if trailing and not self.trailing and self.tracker is not None and not self.problem:
            try:  # the journal (or the uploader's files) refused this run: it is created from here
                self.tracker.start_run(name, tags, parent_run_id=parent_run_id, run_id=run_id)
            except Exception as exc:
                self._lost(exc)
        return run_id

    def _stop_trailing(self) -> None:
        """A local write failed (a full disk): the journal can no longer carry every call to MLflow, so this
        process writes MLflow itself from now on, once its uploader has uploaded what the journal holds."""
        self.trailing = False
        if self.upload is not None:
            self.upload.done()
            with contextlib.suppress(subprocess.TimeoutExpired):  # a store that hangs: sync can add the rest
                self.upload.process.wait(timeout=UPLOAD_WAIT_S)
            self.upload = None
        try:
            self.tracker = Tracker(self.uri, self.experiment)
        except Exception as exc:
            self._lost(exc)

    def close(self) -> None:
        """Nothing more will be journaled: an uploader uploads the rest and exits."""
        if self.upload is not None:
            self.upload.done()

    def _trailing_experiment(self) -> str | None:
        """The experiment's id in the local store, read without MLflow; None while the uploader has yet to
        make a new one."""
        from oneknob.record import trail

        return trail.experiment_id(self.uri, self.experiment)

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        self._journal("params", run_id, params={k: _param_text(v) for k, v in params.items()})
        self._call("log_params", run_id, params)
        if implied := run_tags.from_params(params):  # e.g. oneknob.emulated, to filter on in the UI
            self.set_tags(run_id, implied)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        self._journal("tags", run_id, tags={k: str(v) for k, v in tags.items()})
        self._call("set_tags", run_id, tags)

    def log_metrics(self, run_id: str, points: Iterable[tuple]) -> None:
        now = int(time.time() * 1000)
        metrics = [[p[0], float(p[1]), int(p[2]), int(p[3]) if len(p) > 3 else now] for p in points]
        if not metrics:
            return
        self._journal("metrics", run_id, metrics=metrics)
        if self.tracker is None or self.problem:
            return
        with self._pending_lock:
            self._pending.setdefault(run_id, []).extend(metrics)
            self._pending_since = self._pending_since or time.monotonic()
            due = time.monotonic() - self._pending_since >= self.metrics_flush_s
        if due:
            self._send_soon()

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self._journal("artifact", run_id, path=str(Path(path).resolve()), artifact_path=artifact_path)
        self._call("log_artifact", run_id, path, artifact_path)

    def finish(self, run_id: str, status: str = "FINISHED", **extra) -> None:
        self._journal("end", run_id, status=status, **json.loads(json.dumps(extra, default=str)))
        self._call("finish", run_id, status)
