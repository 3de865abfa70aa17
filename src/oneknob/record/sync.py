"""Upload to MLflow what a journal holds and MLflow lacks; safe to run any number of times.

    python -m oneknob sync                       # every journal under ./outputs and ./multirun
    python -m oneknob sync multirun/2026-...     # journals under these paths (dirs or journal.jsonl files)
    python -m oneknob sync --tracking-uri http://127.0.0.1:5000

Every tracking call of a job or sweep is journaled before it goes to MLflow
(journaled.JournaledTracker), so a journal can rebuild its runs. For each run
of a journal, sync finds the run in the store (by its id, or by the tag
`oneknob.journal_run_id` for a run created while the store was unreachable),
creates it when missing, and adds only what the store lacks: metric steps not
in the run's history, params not yet set, tags that differ, artifacts not yet
there, and the final status. What it uploaded is appended to the journal as a
`synced` record. Without --tracking-uri each run goes to the URI it was meant
for (recorded in the journal).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from oneknob.config import commands
from oneknob.record import store
from oneknob.record.tracking import (PROCESS_TAG, Tracker, TrackingError, _param_text, _process_alive, _retry,
                                     create_run_as, default_uri)

JOURNAL = "journal.jsonl"
JOURNAL_TAG = "oneknob.journal_run_id"  # on a run sync created: the id its journal knows it by


@dataclass
class RunRecords:
    run_id: str
    start: dict | None = None
    params: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)
    metrics: list = field(default_factory=list)  # [key, value, step, timestamp_ms]
    artifacts: list = field(default_factory=list)  # (path, artifact_path)
    end: dict | None = None


def find_journals(paths: list[str | Path]) -> list[Path]:
    """journal.jsonl files under the given paths (default ./outputs and ./multirun), sweeps before their jobs."""
    roots = [Path(p) for p in paths] or [Path("outputs"), Path("multirun")]
    found = set()
    for root in roots:
        if root.is_file():
            found.add(root.resolve())
        elif root.is_dir():
            found.update(p.resolve() for p in root.rglob(JOURNAL))
    return sorted(found, key=lambda p: (len(p.parts), str(p)))


def read_runs(journal: Path) -> list[RunRecords]:
    runs: dict[str, RunRecords] = {}
    for record in store.read_jsonl(journal):
        run_id = record.get("run_id")
        if not run_id or record.get("kind") in (None, "point", "synced"):
            continue
        run = runs.setdefault(run_id, RunRecords(run_id))
        kind = record["kind"]
        if kind == "run":
            run.start = record
        elif kind == "params":
            run.params.update(record["params"])
        elif kind == "tags":
            run.tags.update(record["tags"])
        elif kind == "metrics":
            run.metrics.extend(record["metrics"])
        elif kind == "artifact":
            run.artifacts.append((record["path"], record.get("artifact_path")))
        elif kind == "end":
            run.end = record
    return list(runs.values())


def unreadable_lines(journal: Path) -> list[int]:
    """Line numbers (1-based) of a journal that are not JSON records: garbage, or a line torn by a hard kill."""
    bad = []
    with open(journal, errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                if not isinstance(json.loads(line), dict):
                    bad.append(number)
            except ValueError:
                bad.append(number)
    return bad


def _owner_gone(tags: dict) -> bool:
    """The oneknob process that ran a run is gone (on this host), or unknown; False while it may still run."""
    parts = tags.get(PROCESS_TAG, "").rsplit(":", 2)
    if len(parts) != 3:
        return True
    if parts[0] != socket.gethostname():
        return False  # another machine's process: it may still be running there
    try:
        return not _process_alive(int(parts[1]), parts[2])
    except ValueError:
        return True


class Syncer:
    def __init__(self, tracking_uri: str | None = None, owner: str | None = None):
        self.tracking_uri = tracking_uri
        # a trailing uploader owns the runs it creates while it uploads (PROCESS_TAG), so no other oneknob
        # process reaps one whose command has exited before its upload is done
        self.owner = owner
        self._trackers: dict[tuple[str, str], Tracker] = {}
        self.mapped: dict[str, str] = {}  # journal run id -> store run id

    def tracker(self, uri: str, experiment: str) -> Tracker:
        key = (uri, experiment)
        if key not in self._trackers:
            self._trackers[key] = Tracker(uri, experiment)
        return self._trackers[key]

    def _store_run(self, tracker: Tracker, run: RunRecords):
        """The store's run for a journal run, created when missing; (run, created)."""
        from mlflow.exceptions import MlflowException

        client = tracker.client
        if run.run_id in self.mapped:
            return client.get_run(self.mapped[run.run_id]), False
        try:
            found = client.get_run(run.run_id)
            self.mapped[run.run_id] = run.run_id
            return found, False
        except MlflowException:
            pass
        hits = _retry(client.search_runs, [tracker.experiment_id],
                      filter_string=f"tags.`{JOURNAL_TAG}` = '{run.run_id}'", max_results=1)
        if hits:
            self.mapped[run.run_id] = hits[0].info.run_id
            return hits[0], False
        start = run.start or {}
        tags = dict(start.get("tags") or {})
        parent = start.get("parent_run_id")
        if parent:
            tags["mlflow.parentRunId"] = self.mapped.get(parent, parent)
        create = dict(run_name=start.get("name"), start_time=int(start.get("time", time.time()) * 1000))
        if start.get("trail"):  # its command printed and journaled this id: the run gets it (record.trail)
            tags |= {PROCESS_TAG: self.owner} if self.owner else {}
            created = create_run_as(client, run.run_id, tracker.experiment_id, tags=tags, **create)
        else:
            created = _retry(client.create_run, tracker.experiment_id, tags=tags | {JOURNAL_TAG: run.run_id},
                             **create)
        self.mapped[run.run_id] = created.info.run_id
        return created, True

    def sync_run(self, run: RunRecords, fallback_uri: str, lost_lines: str = "") -> dict:
        from mlflow.entities import Metric, Param

        start = run.start or {}
        uri = self.tracking_uri or start.get("tracking_uri") or fallback_uri
        tracker = self.tracker(uri, start.get("experiment") or "oneknob")
        client = tracker.client
        found, created = self._store_run(tracker, run)
        target = found.info.run_id
        done = {"run_id": run.run_id, "mlflow_run_id": target, "uri": uri, "created": created}

        params = [Param(k, _param_text(v)) for k, v in run.params.items() if k not in found.data.params]
        for i in range(0, len(params), 100):
            _retry(client.log_batch, target, params=params[i:i + 100])
        tags = {k: v for k, v in run.tags.items() if found.data.tags.get(k) != v}
        for key, value in tags.items():
            _retry(client.set_tag, target, key, value)

        by_key = defaultdict(list)
        for key, value, step, timestamp in run.metrics:
            by_key[key].append(Metric(key, float(value), int(timestamp), int(step)))
        missing = []
        for key, metrics in by_key.items():
            have = {m.step for m in _retry(client.get_metric_history, target, key)}
            for metric in metrics:  # a step once: the journal may repeat nothing MLflow already has
                if metric.step not in have:
                    have.add(metric.step)
                    missing.append(metric)
        for i in range(0, len(missing), 500):
            _retry(client.log_batch, target, metrics=missing[i:i + 500])

        uploaded = 0
        for path, artifact_path in run.artifacts:
            have = {Path(a.path).name for a in _retry(client.list_artifacts, target, artifact_path)}
            if Path(path).name not in have and Path(path).exists():
                _retry(client.log_artifact, target, path, artifact_path)
                uploaded += 1

        status = None
        if run.end and found.info.status != run.end["status"]:
            status = run.end["status"]
            _retry(client.set_terminated, target, status, end_time=int(run.end.get("time", time.time()) * 1000))
        elif (run.end is None and lost_lines and (found.info.status == "RUNNING" or created)
              and _owner_gone(found.data.tags | (run.start or {}).get("tags", {}))):
            # its end record may be on an unreadable line, and no process will write another: end it
            status = "KILLED"
            _retry(client.set_tag, target, "oneknob.stale", f"its journal has unreadable line(s) {lost_lines} and no "
                   "end record for it; its oneknob process is gone; marked KILLED by python -m oneknob sync")
            _retry(client.set_terminated, target, status)
        return done | {"params": len(params), "tags": len(tags), "metrics": len(missing),
                       "artifacts": uploaded, "status": status}

    def sync_journal(self, journal: Path, fallback_uri: str, note: bool = True) -> list[dict]:
        """Upload what the store lacks; `note` False: a journal its command is still writing (its last line
        may be half written), so no unreadable line is reported and no `synced` record appended to it."""
        results = []
        lost = ", ".join(map(str, unreadable_lines(journal))) if note else ""
        if lost:
            print(f"sync: warning: {journal}: line(s) {lost} are not journal records (garbage or torn by a kill) "
                  "and are skipped; a run whose end record was there and whose process is gone is marked KILLED",
                  file=sys.stderr)
        for run in read_runs(journal):
            result = self.sync_run(run, fallback_uri, lost)
            changed = result["created"] or result["status"] or any(
                result[k] for k in ("params", "tags", "metrics", "artifacts"))
            if changed and note:
                try:
                    store.append_jsonl(journal, {"kind": "synced", "time": time.time(), **result})
                except OSError:  # a note for the reader only (a full disk): the store has the run
                    pass
            results.append(result | {"changed": bool(changed)})
        return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oneknob sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="journal files or directories (default: ./outputs ./multirun)")
    parser.add_argument("--tracking-uri", help="send every run here (default: the URI its journal recorded)")
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        print(f"sync: {', '.join(missing)}: no such file or directory; give sweep or job directories (multirun/..., "
              "outputs/...) or journal.jsonl files, or no path for all under ./outputs and ./multirun",
              file=sys.stderr)
        return 2
    journals = find_journals(args.paths)
    if not journals:
        print(f"sync: no {JOURNAL} under {' '.join(args.paths) or 'outputs/ multirun/'}", file=sys.stderr)
        return 0
    syncer = Syncer(args.tracking_uri)
    failed = 0
    for journal in journals:
        try:
            results = syncer.sync_journal(journal, default_uri())
        except Exception as exc:  # a store that refuses writes (read-only, full, gone): say so, go on
            failed += 1
            reason = exc if isinstance(exc, TrackingError) else f"{type(exc).__name__}: {str(exc)[:300]}"
            print(f"sync: {journal}: not uploaded ({reason}); fix the store (or pass --tracking-uri) and run "
                  f"{commands.sync(journal.parent, tracking_uri=args.tracking_uri)} again: it adds only what is "
                  "missing", file=sys.stderr)
            continue
        for r in results:
            if not r["changed"]:
                print(f"{journal}: run {r['mlflow_run_id']} up to date")
                continue
            what = ", ".join(f"+{r[k]} {k}" for k in ("metrics", "params", "tags", "artifacts") if r[k])
            print(f"{journal}: run {r['mlflow_run_id']}{' (created)' if r['created'] else ''}: "
                  f"{what or 'nothing new'}{', status ' + r['status'] if r['status'] else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
