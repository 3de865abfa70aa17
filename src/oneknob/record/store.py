"""What oneknob keeps on disk: the journal, the point cache and stored references.

* Journal (per job, append-only JSON lines, flushed and fsynced): every point
  is written here before it goes to MLflow, so an MLflow outage loses nothing
  and `python -m oneknob sync` can upload it later.
* Point cache (per requested config): the raw logprobs of every measured
  prompt, keyed by everything that decides them (requested knobs, engine and
  its versions, hardware, model, corpus) plus sample and length. A rerun of a
  finished sweep reads it and starts no engine.
* References: the reference logprobs of each sample at the longest length,
  measured once and reused by every later sweep with the same key.
"""

from __future__ import annotations

import atexit
import contextlib
import json
from concurrent.futures import Future
from pathlib import Path

from oneknob import files
from oneknob.record import validate
from oneknob.record.store_threads import Fsyncs, Writer

from oneknob.files import (  # noqa: F401 (the store's file primitives, for its callers)
    digest,
    named,
    read_jsonl,
    locked,
    DISK_FULL,
    write_problem,
    ensure_writable_dir,
    write_json_atomic,
    read_json_or_set_aside,
    set_aside,
    replace_via_tmp,
)


_FSYNCS = Fsyncs()
_WRITER = Writer()


@atexit.register
def _at_exit() -> None:
    _WRITER.drain(timeout=60)
    with contextlib.suppress(OSError):  # a failure here was the run's to say (its tracker waited at its end)
        _FSYNCS.wait(timeout=60)


def append_jsonl(path: Path, *records: dict, durable: bool = True) -> None:
    """oneknob.files.append_jsonl, with the fsync of a durable append done by a background thread (`durable()`
    waits for it)."""
    files.append_jsonl(path, *records, durable=False)
    if durable:
        _FSYNCS.ask(path)


def durable(timeout: float | None = None) -> None:
    """Every durable append so far is on disk (fsynced); raises the first fsync that failed (an OSError naming
    the file)."""
    _FSYNCS.wait(timeout)


class PointCache:
    """Raw logprobs per (sample, length) for one requested config.

    With `enabled=False` (cache=false) nothing is read back, and fresh points
    supersede the stored ones: `compact()` keeps the newest record per point,
    so each point is in points.jsonl once. It reads the file again only when
    this process superseded a point (cache=false, or a point measured anew);
    a point two concurrent jobs both appended reads back as its newest record
    either way. Appends and compaction share a lock with concurrent jobs of
    the same config.
    """

    def __init__(self, root: Path, key: dict, enabled: bool = True):
        self.key = key
        self.dir = Path(root) / "points" / digest(key)
        self.enabled = enabled
        self._points: dict[tuple[int, int], dict] = {}
        self._superseded = not enabled  # what is on disk is unknown: compact() reads it
        self._writing: Future | None = None
        self._unwritten: list[dict] = []  # put, not yet handed to the writer (write)
        if enabled:
            self._load()

    def _load(self) -> None:
        """The cached points, each checked (record.validate): a file holding one that cannot be believed (NaN,
        a string, the wrong number of logprobs) is set aside whole, its good points written back, and the bad
        ones are measured afresh."""
        path = self.dir / "points.jsonl"
        probe = (self.key.get("axis") or {}).get("probe_length")
        records = read_jsonl(path)
        problems = [problem for record in records if (problem := validate.point_problem(record, probe))]
        good = [r for r in records if validate.point_problem(r, probe) is None] if problems else records
        for record in good:
            self._points[(record["sample"], record["length"])] = record
        if problems:
            with locked(self.dir / ".lock"):
                set_aside(path, "the point cache's file", f"{len(problems)} point(s) cannot be used: {problems[0]}")
                append_jsonl(path, *good, durable=False)

    def _meta(self) -> dict:
        """meta.json; a corrupt one is set aside (files.read_json_or_set_aside) and the config re-resolved."""
        return (read_json_or_set_aside(self.dir / "meta.json", "the point cache's record", check=validate.meta_problem)
                or {}) if self.enabled else {}

    @property
    def resolved(self) -> dict | None:
        return self._meta().get("resolved")

    @property
    def provenance(self) -> dict | None:
        """What the engine that measured the cached points imported (vLLM version, runner, emulation)."""
        return self._meta().get("provenance")

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
            self._superseded |= (record["sample"], length) in self._points
            self._points[(record["sample"], length)] = record
        self._unwritten += records  # this process reads its points from memory; write() puts them on disk

    def write(self) -> None:
        """The points put since the last write, to disk by a thread of its own (JSON of every logprob: the biggest
        write of a length). A job calls this once its next request is sent (EngineSession.while_engine_works):
        json.dumps holds the GIL for milliseconds, and while the engine works nothing waits for it. A Ctrl-C or
        SIGTERM still writes them (the job's end waits for them); a SIGKILL loses those not yet written (the last
        length's, for one request's time), and no fsync: a point lost so, or to a machine crash, is simply
        measured again. The journal is the durable record."""
        self._joined()  # the previous write: its failure (a full disk) is this job's
        if self._unwritten:
            records, self._unwritten = self._unwritten, []
            self._writing = _WRITER.submit(self._append, records)

    def _append(self, records: list[dict]) -> None:
        with locked(self.dir / ".lock"):
            append_jsonl(self.dir / "points.jsonl", *records, durable=False)

    def wait(self) -> None:
        """Every put() on disk (in the OS's hands); raises a write's failure."""
        self.write()
        self._joined()

    def _joined(self) -> None:
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def compact(self) -> int:
        """Keep the newest record of each point; returns how many superseded records were dropped."""
        path = self.dir / "points.jsonl"
        self.wait()
        if not self._superseded or not path.exists():
            return 0
        with locked(self.dir / ".lock"):
            records = read_jsonl(path)
            newest = {(r["sample"], r["length"]): r for r in records}
            if len(newest) == len(records):
                return 0
            replace_via_tmp(path, "".join(json.dumps(r) + "\n" for r in newest.values()))
            return len(records) - len(newest)

    def invalidate(self) -> int:
        self.wait()
        dropped = len(self._points)
        self._points.clear()
        with locked(self.dir / ".lock"):
            for name in ("points.jsonl", "meta.json"):
                (self.dir / name).unlink(missing_ok=True)
        return dropped
