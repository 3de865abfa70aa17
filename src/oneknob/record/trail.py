"""MLflow trailing the journal: a one-job command on a local store never waits for MLflow.

The journal is the record. On a local SQLite store that MLflow opens as it is (this MLflow's schema, as in
its empty store: oneknob.record.empty_store), a one-job command does not import MLflow: it picks its runs'
ids itself (uuid4 hex, MLflow's own format), journals every call, and starts an uploader in a session of
its own (oneknob.record.uploader, output to upload.log beside the journal), which replays the journal into
MLflow under those ids while the job runs and finishes once the command is done or gone.

An upload in flight is an entry in <store dir>/.<store name>.uploads/, locked by its uploader: `wait(uri)`
(compare, report, the tests) blocks until none is left, and the next uploader takes over the entry of one
that died. Other stores (an MLflow server, a store MLflow would migrate or make) are opened by the command
itself, so their errors stop it before any engine starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

from oneknob.record import empty_store

LOG = "upload.log"  # the uploader's output, beside the journal


def _db(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def _schema(db: Path) -> str | None:
    """The store's Alembic revision (MLflow's schema version), read without MLflow; None if not a store."""
    try:
        with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=5)) as con:
            rows = con.execute("SELECT version_num FROM alembic_version").fetchall()
            con.execute("SELECT experiment_id FROM experiments LIMIT 1").fetchall()
    except (OSError, sqlite3.Error):
        return None
    return rows[0][0] if len(rows) == 1 else None


def usable(uri: str) -> bool:
    """A local store the uploader can open with nothing to migrate and nothing to refuse: an existing one on
    this MLflow's schema, or a new one the empty template will make, where this process may write."""
    db = _db(uri)
    template = empty_store.template()
    if db is None or not template.is_file():
        return False
    if db.exists():
        writable = db.is_file() and os.access(db, os.R_OK | os.W_OK) and os.access(db.parent, os.W_OK | os.X_OK)
        return writable and (schema := _schema(db)) is not None and schema == _schema(template)
    try:  # as MLflow's own open would (oneknob.record.tracking): a directory that cannot be made is refused there
        db.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(db.parent, os.W_OK | os.X_OK)


def experiment_id(uri: str, name: str) -> str | None:
    """The active experiment `name` in the local store at `uri`, read without MLflow; None if not there yet."""
    db = _db(uri)
    if db is None or not db.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=5)) as con:
            row = con.execute("SELECT experiment_id FROM experiments WHERE name = ? AND lifecycle_stage = 'active'",
                              (name,)).fetchone()
    except (OSError, sqlite3.Error):
        return None
    return str(row[0]) if row else None


def _uploads(uri: str) -> Path | None:
    db = _db(uri)
    return db.parent / f".{db.name}.uploads" if db is not None else None


class Upload:
    """The uploader of one journal, started by the command that writes it."""

    def __init__(self, journal: Path, uri: str, experiment: str):
        folder = _uploads(uri)
        folder.mkdir(parents=True, exist_ok=True)
        self.entry = folder / f"{uuid.uuid4().hex}.json"
        self.entry.write_text(json.dumps({"journal": str(Path(journal).resolve()), "uri": uri,
                                          "experiment": experiment}))
        self.log = Path(journal).parent / LOG
        # the lock is taken here, before the uploader exists, so a reader never finds the upload unannounced;
        # the uploader inherits it and holds it until it exits (this process's copy is closed below)
        with open(self.entry, "rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                with open(self.log, "ab") as log:
                    # its stdin is how it learns the journal is complete: closed by done(), or by this process's end
                    self.process = subprocess.Popen(
                        [sys.executable, "-m", "oneknob.record.uploader", str(self.entry)], stdin=subprocess.PIPE,
                        stdout=log, stderr=subprocess.STDOUT, pass_fds=(handle.fileno(),), start_new_session=True)
            except OSError:
                self.entry.unlink(missing_ok=True)
                raise

    def done(self) -> None:
        """The journal is complete: the uploader uploads the rest and exits."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()

    def failed(self) -> bool:
        """The uploader has already exited with an error (it is still running, or done, otherwise)."""
        return self.process.poll() not in (None, 0)


def wait(uri: str, timeout_s: float = 300.0) -> list[Path]:
    """Block until no uploader to the local store at `uri` is alive (a live one also takes over the entries of
    uploaders that died); the entries still there are returned. Any other store: nothing to wait for."""
    folder = _uploads(uri)
    if folder is None or not folder.is_dir():
        return []
    deadline = time.monotonic() + timeout_s
    while True:
        entries = sorted(folder.glob("*.json"))
        if not any(map(_held, entries)) or time.monotonic() > deadline:
            return [entry for entry in entries if entry.exists()]
        time.sleep(0.05)


def _held(entry: Path) -> bool:
    """An uploader holds this entry's lock (a live upload)."""
    try:
        with open(entry, "rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except FileNotFoundError:  # done meanwhile
        pass
    return False
