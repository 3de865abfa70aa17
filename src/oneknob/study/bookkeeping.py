"""How a job ends: its files, its run's summary and final status, whatever fails on the way.

`finish(job, outcome, status)` ends the job's MLflow run FINISHED, FAILED or KILLED in every case. A step of
the job's own bookkeeping that fails (the cache's compaction, points.csv, result.json, error.txt, the
journal, an artifact copied into a local store: in practice a full disk) is listed in the outcome's
`bookkeeping`, and fails a job that had finished, with the first such problem as its error; the steps after
it still run, so the run gets what can still be written. Temporary files never outlive a failed write
(store.write_json_atomic). error.txt belongs to the attempt that wrote it: `set_aside_error` moves a
resumed job's old one to error.previous.txt, which is never logged.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from rich.markup import escape

from oneknob.config import commands
from oneknob.verdict import findings
from oneknob.record import store
from oneknob.run.engine_log import warning_lines
from oneknob.run.executor import WorkerError
from oneknob.console import make_console, say
from oneknob.study import terminal

console = make_console()

POINT_FIELDS = ("length", "sample", "nll", "scored", "seconds", "nll_ref", "delta_nll", "max_abs_delta",
                "share_deviating", "first_deviation", "polluted", "cached", "nll_polluted", "topk_overlap",
                "topk_kl", "topk_polluted", "greedy_match", "greedy_first_divergence", "greedy_polluted",
                "decode_nll", "decode_nll_ref", "decode_delta", "decode_max_delta", "decode_first_deviation",
                "decode_polluted", "malformed")
ARTIFACTS = ("points.csv", "result.json", "resolved_config.json", "resolved_diff.json", "error.txt")


def failure(exc: BaseException) -> dict[str, Any]:
    """What a failed job's outcome says: the error's line, and the root cause the worker's log gave
    (engine_log.root_cause), when there is one."""
    cause = getattr(exc, "cause", None)
    return {"status": "failed", "error": error_text(exc), **({"error_cause": cause} if cause else {})}


def error_text(exc: BaseException) -> str:
    """One line for what failed a job; a full disk says which file and file system."""
    if isinstance(exc, OSError) and exc.errno in store.DISK_FULL:
        return store.write_problem(exc, exc.filename)
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if isinstance(exc, (WorkerError, ValueError, RuntimeError)) else f"{type(exc).__name__}: {text}"


def set_aside_error(job_dir: Path) -> None:
    """A resumed job's error.txt is its failed attempt's: keep it as error.previous.txt, never this run's."""
    try:
        os.replace(job_dir / "error.txt", job_dir / "error.previous.txt")
    except FileNotFoundError:
        pass
    except OSError:
        with contextlib.suppress(OSError):
            (job_dir / "error.txt").unlink()


def write_error(job_dir: Path, text: str, log_tail: str) -> str | None:
    """error.txt: the error and the end of the worker log; the problem when it cannot be written."""
    path = job_dir / "error.txt"
    try:
        path.write_text(f"{text}\n" + (f"\n--- worker log tail ---\n{log_tail}" if log_tail else ""))
    except OSError as exc:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)  # a truncated error.txt would pass for the whole story
        return store.write_problem(exc, path, "error.txt")
    return None


def write_points_csv(path: Path, points: dict[int, list]) -> None:
    rows = [",".join(POINT_FIELDS)]
    for length in sorted(points):
        for p in points[length]:
            rows.append(",".join("" if (v := getattr(p, f)) is None else _cell(v) for f in POINT_FIELDS))
    path.write_text("\n".join(rows) + "\n")


def _cell(value: Any) -> str:
    """A points.csv cell: a malformed answer's reasons ({oracle: reason}) as one text without commas."""
    if isinstance(value, dict):
        return " | ".join(f"{k}: {v}" for k, v in value.items()).replace(",", ";")
    return str(value)


def finish(job, outcome: dict[str, Any], status: str) -> None:
    """Files, summary, tags, artifacts and the final status of `job`'s run (see the module's docstring)."""
    job_dir, tracker, run_id = job.job_dir, job.tracker, job.run_id
    problems: list[str] = outcome.pop("bookkeeping", [])

    def attempt(what: str | None, path: Path | None, action, *args) -> None:
        try:
            action(*args)
        except Exception as exc:
            if (problem := store.write_problem(exc, path, what)) not in problems:
                problems.append(problem)

    def settle(status: str) -> str:
        """The status once the bookkeeping problems so far are known."""
        if tracker.disk_problem and tracker.disk_problem not in problems:
            problems.append(tracker.disk_problem)
        if problems:
            outcome["bookkeeping"] = list(problems)
        if not problems or status != "FINISHED":
            return status
        outcome.update(status="failed", error=problems[0])
        if problem := write_error(job_dir, "\n".join(problems), ""):
            outcome["bookkeeping"].append(problem)
        console.print(f"[red]FAILED[/] {job.plan.name}: {problems[0]}")
        return "FAILED"

    ended = False
    try:
        if job.cache is not None:  # cache=false or a concurrent job superseded some points
            attempt(f"the point cache {job.cache.dir}", job.cache.dir, job.cache.compact)
        cached = sum(p.cached for pts in job.points.values() for p in pts)
        outcome.setdefault("points_cached", cached)
        outcome.setdefault("points_measured", sum(len(pts) for pts in job.points.values()) - cached)
        attempt(None, job_dir / "points.csv", write_points_csv, job_dir / "points.csv", job.points)
        if (job_dir / "worker.log").exists():  # vLLM says there what it did to the model, or to the environment
            outcome["engine_warnings"] = warning_lines(job_dir / "worker.log")  # [] too: compared across runs
        status = settle(status)
        attempt(None, job_dir / "result.json", store.write_json_atomic, job_dir / "result.json", outcome)
        summary = [("points_cached", outcome["points_cached"], 0),
                   ("points_measured", outcome["points_measured"], 0)]
        found_metrics, found_tags = findings.summary(outcome)
        if job.session.ready is not None:
            summary.append(("engine_start_s", job.session.ready.start_s, 0))
        attempt("the summary metrics", None, tracker.log_metrics, run_id, summary + found_metrics)
        logged = [job_dir / name for name in ARTIFACTS if (job_dir / name).exists()]
        if status != "FINISHED" and (job_dir / "worker.log").exists():
            logged.append(job_dir / "worker.log")
        for path in logged:
            attempt(f"the artifact {path.name}", None, tracker.log_artifact, run_id, path)
        if (settled := settle(status)) != status:  # the journal or an artifact copy failed: say it everywhere
            attempt(None, job_dir / "result.json", store.write_json_atomic, job_dir / "result.json", outcome)
            for name in ("result.json", "error.txt"):
                if (job_dir / name).exists():
                    attempt(f"the artifact {name}", None, tracker.log_artifact, run_id, job_dir / name)
            status = settled
        tags = {"oneknob.status": outcome["status"], **found_tags}
        if "engine_warnings" in outcome:
            tags["oneknob.engine_warnings"] = _fitting(outcome["engine_warnings"])
        if outcome.get("error_cause"):
            tags["oneknob.error_cause"] = json.dumps(outcome["error_cause"])
        if outcome.get("error"):
            tags["oneknob.error"] = outcome["error"][:1000]
        attempt("the run's tags", None, tracker.set_tags, run_id, tags)
        tracker.finish(run_id, status, outcome=outcome)  # the journal's "end" record, then MLflow's status
        if (settled := settle(status)) != status:  # the journal could not take the end record itself
            status = settled
            tracker.finish(run_id, status, outcome=outcome)
        ended = True
    finally:
        if not ended:  # a second Ctrl-C, or a bug above: the run still ends
            with contextlib.suppress(Exception):
                tracker.finish(run_id, "KILLED" if status == "KILLED" else "FAILED", outcome=outcome)
    if tracker.ok:
        attempt("the journal artifact", None, tracker.log_artifact, run_id, job.journal)  # complete now: after the end
    else:
        upload = commands.sync(job_dir, tracking_uri=job.plan.tracking_uri)
        outcome["tracking"] = f"incomplete ({tracker.problem}): run {upload}"
        attempt(None, job_dir / "result.json", store.write_json_atomic, job_dir / "result.json", outcome)
        console.print(f"[yellow]{escape(job.plan.name)}: finished into the journal {escape(str(job.journal))}, but "
                      f"MLflow lacks part of it: {escape(upload)}[/]")
    sweep_dir = job.plan.sweep.dir if job.plan.sweep else None
    for warning in terminal.unshown_warnings(sweep_dir, outcome.get("engine_warnings") or []):  # once per sweep
        say(console, f"  {escape(outcome['name'])}: engine warning: {escape(warning)}")
    say(console, one_line(outcome))


def _fitting(warnings: list[str], limit: int = 7500) -> str:
    """The warnings as a JSON list that fits an MLflow tag (8000 characters): the last ones left out if need be
    (result.json keeps them all)."""
    while len(text := json.dumps(warnings)) > limit:
        warnings = warnings[:-1]
    return text


def one_line(outcome: dict) -> str:
    name, status = outcome["name"], outcome["status"]
    if status in ("failed", "killed"):
        return f"[red]{name}: {status}[/] - {outcome.get('error', '')}"
    if "describe" not in outcome:
        return f"[yellow]{name}: {status}[/] - {outcome.get('note', '')}"
    extra = f" [yellow]({status}: {outcome['note']})[/]" if status == "confounded" else ""
    return (f"[bold]{name}[/]: {outcome['describe']}; {outcome['probes']} probes, "
            f"{outcome['points_cached']} cached / {outcome['points_measured']} measured{extra}")
