"""Cross-run comparison, rebuilt from MLflow alone.

    python -m oneknob compare                    # the latest sweep in ./mlruns/mlflow.db, any experiment
    python -m oneknob compare --sweep ID         # a named sweep
    python -m oneknob compare --runs ID [ID ...] # any set of job runs

Everything comes from the tracking store: tags (oneknob.knob/value/status/
check/transitions, the git commit, the user's tags), params (knob.* =
requested, resolved.*, defaults.*, search.*, verdict.*, version.*,
provenance.*, hardware.*, model, reference, samples), summary metrics
(transitions, probes, search_budget_hit) and per-length histories (nll,
nll_ref, delta_nll, polluted, polluted_samples). Deleting a sweep directory
loses nothing. The sweepers call `after_sweep` at the end of every multirun:
it also writes the report into the parent run's description, nests the
reference the sweep measured under it, and prints where the UI shows the runs.
analysis.py says what the runs mean; report.py renders summary.json, report.md
and the plots.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from oneknob.explain import analysis
from oneknob.explain import publish
from oneknob.explain import report
from oneknob import files
from oneknob.config import commands
from oneknob.config.schema import DECODE_ORACLES
from oneknob.verdict import search
from oneknob.record import tags as run_tags, trail
from oneknob.console import make_console
from oneknob.record.tracking import default_uri, quiet_mlflow

JOB_FILTER = "tags.`oneknob.role` = 'job'"
SWEEP_FILTER = "tags.`oneknob.role` = 'sweep'"
# What the worker imported, as the report shows it (provenance.* holds more: the VLLM_* environment, kwargs)
PROVENANCE = ("engine", "vllm", "torch", "cuda", "device", "gpu", "model_runner", "drafter", "python",
              "server_command",  # engine=vllm_server: the `vllm serve` command line that reproduces the run
              "llm_kwargs")  # the exact LLM(...) arguments the engine was built with (repro.py is built from them)


class CompareError(RuntimeError):
    pass


def _value(text: str | None) -> Any:
    """A param or tag as logged (json for values, str() for lists, raw text for strings)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _prefixed(params: dict[str, str], prefix: str) -> dict[str, Any]:
    return {k[len(prefix):]: _value(v) for k, v in sorted(params.items()) if k.startswith(prefix)}


def _resolved(params: dict[str, str]) -> dict[str, Any]:
    """The resolved config, with the model's length fields (params model_config.<path>) under model_quantities
    as candidates model.<path> (config.quantities.derived_quantities reads them there)."""
    resolved = _prefixed(params, "resolved.")
    model = {f"model.{k}": v for k, v in _prefixed(params, "model_config.").items() if isinstance(v, int)}
    config = {k: v for k, v in _prefixed(params, "engine_config.").items() if isinstance(v, int)}
    return resolved | ({"model_quantities": model} if model and resolved else {}) | (
        {"config_quantities": config} if config and resolved else {})


def _history(client, run_id: str, key: str) -> dict[int, float]:
    by_step: dict[int, float] = {}
    for metric in client.get_metric_history(run_id, key):
        by_step[int(metric.step)] = metric.value  # a re-logged step: the later value wins
    return dict(sorted(by_step.items()))


def load_run(client, run) -> dict[str, Any]:
    """One job run as plain data: what was asked, what the engine resolved, what was measured."""
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    knob = tags.get("oneknob.knob")
    knob = None if knob in (None, "baseline") else knob
    status = tags.get("oneknob.status") or f"unfinished ({run.info.status})"
    check = json.loads(tags.get("oneknob.check") or "{}")
    nll = _history(client, run.info.run_id, "nll")
    nll_ref = _history(client, run.info.run_id, "nll_ref")
    delta = _history(client, run.info.run_id, "delta_nll")
    polluted = _history(client, run.info.run_id, "polluted")
    polluted_samples = _history(client, run.info.run_id, "polluted_samples")
    axis = json.loads(tags.get("oneknob.axis_detail") or "null") or {"name": tags.get("oneknob.axis") or "length"}
    extra = {key: _history(client, run.info.run_id, key) for key in
             {"batch": ("step_tokens", "co_scheduled"), "repeat": ("identical", "max_abs_delta_logprob")}.get(
                 axis["name"], ())}
    asked = [o for o in (params.get("oracles") or "").split(",") if o]
    return {
        "oracles": _oracles(client, run.info.run_id, asked, tags) if status in analysis.MEASURED else {},
        "decode": _decode_points(client, run.info.run_id) if set(asked) & set(DECODE_ORACLES) else {},
        "run_id": run.info.run_id,
        "name": run.info.run_name or (f"{knob}={tags.get('oneknob.value')}" if knob else "baseline"),
        "sweep_id": tags.get("oneknob.sweep_id"),
        "parent_run_id": tags.get("mlflow.parentRunId"),
        "start_time": run.info.start_time,
        "engine": params.get("engine") or tags.get("oneknob.engine"),
        "knob": knob,
        "value": _value(tags.get("oneknob.value")) if knob else None,
        "followup": tags.get("oneknob.followup") == "true",  # a follow-up the sweep ran to test an edge
        "followup_of": json.loads(tags.get("oneknob.followup_of") or "null"),
        "status": status,
        "check": check,
        "pinned": check.get("pinned", {}),
        "confounded": check.get("confounded", False),
        "requested": _prefixed(params, "knob."),
        "resolved": _resolved(params),
        "suspects": json.loads(tags.get("oneknob.suspects") or "{}"),
        "reference_per_length": tags.get("oneknob.reference_per_length"),
        # None: no worker log in the run's attempt (its points came from the cache), so nothing to compare
        "engine_warnings": json.loads(tags["oneknob.engine_warnings"]) if "oneknob.engine_warnings" in tags else None,
        "defaults": _prefixed(params, "defaults."),
        "transitions": _transitions(tags, metrics, polluted) if status in analysis.MEASURED else [],
        "samples": _value(params.get("samples")),
        "probes": None if metrics.get("probes") is None else int(metrics["probes"]),
        "search": {"max_probes": _value(params.get("search.max_probes")), "bisect": _value(params.get("search.bisect")),
                   "budget_hit": bool(metrics.get("search_budget_hit"))},
        "axis": axis["name"],  # what `length` and the transitions count (oneknob.plan.axis)
        "axis_detail": axis if axis["name"] != "length" else None,
        "schedule_labels": json.loads(tags.get("oneknob.schedule") or "{}"),
        "points": [{"length": L, "nll": v, "nll_ref": nll_ref.get(L), "delta_nll": delta.get(L),
                    "polluted": None if polluted.get(L) is None else bool(polluted[L]),
                    "polluted_samples": None if L not in polluted_samples else int(polluted_samples[L]),
                    **{("max_abs_delta" if k == "max_abs_delta_logprob" else k):
                       (None if L not in h else h[L] if k == "max_abs_delta_logprob" else int(h[L]))
                       for k, h in extra.items()}}
                   for L, v in nll.items()],
        "error": tags.get("oneknob.error"),
        "error_cause": json.loads(tags.get("oneknob.error_cause") or "null"),  # engine_log.root_cause
        # answers judged polluted for their shape or NaN / inf values (verdict.malformed): {"count", "lengths"}
        "malformed": json.loads(tags.get("oneknob.malformed") or "null"),
        **_setup(run.info.experiment_id, tags, params),
    }


def _setup(experiment_id: str, tags: dict, params: dict) -> dict[str, Any]:
    """What the report's header says of a run: versions, device, model, reference, tolerances, origin."""
    provenance = _prefixed(params, "provenance.")
    return {
        "experiment_id": experiment_id,
        "versions": _prefixed(params, "version."),
        "provenance": {k: provenance[k] for k in PROVENANCE if provenance.get(k) is not None},
        "hardware": _prefixed(params, "hardware."),
        "model": {"path": params.get("model"), "fingerprint": params.get("model.fingerprint")},
        "reference": {"knobs": _value(params.get("reference")), "run_id": _value(params.get("reference.run_id")),
                      "engine": params.get("reference_engine"),
                      "per_length": tags.get("oneknob.reference_per_length")},
        "verdict": _prefixed(params, "verdict."),
        "corpus": {"source": params.get("corpus.source"), "fingerprint": params.get("corpus.fingerprint")},
        "emulated": tags.get(run_tags.EMULATED) == "true" or _value(params.get("resolved.cudagraph_emulated")) is True,
        "git": {"commit": tags.get(run_tags.GIT_COMMIT), "dirty": tags.get(run_tags.GIT_DIRTY) == "true"},
        "tags": json.loads(tags.get(run_tags.USER_TAGS) or "[]"),
    }


def _transitions(tags: dict, metrics: dict, polluted: dict[int, float]) -> list[dict]:
    """A finished job's recorded transitions (with sample counts and tolerance edges); from the per-length
    verdicts when the tag is missing (an older oneknob) or was cut short (more than a tag holds)."""
    recorded = json.loads(tags.get("oneknob.transitions") or "null")
    if recorded is not None and len(recorded) == metrics.get("transitions", len(recorded)):
        return recorded
    verdicts = {L: "polluted" if v else "clean" for L, v in polluted.items()}
    return [t.as_dict() for t in search.transitions(verdicts)]


def _oracles(client, run_id: str, asked: list[str], tags: dict) -> dict[str, dict]:
    """Each oracle's verdict per length (metric polluted_<oracle>) and transitions (tag oneknob.transitions.<o>,
    else from the verdicts): every oracle is a verdict of its own."""
    found = {}
    for name in asked:
        polluted = _history(client, run_id, f"polluted_{name}")
        verdicts = {L: "polluted" if v else "clean" for L, v in polluted.items()}
        recorded = json.loads(tags.get(f"oneknob.transitions.{name}") or "null")
        found[name] = {"verdicts": {L: bool(v) for L, v in polluted.items()},
                       "transitions": recorded if recorded is not None else
                       [t.as_dict() for t in search.transitions(verdicts)]}
    return found


DECODE_METRICS = ("greedy_match", "greedy_first_divergence", "decode_delta", "decode_max_delta",
                  "decode_first_deviation", "decode_nll", "decode_nll_ref")


def _decode_points(client, run_id: str) -> dict[int, dict]:
    """The decode oracles' values per length (verdict.decode), for the report's per-length tables."""
    found: dict[int, dict] = {}
    for key in DECODE_METRICS:
        for L, value in _history(client, run_id, key).items():
            found.setdefault(L, {})[key] = value
    return found


def _search(client, experiment_ids: list[str], filter_string: str, **kwargs) -> list:
    return list(client.search_runs(experiment_ids, filter_string=filter_string, max_results=10000, **kwargs))


NO_SWEEP = "no sweep in this tracking store yet; run one (python run.py -m ...)"


def _sweep_run(client, experiment_ids: list[str], sweep_id: str | None):
    if sweep_id is None:
        found = _search(client, experiment_ids, SWEEP_FILTER, order_by=["attributes.start_time DESC"])
        if not found:
            raise CompareError(NO_SWEEP)
        return found[0]
    found = _search(client, experiment_ids, f"{SWEEP_FILTER} and tags.`oneknob.sweep_id` = '{sweep_id}'")
    if not found:
        raise CompareError(f"--sweep {sweep_id}: no sweep with this id in the tracking store; "
                           "the sweep id is printed at the start of a sweep and tagged oneknob.sweep_id")
    return found[0]


def _experiments(client, experiment_id: str | None) -> list[str]:
    """This experiment, or every one: demo (synthetic) and real sweeps live in experiments of their own."""
    if experiment_id is not None:
        return [experiment_id]
    return [e.experiment_id for e in client.search_experiments(max_results=1000)]


def collect(client, experiment_id: str | None, *, sweep_id: str | None = None,
            run_ids: list[str] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(meta, runs) of one sweep, or of the given runs, ordered by start time; experiment_id None: any."""
    for flag, ident in [("--sweep", sweep_id)] * (sweep_id is not None) + [("--runs", r) for r in run_ids or []]:
        if not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", ident):  # an id is a name: never a path or a filter
            raise CompareError(f"{flag} {ident[:80]!r}: not an id (letters, digits, '-' and '_'); the sweep id is "
                               "printed at the start of a sweep, run ids are in MLflow")
    if run_ids:
        raw = []
        for run_id in run_ids:
            try:
                raw.append(client.get_run(run_id))
            except Exception:
                raise CompareError(f"--runs {run_id}: no such run in the tracking store") from None
        parents = {r.data.tags.get("mlflow.parentRunId") for r in raw}
        parent = client.get_run(parents.pop()) if len(parents) == 1 and None not in parents else None
    else:
        parent = _sweep_run(client, _experiments(client, experiment_id), sweep_id)
        sweep_id = parent.data.tags["oneknob.sweep_id"]
        raw = _search(client, [parent.info.experiment_id],
                      f"{JOB_FILTER} and tags.`oneknob.sweep_id` = '{sweep_id}'")
        if not raw:
            raise CompareError(f"sweep {sweep_id}: its parent run exists but no job run was recorded")
    runs = sorted((load_run(client, r) for r in raw), key=lambda r: (r["start_time"], r["name"]))
    tags = parent.data.tags if parent is not None else {}
    experiment = client.get_experiment(parent.info.experiment_id if parent is not None else raw[0].info.experiment_id)
    meta = {
        "experiment": {"id": experiment.experiment_id, "name": experiment.name},
        "sweep_id": tags.get("oneknob.sweep_id") if parent is not None and not run_ids else None,
        "parent_run_id": parent.info.run_id if parent is not None else None,
        "sweep_dir": tags.get("oneknob.sweep_dir"),
        "command": tags.get("oneknob.command"),
        "run_ids": None if parent is not None and not run_ids else sorted(r["run_id"] for r in runs),
        "skipped": json.loads(tags.get("oneknob.skipped", "[]")),
        # bisect=true: the first value that differs (oneknob.study.bisect.answer), as the sweep run's tag holds it
        **({"bisect": json.loads(tags["oneknob.bisect"])} if tags.get("oneknob.bisect") and not run_ids else {}),
        # from_command=...: the reporter's flags and what dropping them did (oneknob.study.reduce.answer)
        **({"from_command": json.loads(tags["oneknob.from_command"])}
           if tags.get("oneknob.from_command") and not run_ids else {}),
        # what follow-ups the sweep ran, and why it stopped (oneknob.study.followups)
        **({"followups": json.loads(tags["oneknob.followups"])} if tags.get("oneknob.followups") and not run_ids
           else {}),
    }
    return meta, runs


def summarize_sweep(client, experiment_id: str | None, sweep_id: str, followups: dict | None) -> dict[str, Any]:
    """The analysis of a sweep's runs so far, written nowhere (the follow-ups read it between their runs)."""
    meta, runs = collect(client, experiment_id, sweep_id=sweep_id)
    return analysis.summarize(meta | {"followups": followups}, runs)


def compare(client, experiment_id: str | None, *, sweep_id: str | None = None, run_ids: list[str] | None = None,
            out: str | Path | None = None, outcomes: list[dict] | None = None,
            console: Console | None = None, shown_warnings: set[str] = frozenset()) -> dict[str, Any]:
    """Build the comparison, print it, write summary.json/report.md/plots, log them on the parent run."""
    meta, runs = collect(client, experiment_id, sweep_id=sweep_id, run_ids=run_ids)
    summary = analysis.summarize(meta, runs)
    if summary.get("from_command"):
        from oneknob.explain import from_command_text

        summary["from_command"] = from_command_text.complete(summary["from_command"], summary["runs"])
    summary["notes"] += [f"skipped: {note}" for note in meta["skipped"]]
    summary["malformed"] = malformed_summary(runs)
    if summary["malformed"]["points"]:
        summary["notes"].append(summary["malformed"]["text"])
    if outcomes:
        summary["notes"] += analysis.missing_from_tracking(outcomes, runs)
    if out is None:
        if meta["sweep_dir"] and not run_ids:
            out = meta["sweep_dir"]
        else:
            raise CompareError("--out DIR is needed: these runs are not one sweep with a directory")
    out = Path(out)
    written = report.write(summary, out)
    # at the end of a sweep (outcomes given), the notes it printed as it started are not said twice
    printed = [f"skipped: {note}" for note in meta["skipped"]] if outcomes is not None else []
    report.print_table(summary, console or make_console(stderr=False), shown_warnings, printed)
    if meta["parent_run_id"] and not run_ids:  # a hand-picked subset must not overwrite the sweep's report
        for path in written:
            client.log_artifact(meta["parent_run_id"], str(path))
        publish.describe(client, summary, summary["plots"])
    return summary


def malformed_summary(runs: list[dict]) -> dict[str, Any]:
    """How many points were malformed answers (judged polluted, not failed: oneknob.engines.answers), per run, and
    the report's line saying so."""
    by_run = {r["name"]: r["malformed"] for r in runs if r.get("malformed") and r["malformed"].get("count")}
    points = sum(m["count"] for m in by_run.values())
    said = "; ".join(f"{name}: {m['count']} at {', '.join(list(m['lengths'])[:8])}"
                     + (" ..." if len(m["lengths"]) > 8 else "") for name, m in by_run.items())
    first = next((r for m in by_run.values() for e in m["lengths"].values() for r in e["reasons"].values()), "")
    text = (f"malformed answers: {points} point(s), judged polluted by the oracles that read them ({said}); e.g. "
            f"{first[:300]}. The engine answered, wrongly in shape or with NaN / inf: a measurement, not an engine "
            "error (docs/guides/troubleshooting.md)") if points else ""
    return {"points": points, "runs": by_run, "text": text}


def after_sweep(*, sweep_id, sweep_dir, tracker, parent_run_id, outcomes, shown_warnings=frozenset()) -> dict | None:
    """Called by oneknob.study.sweep once every job has ended (parent run still open); `shown_warnings`: the keys
    of the engine warnings its jobs printed (each is printed once per sweep). The summary, or None when the
    comparison failed (said)."""
    console = make_console()

    try:
        summary = compare(tracker.client, tracker.experiment_id, sweep_id=sweep_id, out=sweep_dir,
                          outcomes=outcomes, console=make_console(stderr=False), shown_warnings=shown_warnings)
        for line in publish.where(summary, tracker.uri, _shown(Path(sweep_dir) / "report.md")):
            console.say(line, markup=False)
        return summary
    except Exception as exc:  # the measurements are safe in MLflow; the report can be rebuilt
        # a plot's write names no file: then the folder, which is what a full disk is about
        why = files.write_problem(exc, exc.filename or sweep_dir, None if exc.filename else
                                  f"the report's files in {sweep_dir}") \
            if isinstance(exc, OSError) else f"{type(exc).__name__}: {str(exc)}"
        console.print(f"[red]comparison failed[/] ({escape(why)}); rebuild it with: "
                      f"{escape(commands.compare(sweep_id, tracker.uri))}")


def _shown(path: Path) -> Path:
    """A path as a user in this directory would type it."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def _default_uri() -> str:
    uri = default_uri()
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        raise CompareError(f"no tracking store at {uri}: run a sweep from this directory first, or pass "
                           "--tracking-uri sqlite:///<path>/mlflow.db")
    return uri


def open_store(tracking_uri: str | None, experiment: str | None) -> tuple[Any, str | None]:
    """(client, experiment id or None for any) of the command line's store."""
    from mlflow.tracking import MlflowClient

    quiet_mlflow()
    uri = tracking_uri or _default_uri()
    trail.wait(uri)  # a one-job run's uploader still replaying its journal into this store
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():  # reading never creates one
        raise CompareError(f"--tracking-uri {uri}: no SQLite store there (reading never creates one); give the "
                           "mlflow.db a sweep wrote, e.g. --tracking-uri sqlite:///<dir>/mlruns/mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    if experiment is None:
        return client, None
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise CompareError(f"--experiment {experiment}: no such experiment in {uri}")
    return client, found.experiment_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oneknob compare", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--sweep", metavar="ID", help="a sweep id (default: the latest sweep)")
    which.add_argument("--runs", nargs="+", metavar="RUN_ID", help="any set of job runs")
    parser.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else ./mlruns/mlflow.db")
    parser.add_argument("--experiment", help="the MLflow experiment to look in (default: any)")
    parser.add_argument("--out", help="where summary.json, report.md and plots go (default: the sweep dir)")
    args = parser.parse_args(argv)
    err = make_console()
    try:
        client, experiment_id = open_store(args.tracking_uri, args.experiment)
        summary = compare(client, experiment_id, sweep_id=args.sweep, run_ids=args.runs, out=args.out)
    except CompareError as exc:
        err.print(f"[red]compare:[/] {exc}" + (", or name job runs with --runs" if str(exc) == NO_SWEEP else ""))
        return 2
    where = Path(args.out) if args.out else Path(summary["sweep_dir"])
    logged = summary["parent_run_id"] and not args.runs
    err.print(f"wrote {where / 'summary.json'} and {where / 'report.md'}"
              + (f"; logged on parent run {summary['parent_run_id']}" if logged else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
