"""After a knob sweep's configured jobs: the follow-up runs that settle what each boundary tracks.

    python run.py -m cudagraph.enforce_eager=false,true engine=synthetic        # explain.followups=3 (default)
    follow-up 1/3: cudagraph.capture=384 relative to the baseline: does 512|513 (baseline) track the resolved max
    capture size?

Each round reads the sweep's runs back from MLflow (explain.compare.summarize_sweep: the same analysis the report
uses) and asks explain.tested.next_test for the first candidate quantity of an unexplained transition that one
knob can move alone; runs already in the sweep that moved a quantity are evidence first, so a sweep whose own runs
separate the candidates runs none. A follow-up is an ordinary job (cached, resumable, under the sweep's parent
run, single-variable checked against the run whose edge it tests: its `against` file), with one knob more than
that run, and probes the predicted edge and the old one before any other length (study.job). It stops when
nothing is left to test or the budget (explain.followups) is spent; what it ran goes on the parent run
(oneknob.followups) so the report says why the rest is untested.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from omegaconf import OmegaConf

from oneknob.errors import ConfigError, Refused
from oneknob.plan import jobs as planning
from oneknob.plan import single_variable as sv
from oneknob.plan.jobs import PlannedJob, SweepContext, SweepPlan
from oneknob.record import store

DEFAULT_BUDGET = 3


def budget(config) -> int:
    """explain.followups, checked: a count of follow-up runs per sweep (0: the suggestion only)."""
    value = OmegaConf.select(config, "explain.followups", default=DEFAULT_BUDGET)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"explain.followups={value}: the number of follow-up runs a sweep may start to test what "
                          f"its boundaries track, an integer >= 0 (default {DEFAULT_BUDGET}; 0: none, the next "
                          "experiment is only suggested)")
    return value


def skipped(sweep: SweepPlan) -> str | None:
    """Why a sweep runs no follow-ups whatever its budget, or None."""
    if sweep.bisection is not None:
        return "a bisect=true sweep runs no follow-ups (run the knob sweep itself to test its edges)"
    if sweep.reduction is not None:
        return "a from_command sweep runs no follow-ups (rerun its minimal line as a knob sweep to test its edges)"
    if sweep.baseline.axis.name != "length":
        return f"axis={sweep.baseline.axis.name}: follow-ups test prompt-length edges only"
    return None


def none_run(sweep: SweepPlan, allowed: int) -> dict:
    """The record (the parent run's tag) of a sweep that runs no follow-ups, saying why."""
    return {"budget": allowed, "ran": [], "refused": [], "skipped": skipped(sweep)}


def name_of(test: dict) -> str:
    """The follow-up's one name (MLflow run, report row, terminal): what it changed, relative to which run."""
    change = planning.run_label(test["knob"], test["value"])
    return f"follow-up {change}" if test["run"] == "baseline" else f"follow-up {test['run']} + {change}"


def _plan(sweep: SweepPlan, test: dict, compose, index: int, outcome: dict, transitions: list[dict]) -> PlannedJob:
    """The follow-up as a job: the tested run's overrides (that knob replaced) plus the one knob more."""
    base = next(job for job in sweep.jobs if job.plan.name == test["run"])
    change = sv.force_add_families([f"{test['knob']}={planning.override_value(test['value'])}"])
    key = sv.parse(change)[0].key_or_group
    kept = [o for o, parsed in zip(base.overrides, sv.parse(list(base.overrides))) if parsed.key_or_group != key]
    overrides = (*kept, *change)
    requested = dict(base.plan.knobs) | {test["knob"]: test["value"]}
    cfg = compose(list(overrides))
    against = Path(sweep.dir) / "followups" / f"{index}.against.json"
    against.parent.mkdir(parents=True, exist_ok=True)
    store.write_json_atomic(against, {"knobs": outcome.get("requested") or base.plan.knobs,
                                      "resolved": outcome.get("resolved") or {}, "transitions": transitions})
    followup = {k: test[k] for k in ("run", "transition", "oracle", "direction", "quantity", "label", "relation",
                                      "offset", "edge", "predicted", "knob", "value")}
    plan = replace(planning.plan_job(cfg, requested, knob=test["knob"]), name=name_of(test), followup=followup,
                   sweep=SweepContext("", "", str(sweep.dir), index, against=str(against)))
    return PlannedJob(plan, overrides)


def _transitions(run: dict) -> list[dict]:
    """Every oracle's edges of a summarised run (what the follow-up probes beside its grid, as a variant probes
    the baseline's)."""
    edges = {(t["lo"], t["hi"]): t for t in run.get("transitions") or []}
    for record in (run.get("oracles") or {}).values():
        edges |= {(t["lo"], t["hi"]): t for t in record.get("transitions") or []}
    return list(edges.values())


def drive(sweep: SweepPlan, allowed: int, summarize, launch_one, compose, provision, outcome_of, log,
          outcomes: dict[str, dict]) -> tuple[list[PlannedJob], list, dict]:
    """Run follow-ups until nothing is left to test or `allowed` have run. `summarize(followups)` is the sweep's
    analysis now (explain.compare.summarize_sweep); `outcomes` the configured jobs' outcomes by name. Returns the
    follow-up jobs, Hydra's returns in the same order, and the record of what ran (the parent run's tag)."""
    from oneknob.explain.tested import next_test, the

    failed = [name for name, outcome in outcomes.items() if outcome.get("status") in ("failed", "killed")]
    record = none_run(sweep, allowed) | {"skipped": skipped(sweep) or (
        f"{', '.join(failed)} failed: follow-ups run once every configured job has measured (the retry command "
        "runs them)" if failed else None)}
    jobs, returns, refused = [], [], []
    while not record["skipped"] and len(jobs) < allowed:
        summary = summarize(record)
        test = next_test(summary["runs"], refused)
        if test is None:
            break
        run = next(r for r in summary["runs"] if r["name"] == test["run"])
        index = len(sweep.jobs) + len(jobs)
        try:
            job = _plan(sweep, test, compose, index, outcomes.get(test["run"]) or {}, _transitions(run))
            provision([job.plan])
        except Refused as exc:  # the engine refused the trial value: a note, and the next candidate
            refused.append(test["requested"] | {test["knob"]: test["value"]})
            record["refused"].append({"test": name_of(test), "why": str(exc).splitlines()[0]})
            log(f"follow-up {name_of(test)} not run: {str(exc).splitlines()[0]}")
            continue
        offset = f" + {test['offset']}" if test["offset"] > 0 else f" - {-test['offset']}" if test["offset"] else ""
        relative = "the baseline" if test["run"] == "baseline" else test["run"]
        log(f"follow-up {len(jobs) + 1}/{allowed}: {planning.run_label(test['knob'], test['value'])} relative to "
            f"{relative}: does {test['transition']} track {the(test['quantity'])}{offset}? (it predicts "
            f"{test['predicted'][0]}|{test['predicted'][1]})")
        ret = launch_one(job, index)
        jobs.append(job)
        returns.append(ret)
        outcome = outcome_of(job, ret)
        record["ran"].append({"name": job.plan.name, "tests": {k: test[k] for k in (
            "run", "transition", "oracle", "quantity", "offset", "predicted")}, "status": outcome.get("status")})
        if outcome.get("status") in ("failed", "killed"):
            break  # the engine failed: the rest would likely fail the same way; the exit code says it
    return jobs, returns, record


def tag(record: dict) -> dict[str, str]:
    return {"oneknob.followups": json.dumps(record)}
