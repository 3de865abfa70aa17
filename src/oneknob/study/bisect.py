"""`bisect=true`: a one-knob multirun's values as an ordered axis, searched instead of swept.

    python run.py -m 'sched.max_num_seqs=range(1,257)' bisect=true lengths=[256]
    python run.py -m vllm.version=0.31.0,0.32.0 bisect=true
    python run.py -m vllm.commit=A..B vllm.source=PATH bisect=true

Positions 0..N-1 index the knob's values in the order given (a range ascending; vllm.commit=A..B: A, then
`git rev-list --first-parent A..B` oldest first). The search is oneknob.verdict.search on the grid [0, N-1]
with outcomes the criterion's label of each job (the polluted lengths among the given ones, a transition, or
the verdict at one length), bisecting only the first change: the two ends, then the middle of the first pair
of measured neighbours that differ, until they are adjacent. Every probe is an ordinary job (the first end is
the baseline; cached, resumable, under the sweep's parent run, single-variable checked), planned, provisioned
and checked by the engine only when the search asks for it: a 256-value range plans two jobs up front, and a
commit range builds no environment for a commit never visited (vLLM's own config check runs per launched job).
N values take at most ceil(log2 N) + 2 job engine starts; the reference, measured once, is counted apart.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from oneknob.config import knobs
from oneknob.explain.bisect_text import sentences  # noqa: F401 (the answer in words, for the sweep)
from oneknob.errors import ConfigError, Refused
from oneknob.plan import jobs as planning
from oneknob.plan import single_variable as sv
from oneknob.plan.jobs import PlannedJob, SweepPlan
from oneknob.verdict import search

CRITERIA = "verdicts | transition | polluted_at:<length>"
KIND = {"vllm.commit": "commit", "vllm.version": "release"}  # what lies between two values, for the report


@dataclass
class Bisection:
    knob: str
    texts: Sequence[str]  # each value as an override value, in order (a range: sv.RangeValues, lazily)
    fixed: list[str]  # the other overrides
    criterion: str
    lengths: list[int]
    base_knobs: dict[str, Any]
    source: str | None = None  # vllm.source, for vllm.commit
    labels: dict[int, str] = field(default_factory=dict)  # position -> the criterion's outcome
    planned: dict[int, PlannedJob] = field(default_factory=dict)
    outcomes: dict[int, dict] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # positions in launch order
    started: float = field(default_factory=time.time)
    stopped: str | None = None  # why the search ended early

    @property
    def size(self) -> int:
        return len(self.texts)

    @property
    def bound(self) -> int:
        return math.ceil(math.log2(self.size)) + 2


def asked(config) -> bool:
    return bool(OmegaConf.select(config, "bisect.enabled", default=False))


def check_criterion(criterion: str, lengths: list[int]) -> str:
    text = str(criterion).strip()
    if text in ("verdicts", "transition"):
        return text
    if text.startswith("polluted_at:"):
        at = text.split(":", 1)[1]
        if not at.isdigit() or int(at) not in lengths:
            raise ConfigError(f"bisect.criterion={criterion}: polluted_at needs one of the study's lengths "
                              f"({', '.join(map(str, lengths))}); write bisect.criterion=polluted_at:{lengths[-1]} "
                              f"or add the length to lengths=")
        return f"polluted_at:{int(at)}"
    raise ConfigError(f"bisect.criterion={criterion}: unknown; give one of {CRITERIA} (default verdicts: the set "
                      "of polluted lengths)")


def label(criterion: str, outcome: dict, lengths: list[int]) -> str:
    """The criterion's value for one measured job, compared by equality along the axis."""
    verdicts = outcome.get("verdicts") or {}
    if criterion == "transition":
        found = [f"{search.Transition.from_dict(t).text} {t['direction']}" for t in outcome.get("transitions", [])]
        return "; ".join(found) or "no transition"
    if criterion.startswith("polluted_at:"):
        return verdicts.get(criterion.split(":")[1], "unmeasured")
    polluted = [L for L in lengths if verdicts.get(str(L)) == search.POLLUTED]
    return f"polluted at {','.join(map(str, polluted))}" if polluted else "clean at every length"


def _refuse_shape(arguments: list[str]) -> None:
    if any(a.split("=")[0].lstrip("+~") == "hydra/sweeper" and "oneknob" not in a and "ablation" not in a
           for a in arguments):
        raise ConfigError("bisect=true: only oneknob's sweeper searches an axis; drop hydra/sweeper")


def plan(config, arguments: list[str], compose) -> SweepPlan:
    """The two ends planned and checked; the axis kept for `drive`. Refusals name key, value and fix."""
    _refuse_shape(arguments)
    arguments = sv.force_add_families(arguments)
    parsed = sv.parse(arguments)
    commit_range = next((o for o in parsed if o.key_or_group == "vllm.commit" and not o.is_sweep_override()
                         and isinstance(o.value(), str) and ".." in o.value()), None)
    rest = [a for a, o in zip(arguments, parsed) if o is not commit_range]
    shape = sv.sweep_shape(rest)
    if shape.other:
        raise ConfigError(f"bisect=true with {', '.join(shape.other)} varied: bisect searches one knob's values; "
                          "vary one knob (python run.py -m 'sched.max_num_seqs=range(1,257)' bisect=true)")
    if commit_range is not None and shape.knob:
        raise ConfigError(f"bisect=true varies vllm.commit={commit_range.value()} and {shape.knob}: bisect searches "
                          f"one knob; give {shape.knob} one value")
    if commit_range is None and not shape.knob:
        raise ConfigError("bisect=true: no knob has several values to search; give one, e.g. "
                          "-m 'sched.max_num_seqs=range(1,257)' bisect=true, -m vllm.version=0.31.0,0.32.0 "
                          "bisect=true, or -m vllm.commit=A..B vllm.source=PATH bisect=true")
    swept = "vllm.commit" if commit_range is not None else shape.knob
    fixed = [a for a, o in zip(rest, sv.parse(rest)) if o.key_or_group != swept
             and not a.lstrip("+~").startswith("hydra/sweeper")]
    base_cfg = compose(fixed)
    lengths = list(base_cfg.lengths)
    criterion = check_criterion(base_cfg.bisect.criterion, lengths)
    source = None
    if swept == "vllm.commit":  # A..B, or a list of commits: full hashes, in the order given
        from oneknob.provision import commits

        source = commits.check_source(base_cfg.vllm.source)
        texts = commits.commit_range(source, commit_range.value()) if commit_range is not None else list(
            dict.fromkeys(commits.full_hash(source, text) for text in shape.values))
        for commit in texts:  # git only: refuses a commit the overlay cannot carry before anything starts
            commits.check(source, commit, build_from_source=bool(base_cfg.vllm.build_from_source))
    elif isinstance(shape.values, sv.RangeValues):  # distinct by construction; computed when the search asks
        texts = shape.values
    else:
        texts = list(dict.fromkeys(shape.values))
    if len(texts) < 2:
        raise ConfigError(f"bisect=true: {swept} has {len(texts)} distinct value(s); a search needs two ends")
    axis = Bisection(swept, texts, fixed, criterion, lengths, knobs.from_config(base_cfg), source)
    notes = [f"{len(shape.values) - len(texts)} repeated value(s) of {swept} dropped"] \
        if commit_range is None and len(texts) < len(shape.values) else []
    for position in (0, axis.size - 1):
        _plan_at(axis, position, compose)
    jobs = [axis.planned[0], axis.planned[axis.size - 1]]
    return SweepPlan(jobs, swept, Path(config.hydra.sweep.dir).resolve(), bool(config.dry_run), notes,
                     bisection=axis)


def _plan_at(axis: Bisection, position: int, compose) -> PlannedJob:
    if position in axis.planned:
        return axis.planned[position]
    text = axis.texts[position]
    overrides = (*axis.fixed, *sv.force_add_families([f"{axis.knob}={text}"]))
    cfg = compose(list(overrides))
    value = knobs.from_config(cfg)[axis.knob]
    if position == 0:
        axis.base_knobs = axis.base_knobs | {axis.knob: value}
    requested = axis.base_knobs | {axis.knob: value}
    job = PlannedJob(planning.plan_job(cfg, requested, knob=None if position == 0 else axis.knob), overrides)
    axis.planned[position] = job
    return job


def describe_plan(axis: Bisection) -> list[str]:
    """The dry run's lines: what would be searched, and at what cost."""
    return [f"bisect {axis.knob} over {axis.size} values ({axis.texts[0]} .. {axis.texts[-1]}), criterion "
            f"{axis.criterion} at lengths {axis.lengths}: the two ends, then at most {axis.bound - 2} halvings "
            f"(<= {axis.bound} engine starts, the reference apart); the jobs between are planned when the search "
            "asks for them" + (f"; no {KIND.get(axis.knob, 'value')} between them" if axis.size == 2 else "")]


def drive(sweep: SweepPlan, launch_one, compose, provision, outcome_of, log, launch_all=None) -> list:
    """Launch what the search wants until two adjacent values differ (or the ends agree); returns Hydra's
    returns in launch order, with sweep.jobs in the same order. `launch_all([(job, index), ...])`: a round's
    probes side by side (the two ends), Hydra's returns in order; else one at a time."""
    axis: Bisection = sweep.bisection
    returns, sweep.jobs[:] = [], []
    grid = [0, axis.size - 1]
    while todo := search.wanted(grid, axis.labels, first_only=True):
        planned = []
        for position in todo:
            try:
                job = _plan_at(axis, position, compose)
                if position not in (0, axis.size - 1):
                    provision([job.plan])  # the ends were provisioned with the sweep
            except Refused as exc:
                axis.stopped = f"{axis.knob}={axis.texts[position]} could not be planned: {exc}"
                break
            planned.append((position, job))
        items = [(job, len(returns) + n) for n, (_, job) in enumerate(planned)]
        rets = launch_all(items) if launch_all is not None and len(items) > 1 else \
            [launch_one(job, index) for job, index in items]
        sweep.jobs.extend(job for _, job in planned)  # every one launched is the sweep's, whatever the first says
        returns.extend(rets)
        for (position, job), ret in zip(planned, rets):
            outcome = outcome_of(job, ret)
            axis.outcomes[position], axis.order = outcome, [*axis.order, position]
            if outcome.get("status") in ("noop",):  # resolved exactly as the first end: its outcome, said
                axis.labels[position] = axis.labels.get(0, "")
            elif outcome.get("status") not in ("ok", "confounded"):
                axis.stopped = f"the probe {axis.knob}={axis.texts[position]} ended {outcome.get('status')}: " \
                               f"{outcome.get('error', '')}".rstrip(": ")
                return returns
            else:
                axis.labels[position] = label(axis.criterion, outcome, axis.lengths)
            log(f"bisect {axis.knob}={_short(axis, position)}: {axis.labels[position]}")
        if axis.stopped:
            return returns
    return returns


def _short(axis: Bisection, position: int) -> str:
    text = axis.texts[position]
    return text[:12] if axis.knob == "vllm.commit" else text


def _value(axis: Bisection, position: int) -> Any:
    job = axis.planned.get(position)
    return job.plan.knobs[axis.knob] if job else axis.texts[position]


def _evidence(axis: Bisection, position: int) -> dict:
    outcome = axis.outcomes.get(position, {})
    resolved = {k: v for k, v in (outcome.get("resolved") or {}).items() if k != "vllm"}
    return {"value": _value(axis, position), "outcome": axis.labels.get(position), "status": outcome.get("status"),
            "run_id": outcome.get("run_id"), "transitions": outcome.get("transitions", []),
            "verdicts": outcome.get("verdicts", {}), "describe": outcome.get("describe"), "resolved": resolved}


def starts(cache_dir: str, since: float) -> dict[str, int]:
    """Engine starts since the sweep began, by role, from workers.jsonl (the ground truth)."""
    path, found = Path(cache_dir) / "workers.jsonl", {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "start" and record.get("time", 0) >= since:
                found[record.get("role", "job")] = found.get(record.get("role", "job"), 0) + 1
    return found


def answer(sweep: SweepPlan) -> dict:
    """summary.json's `bisect` (also the sweep run's tag oneknob.bisect): the first value that differs from the
    first end, with both neighbours' evidence and the cost."""
    axis: Bisection = sweep.bisection
    changes = search.transitions(axis.labels)
    first = changes[0] if changes else None
    counted = starts(axis.planned[0].plan.cache_dir, axis.started)
    found = {"knob": axis.knob, "criterion": axis.criterion, "lengths": axis.lengths, "candidates": axis.size,
             "first_end": _value(axis, 0), "last_end": _value(axis, axis.size - 1),
             "last_same": None, "first_different": None, "resolved": False,
             "jobs": len(axis.order), "engine_starts": counted.get("job", 0),
             "reference_starts": counted.get("reference", 0), "bound": axis.bound,
             "probes": [{"value": _value(axis, p), "outcome": axis.labels.get(p)} for p in axis.order],
             "stopped": axis.stopped}
    if first is not None:
        found |= {"last_same": _value(axis, first.lo), "first_different": _value(axis, first.hi),
                  "resolved": first.resolved, "between": first.hi - first.lo - 1,
                  "evidence": {"last_same": _evidence(axis, first.lo), "first_different": _evidence(axis, first.hi)}}
    elif 0 in axis.labels and axis.size - 1 in axis.labels:
        found |= {"evidence": {"first_end": _evidence(axis, 0), "last_end": _evidence(axis, axis.size - 1)}}
    if axis.knob == "vllm.commit" and first is not None and first.resolved:
        from oneknob.provision import commits

        found["commit"] = commits.info(axis.source, axis.texts[first.hi])
    if axis.size == 2:
        found["note"] = f"no {KIND.get(axis.knob, 'value')} between them"
    return found
