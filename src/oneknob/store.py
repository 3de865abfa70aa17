"""What oneknob keeps on disk: the journal, the point cache and stored references.

* Journal (per job, append-only JSON lines, flushed and fsynced): every point
  is written here before it goes to MLflow, so an MLflow outage loses nothing
  and `python -m oneknob.sync` can upload it later.
* Point cache (per requested config): the raw logprobs of every measured
  prompt, keyed by everything that decides them (requested knobs, engine and
  its versions, hardware, model, corpus) plus sample and length. A rerun of a
  finished sweep reads it and starts no engine.
* References: the reference logprobs of each sample at the longest length,
  measured once and reused by every later sweep with the same key.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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


def _replace_via_tmp(path: Path, text: str) -> None:
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


def write_json_atomic(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace_via_tmp(path, json.dumps(value, indent=1, default=str))


class PointCache:
    """Raw logprobs per (sample, length) for one requested config.

    With `enabled=False` (cache=false) nothing is read back, and fresh points
    supersede the stored ones: `compact()` keeps the newest record per point,
    so each point is in points.jsonl once. Appends and compaction share a lock
    with concurrent jobs of the same config.
    """

    def __init__(self, root: Path, key: dict, enabled: bool = True):
        self.key = key
        self.dir = Path(root) / "points" / digest(key)
        self.enabled = enabled
        self._points: dict[tuple[int, int], dict] = {}
        if enabled:
            for record in read_jsonl(self.dir / "points.jsonl"):
                self._points[(record["sample"], record["length"])] = record

    @property
    def resolved(self) -> dict | None:
        meta = self.dir / "meta.json"
        return json.loads(meta.read_text()).get("resolved") if self.enabled and meta.exists() else None

    @property
    def provenance(self) -> dict | None:
        """What the engine that measured the cached points imported (vLLM version, runner, emulation)."""
        meta = self.dir / "meta.json"
        return json.loads(meta.read_text()).get("provenance") if self.enabled and meta.exists() else None

    def remember_resolved(self, resolved: dict, provenance: dict) -> None:
        write_json_atomic(self.dir / "meta.json", {"key": self.key, "resolved": resolved,
                                                   "provenance": provenance})

    def get(self, sample: int, length: int) -> dict | None:
        return self._points.get((sample, length)) if self.enabled else None

    def put(self, length: int, measured: dict[int, dict]) -> None:
        """The freshly measured samples of one length: {sample: {"logprobs", "seconds", and "topk" / "greedy"
        when the oracles asked for them}}."""
        records = [{"sample": sample, "length": length, **scored} for sample, scored in measured.items()]
        for record in records:
            self._points[(record["sample"], length)] = record
        with locked(self.dir / ".lock"):
            # No fsync: a killed process loses nothing the OS holds, and a point lost to a machine
            # crash is simply measured again. The journal is the durable record.
            append_jsonl(self.dir / "points.jsonl", *records, durable=False)

    def compact(self) -> int:
        """Keep the newest record of each point; returns how many superseded records were dropped."""
        path = self.dir / "points.jsonl"
        if not path.exists():
            return 0
        with locked(self.dir / ".lock"):
            records = read_jsonl(path)
            newest = {(r["sample"], r["length"]): r for r in records}
            if len(newest) == len(records):
                return 0
            _replace_via_tmp(path, "".join(json.dumps(r) + "\n" for r in newest.values()))
            return len(records) - len(newest)

    def invalidate(self) -> int:
        dropped = len(self._points)
        self._points.clear()
        with locked(self.dir / ".lock"):
            for name in ("points.jsonl", "meta.json"):
                (self.dir / name).unlink(missing_ok=True)
        return dropped
