"""The commands oneknob prints for a user to paste: made here, so the spelling lives once and each carries the
keys it needs to find what it names.

A printed command is run later, in a shell of its own: a command that names a sweep must name the store it is in
when that store is not the one the command finds by itself ($MLFLOW_TRACKING_URI, else ./mlruns/mlflow.db from
the directory it is pasted in), or it finds nothing. So every one takes the tracking URI and adds
`--tracking-uri URI` where it differs from that default.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from oneknob.config.tracking import default_uri

PYTHON_M = "python -m oneknob"  # the front door (oneknob/__main__.py): `python -m oneknob COMMAND ARGS`


def _absolute(tracking_uri: str) -> str:
    """A relative SQLite path (sqlite:///rel/mlflow.db) as the absolute one it names here: a command pasted in
    another directory finds the same store."""
    path = tracking_uri[len("sqlite:///"):] if tracking_uri.startswith("sqlite:///") else None
    return f"sqlite:///{Path(path).resolve()}" if path and not path.startswith("/") else tracking_uri


def _store(tracking_uri: str | None) -> list[str]:
    if not tracking_uri or tracking_uri == default_uri():
        return []
    return ["--tracking-uri", _absolute(tracking_uri)]


def _join(tool: str, *args: str) -> str:
    return f"{PYTHON_M} {tool}" + "".join(f" {shlex.quote(str(a))}" for a in args)


def compare(sweep_id: str, tracking_uri: str | None = None) -> str:
    """Rebuild a sweep's comparison (summary.json, report.md, plots) from MLflow."""
    return _join("compare", "--sweep", sweep_id, *_store(tracking_uri))


def report(sweep_id: str | None = None, tracking_uri: str | None = None) -> str:
    """Print a sweep's report.md from MLflow."""
    return _join("report", *(["--sweep", sweep_id] if sweep_id else []), *_store(tracking_uri))


def sync(*paths: str | Path, tracking_uri: str | None = None) -> str:
    """Upload what journals hold and MLflow lacks."""
    return _join("sync", *map(str, paths), *_store(tracking_uri))


def ui(tracking_uri: str | None = None) -> str:
    """Serve the local store's UI on http://127.0.0.1:5000: `make ui` for the default store, else MLflow's own."""
    if not _store(tracking_uri):
        return "make ui"
    return "mlflow ui --backend-store-uri " + shlex.quote(_absolute(str(tracking_uri)))
