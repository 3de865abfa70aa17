"""Files oneknob writes: durable appends, atomic JSON, advisory locks, writable-directory probes, and one line
for a write that failed (naming the file and its file system). A leaf: imports nothing of oneknob.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def user_cache() -> Path:
    """oneknob's cache of facts about this machine that every study shares: $XDG_CACHE_HOME/oneknob
    (~/.cache/oneknob): the empty MLflow store, vLLM's own checks of configurations per build."""
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "oneknob"


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def append_jsonl(path: Path, *records: dict, durable: bool = True) -> None:
    """Append records in one write; durably (flush + fsync) unless the caller can afford to redo it."""
    with named(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab+") as f:  # appends always land at the end; "+" lets us read the last byte
            f.seek(0, os.SEEK_END)
            torn = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
            # after a hard kill the last line may be torn: end it, or this record would be glued to it
            f.write((("\n" if torn else "") + "".join(json.dumps(r) + "\n" for r in records)).encode())
            f.flush()
            if durable:
                os.fsync(f.fileno())


@contextlib.contextmanager
def named(path: Path) -> Iterator[None]:
    """An OSError raised inside names `path` (a full disk's ENOSPC from write() names no file)."""
    try:
        yield
    except OSError as exc:
        exc.filename = exc.filename or str(path)
        raise


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line after a hard kill
            continue
    return records


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so concurrent jobs never measure the same thing twice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def write_problem(exc: BaseException, path: str | Path | None, what: str | None = None) -> str:
    """One line for a failed write of `path` (`what`, if given, says it better): a full disk named as such,
    with the file system it is on (an ENOSPC from write() carries no file name, so the caller's path)."""
    what = what or str(path)
    if not isinstance(exc, OSError):
        return f"cannot write {what}: {type(exc).__name__}: {exc}"
    if exc.errno in DISK_FULL:
        mount = _mount_point(Path(exc.filename or path)) if exc.filename or path else None
        return (f"disk full: cannot write {what} ({exc.strerror}"
                f"{f'; the file system mounted at {mount} is full' if mount else ''}); free space there "
                "and rerun the same command: finished points are kept")
    return f"cannot write {what}: {exc.strerror or exc}"


def _mount_point(path: Path) -> Path | None:
    try:
        path = path.resolve()
        while not os.path.ismount(path):
            path = path.parent
        return path
    except OSError:
        return None


def replace_via_tmp(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`; the temporary file never
    outlives a failure (a full disk)."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with named(path):
            tmp.write_text(text)
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def ensure_writable_dir(path: Path) -> None:
    """Create `path` and write a file there; OSError when either fails. Each caller's probe is a file of
    its own: concurrent sweeps must not unlink each other's."""
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path, prefix=".oneknob-write-test-"):
        pass


def read_json_or_set_aside(path: Path, what: str, check=None) -> dict | None:
    """A JSON object oneknob wrote, or None when there is none. A file that is not one (garbage, truncated,
    emptied), or whose content `check(value)` finds wrong (it returns why, else None: NaN, the wrong length), is
    renamed aside as <name>.corrupt-<time> (never deleted), said on stderr with its name, and None is returned,
    so the caller measures afresh instead of failing every job the same way."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        value = json.loads(text)
        if isinstance(value, dict):
            reason = check(value) if check is not None else None
            if reason is None:
                return value
        else:
            reason = f"it holds {type(value).__name__}, not an object"
    except (ValueError, UnicodeDecodeError) as exc:
        reason = f"not JSON: {exc}"
    set_aside(path, what, reason)
    return None


def set_aside(path: Path, what: str, reason: str) -> Path:
    """Rename a stored file oneknob cannot use to <name>.corrupt-<time> (never deleted) and say so on stderr."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):  # a concurrent job set it aside first
        os.replace(path, aside)
    print(f"warning: {what} {path} is corrupt ({reason}); the stored file is set aside as {aside.name} and "
          "measured afresh", file=sys.stderr, flush=True)
    return aside


def check_dir_place(path: Path) -> None:
    """Whether a directory can be made at `path`, without making it: OSError (with errno and strerror) when a
    name is too long, the path or a parent is a file, or the nearest existing parent cannot be written."""
    path = Path(os.path.abspath(path))
    for part in path.parts:
        if len(os.fsencode(part)) > 255:
            raise OSError(errno.ENAMETOOLONG, f"{os.strerror(errno.ENAMETOOLONG)}: a name of {len(part)} characters "
                                              "(at most 255 bytes)", str(path))
    if path.exists() and not path.is_dir():
        raise OSError(errno.ENOTDIR, f"{os.strerror(errno.ENOTDIR)}: it is a file", str(path))
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OSError(errno.ENOTDIR, f"{os.strerror(errno.ENOTDIR)}: {parent} is a file", str(path))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OSError(errno.EACCES, f"{os.strerror(errno.EACCES)}: {parent} is not writable", str(path))


def write_json_atomic(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_via_tmp(path, json.dumps(value, indent=1, default=str))
