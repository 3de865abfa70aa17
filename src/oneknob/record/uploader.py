"""The uploader of a trailing one-job run (oneknob.record.trail): `python -m oneknob.record.uploader ENTRY`,
started by the command in a session of its own, output to upload.log beside the journal.

It opens the store, marks KILLED the runs killed oneknob processes left RUNNING, finishes the uploads whose
uploader died, then replays its journal into MLflow (oneknob.record.sync, under the journal's run ids) as the
journal grows, in its pauses (Pace), until the command closes this process's stdin (the journal is complete) or
exits.
A run the journal never ended (the command was killed) is then marked KILLED.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import sys
import time
from pathlib import Path

from oneknob.config import commands
from oneknob.console import make_console
from oneknob.record.sync import Syncer, _owner_gone, read_runs
from oneknob.record.tracking import PROCESS_TAG, _retry, process_id, reap_stale_runs

POLL_S = 0.25  # how often it looks at the journal while the command runs
QUIET_S = 0.5  # a journal that grew this recently is being written (a job measuring): its upload waits...
MAX_LAG_S = 5.0  # ...but MLflow is never more than this behind a journal that keeps growing


def _entries(folder: Path):
    """(entry, handle) for each upload whose uploader is gone, locked by this process now."""
    for entry in sorted(folder.glob("*.json")):
        try:
            handle = open(entry, "rb")
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (FileNotFoundError, BlockingIOError):
            continue
        yield entry, handle


def _kill_unended(syncer, journal: Path, uri: str) -> None:
    """Runs of a journal whose command is gone without an end record: KILLED, as reap_stale marks them."""
    for run in read_runs(journal):
        start = run.start or {}
        if run.end is not None or not _owner_gone(start.get("tags") or {}):  # done, or writing MLflow itself now
            continue
        tracker = syncer.tracker(uri, start.get("experiment") or "oneknob")
        target = syncer.mapped.get(run.run_id, run.run_id)
        found = _retry(tracker.client.get_run, target)
        if found.info.status != "RUNNING":
            continue
        owner = (start.get("tags") or {}).get(PROCESS_TAG, "?")
        _retry(tracker.client.set_tag, target, "oneknob.stale",
               f"left RUNNING by process {owner}, which is gone; marked KILLED by process {process_id()}")
        _retry(tracker.client.set_terminated, target, "KILLED")
        print(f"run {target}: its oneknob process {owner} is gone without ending it; marked KILLED", flush=True)


class Pace:
    """When to replay a growing journal: once it has been quiet for QUIET_S, or its oldest line not yet replayed
    is MAX_LAG_S old. While a job measures, its journal grows every few milliseconds and each replay is MLflow's
    CPU (SQLAlchemy, SQLite) on the cores the engine computes on: measured on 2 cores, replaying every 0.5 s made
    the requests after the first length ~1.5x the hand loop's (benchmarks/RESULTS.md). Replays then come in
    the pauses (the engine's start, the job's end, any QUIET_S without a new line) and at least every MAX_LAG_S."""

    def __init__(self) -> None:
        self.size: int | None = None
        self.grew_at = 0.0
        self.pending_since: float | None = None  # when the oldest line not yet replayed was seen

    def due(self, size: int, now: float) -> bool:
        if size != self.size:
            self.size, self.grew_at = size, now
            self.pending_since = now if self.pending_since is None else self.pending_since
        if self.pending_since is None:
            return False
        if now - self.grew_at >= QUIET_S or now - self.pending_since >= MAX_LAG_S:
            self.pending_since = None
            return True
        return False


def _upload(syncer, entry: dict, *, follow: bool) -> None:
    """Replay the entry's journal; with `follow`, keep at it (Pace) until its command says it is complete
    (closes this process's stdin) or is gone."""
    journal, uri = Path(entry["journal"]), entry["uri"]
    pace = Pace()
    while follow:
        if pace.due(journal.stat().st_size if journal.exists() else 0, time.monotonic()):
            _say(syncer.sync_journal(journal, uri, note=False))
        if select.select([sys.stdin], [], [], POLL_S)[0] and not os.read(sys.stdin.fileno(), 4096):
            break  # end of file: the command is done with the journal, or gone
    if journal.exists():
        _say(syncer.sync_journal(journal, uri))
        _kill_unended(syncer, journal, uri)


def _say(results: list[dict]) -> None:
    for r in results:
        if r["changed"]:
            what = ", ".join(f"+{r[k]} {k}" for k in ("metrics", "params", "tags", "artifacts") if r[k])
            print(f"run {r['mlflow_run_id']}{' (created)' if r['created'] else ''}: {what or 'nothing new'}"
                  f"{', status ' + r['status'] if r['status'] else ''}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oneknob.record.uploader", description=__doc__.split("\n\n")[0])
    parser.add_argument("entry", help="the upload's entry file (written by the command that started this)")
    entry_path = Path(parser.parse_args(argv).entry)
    entry = json.loads(entry_path.read_text())
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} uploading {entry['journal']} to {entry['uri']}", flush=True)
    syncer = Syncer(owner=process_id())
    code = 0
    try:
        tracker = syncer.tracker(entry["uri"], entry["experiment"])
        reap_stale_runs(tracker, make_console())
        for orphan, handle in _entries(entry_path.parent):  # uploads whose uploader died: finished here
            with handle:
                try:
                    taken = json.loads(orphan.read_text())
                    print(f"taking over the upload of {taken['journal']}", flush=True)
                    _upload(syncer, taken, follow=False)
                    orphan.unlink()
                except Exception as exc:  # that journal stays for the next uploader, or sync
                    print(f"could not upload it: {type(exc).__name__}: {str(exc)[:500]}", flush=True)
        _upload(syncer, entry, follow=True)
    except Exception as exc:  # the store refused: the journal keeps everything, sync uploads it later
        print(f"not uploaded: {type(exc).__name__}: {str(exc)[:500]}; fix the store and run "
              f"{commands.sync(Path(entry['journal']).parent, tracking_uri=entry['uri'])}", flush=True)
        code = 1
    else:
        entry_path.unlink(missing_ok=True)
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} done", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
