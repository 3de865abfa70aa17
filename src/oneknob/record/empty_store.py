"""A new local MLflow store starts as a copy of an empty one, not as ~60 Alembic migrations.

MLflow builds a new SQLite store's schema by running every migration it has (~1.1 s of a 2-core machine's
time, paid in every new paths.root: each test's, each benchmark turn's). The first store oneknob sees MLflow
create under an MLflow version is kept as a template in $XDG_CACHE_HOME/oneknob (~/.cache/oneknob), without
MLflow's Default experiment, which MLflow adds itself when it opens a store lacking one (with that store's own
artifact root, as for a store it made). Later new stores start as a copy, once MLflow's own schema check passes
on it (a template it refuses is dropped, and made anew from the store MLflow then creates).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from importlib.metadata import version
from pathlib import Path

from oneknob.files import user_cache


def template() -> Path:
    return user_cache() / f"mlflow-{version('mlflow')}-empty.db"


def seed(db: Path) -> bool:
    """Copy the template to `db` (which must not exist); False when there is none or the copy failed."""
    source = template()
    if db.exists() or not source.is_file():
        return False
    partial = db.with_name(f".{db.name}.{os.getpid()}.seed")
    try:
        _copy(source, partial)
        if not _current(partial):
            source.unlink(missing_ok=True)  # made anew from the store MLflow now creates
            raise OSError("not MLflow's schema")
        os.replace(partial, db)
    except (OSError, sqlite3.Error):
        partial.unlink(missing_ok=True)
        return False
    return True


def keep(db: Path) -> None:
    """`db` is a store MLflow has just created (schema and Default experiment, nothing else): keep it as the
    template, less the Default experiment. Best effort: a store without a template is only slower to make."""
    target = template()
    if target.is_file():
        return
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _copy(db, partial)
        with contextlib.closing(sqlite3.connect(partial)) as con, con:
            con.execute("DELETE FROM experiments WHERE experiment_id = 0")
        os.replace(partial, target)
    except (OSError, sqlite3.Error):
        partial.unlink(missing_ok=True)


def _current(db: Path) -> bool:
    """MLflow's own check of the schema version, on an engine of its own (MLflow keeps one per URI)."""
    import sqlalchemy
    from mlflow.store.db.utils import _verify_schema

    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    try:
        _verify_schema(engine)
        return True
    except Exception:
        return False
    finally:
        engine.dispose()


def _copy(source: Path, target: Path) -> None:
    """SQLite's own backup: a consistent copy even of a store another process has open."""
    with contextlib.closing(sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)) as src, \
            contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
