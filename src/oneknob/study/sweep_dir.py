"""One sweep per sweep directory: claimed before anything is written there, held until the sweep ends.

Two sweeps in one directory read each other's plans/<n>.json and replace each other's report; so a sweep claims
its directory first: an advisory lock (`.sweep.lock`, held by this process until it ends) and a record of who
holds it (`sweep.json`: the sweep's id, its command, its pid). A directory another live sweep holds is refused
at once, naming that sweep and its pid. A directory that holds a finished (or killed) sweep's files is taken
only by the same command, which resumes it (its points come from the cache, its report is rebuilt: said); any
other command is refused, so a finished sweep's report, summary and job dirs are never replaced silently.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from oneknob import files
from oneknob.errors import ConfigError

LOCK, RECORD = ".sweep.lock", "sweep.json"
RESULTS = ("summary.json", "report.md", "journal.jsonl", "plans", "0")  # what a sweep leaves in its directory
_held: dict[str, int] = {}  # directory -> the descriptor holding its lock (released when this process ends)
_made: dict[str, Path] = {}  # directory -> the first of it and its parents that claim() made
_locks: set[str] = set()  # directories whose lock file claim() created (removed again on release)
_owner = os.getpid()  # a forked child never releases its parent's claim (flock's lock is the open file's)


def _record(path: Path) -> dict:
    try:
        value = json.loads((path / RECORD).read_text())
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def claim(path: Path, sweep_id: str, command: str, key: str = "hydra.sweep.dir", record: bool = True) -> str | None:
    """Claim `path` for this sweep, or refuse (ConfigError, before anything is written there). Returns a line to
    print when the sweep resumes a previous one in the same directory, else None. `record=False` (a dry run):
    held, but left as it was found (a dry run replaces nothing)."""
    path = Path(path).resolve()
    made = path
    while not made.parent.exists():  # the first directory this claim makes (a refusal later removes them again)
        made = made.parent
    made = None if path.exists() else made
    path.mkdir(parents=True, exist_ok=True)
    if str(path) in _held:  # this process holds it already (a bisection's second launch)
        return None
    global _owner
    _owner = os.getpid()
    try:
        fd, created = _lock(path)
    except BlockingIOError:
        other = _record(path)
        raise ConfigError(f"{key}={path}: in use by sweep {other.get('sweep_id', '?')}, pid {other.get('pid', '?')}"
                          f" (still running: {other.get('command', 'its command unknown')}); wait for it to end, or "
                          f"give this sweep a directory of its own ({key}=<another dir>, or leave {key} at its "
                          "default, which names a new one)") from None
    previous = _record(path)
    if not previous and (path / RECORD).exists():  # a sweep.json oneknob cannot read is no claim of its own
        _unlock(path, fd, created)
        raise ConfigError(f"{key}={path}: its {RECORD} is not a sweep record oneknob can read (oneknob writes it "
                          "whole, so it is another tool's or damaged), and this sweep would replace it; give this "
                          f"sweep a directory of its own ({key}=<another dir>, or leave {key} at its default), or "
                          f"move {path / RECORD} away first")
    said = None
    if created:
        _locks.add(str(path))
    if made is not None:
        _made[str(path)] = made
    if not record:
        _held[str(path)] = fd
        return None
    if previous.get("command") == command:
        said = (f"resuming sweep {previous.get('sweep_id')} in {path} (the same command): its finished points come "
                "from the cache; report.md and summary.json are rebuilt as this sweep's")
    elif previous or any((path / name).exists() for name in RESULTS):
        _unlock(path, fd, created)
        who = (f"sweep {previous.get('sweep_id')} ({previous.get('command')})" if previous else
               "another sweep's results")
        raise ConfigError(f"{key}={path}: it holds {who}, whose report.md, summary.json and job dirs this sweep "
                          f"would replace; give this sweep a directory of its own ({key}=<another dir>, or leave "
                          f"{key} at its default, which names a new one), or move those files away first")
    _held[str(path)] = fd
    try:
        files.write_json_atomic(path / RECORD, {"sweep_id": sweep_id, "command": command, "pid": os.getpid(),
                                                "started": time.time()})
    except OSError as exc:  # a full disk before anything ran: refused like any unusable output place
        raise ConfigError(f"{key}={path}: {files.write_problem(exc, path / RECORD)}") from None
    return said


def _lock(path: Path) -> tuple[int, bool]:
    """The directory's lock, held: (descriptor, whether this call created the lock file). A lock taken on a file
    that a releasing sweep unlinked meanwhile is no lock: taken again on the file now there. BlockingIOError: held."""
    while True:
        created = not (path / LOCK).exists()
        fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise
        try:
            if os.fstat(fd).st_ino == os.stat(path / LOCK).st_ino:
                return fd, created
        except FileNotFoundError:
            pass
        os.close(fd)


def _unlock(path: Path, fd: int, created: bool) -> None:
    if created:  # unlinked while held: a sweep claiming it next takes the lock of a new file
        with contextlib.suppress(OSError):
            (path / LOCK).unlink()
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def release(path: Path) -> None:
    """Let another sweep claim `path` (this process's sweep is done with it). A directory the claim made and
    nothing wrote into since (the sweep was refused after it) is removed again, with the parents it made."""
    if os.getpid() != _owner:
        return
    path = Path(path).resolve()
    fd = _held.pop(str(path), None)
    if fd is not None:
        _unlock(path, fd, str(path) in _locks)
        _locks.discard(str(path))
    made = _made.pop(str(path), None)
    with contextlib.suppress(OSError):
        if made is not None and set(os.listdir(path)) <= {LOCK, RECORD}:
            for name in (LOCK, RECORD):
                (path / name).unlink(missing_ok=True)
            while True:
                path.rmdir()
                if path == made:
                    break
                path = path.parent


def release_all() -> None:
    """Every directory this process claimed, released (its sweep ended, however)."""
    for held in list(_held):
        release(Path(held))
