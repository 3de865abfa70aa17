"""`from_command=...`: the reporter's configuration as the baseline, then which of its flags matter.

    python run.py -m from_command="vllm serve MODEL --max-num-seqs 128 ..."                   # the baseline alone
    python run.py -m from_command="..." from_command.drop=each      # one variant per flag, reset to vLLM's default
    python run.py -m from_command="..." from_command.drop=minimal   # ddmin: the smallest set that still breaks

The line is read by the build's own parser (oneknob.plan.from_command). Baseline: the composed study with every
named knob the line leaves out at the engine's default (K=0, no capture cap, max_num_seqs the engine's: the
server's for a `vllm serve` line, applied explicitly when the job runs offline) and the line's flags as knobs.
drop=each: an ordinary sweep, baseline plus one single-variable job per non-default flag, that flag's knob set
to vLLM's default (`engine_args.X=null`, `spec.k=0`, `sched.max_num_seqs=<default>`): exactly one knob differs.
drop=minimal: Zeller's ddmin over the non-default flags, each probe a job with the flags outside a subset reset;
a probe that drops one flag is that flag's drop=each job (single-variable checked, cached: a minimal run after
an each run reuses them), one that drops several is the reporter's line with those flags removed (knob=None: no
single-variable diff, as a user would run it). A subset "still breaks" when its label under
`from_command.criterion` (bisect's: verdicts | transition | polluted_at:L) equals the baseline's. The empty set
is probed first: when it breaks too, no flag is needed and the answer is [].
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from oneknob.config import knobs
from oneknob.errors import ConfigError, Refused
from oneknob.engines.base import facts
from oneknob.plan import from_command as fc
from oneknob.plan import jobs as planning
from oneknob.plan import single_variable as sv
from oneknob.plan.jobs import PlannedJob, SweepPlan
from oneknob.study import bisect

DROPS = (None, "each", "minimal")
RESET_NAMED = {"cudagraph.capture": None, "cudagraph.enforce_eager": False, "sched.max_num_seqs": None, "spec.k": 0}


@dataclass
class Reduction:
    line: fc.Line
    drop: str | None
    criterion: str
    lengths: list[int]
    base_knobs: dict[str, Any]
    cfg: Any  # the composed study every job is planned from
    overrides: tuple[str, ...]
    labels: dict[frozenset, str] = field(default_factory=dict)  # kept flags -> the criterion's label
    planned: dict[frozenset, PlannedJob] = field(default_factory=dict)
    outcomes: dict[frozenset, dict] = field(default_factory=dict)
    order: list[frozenset] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    stopped: str | None = None
    minimal: list[str] | None = None

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.line.ablated]

    @property
    def bound(self) -> int:
        """Jobs for n flags when one or two of them matter: the baseline, the empty set and ddmin's probes, at
        most 2 + n (ceil(log2 n) + 1) (tests/plan/test_from_command.py checks every single and pair up to 12)."""
        n = len(self.names)
        return 2 + n * (math.ceil(math.log2(n)) + 1) if n else 1


def asked(config) -> bool:
    """from_command=... given (an empty one too: refused by plan), or from_command.drop without a line (refused)."""
    return any(OmegaConf.select(config, f"from_command.{key}", default=None) is not None for key in ("line", "drop"))


def _flag_knob(reduction: Reduction, name: str) -> tuple[str, Any]:
    flag = next(f for f in reduction.line.flags if f.name == name)
    return flag.knob, flag.reset


def _plan_kept(reduction: Reduction, kept: frozenset) -> PlannedJob:
    if kept in reduction.planned:
        return reduction.planned[kept]
    dropped = [n for n in reduction.names if n not in kept]
    requested = dict(reduction.base_knobs)
    for name in dropped:
        key, reset = _flag_knob(reduction, name)
        requested[key] = reset
    knob = _flag_knob(reduction, dropped[0])[0] if len(dropped) == 1 else None
    name = None if len(dropped) <= 1 else f"keep {', '.join(n for n in reduction.names if n in kept) or 'no flag'}"
    job = PlannedJob(planning.plan_job(reduction.cfg, requested, knob=knob, name=name), reduction.overrides)
    reduction.planned[kept] = job
    return job


def plan(config, arguments: list[str], compose) -> SweepPlan:
    """The reporter's baseline (and drop=each's variants) planned and checked; refusals name key, value, fix."""
    arguments = sv.force_add_families(arguments)
    shape = sv.sweep_shape(arguments)
    if shape.knob or shape.other:
        raise ConfigError(f"from_command with {shape.knob or ', '.join(shape.other)} varied: the reporter's flags are "
                          "the variants; give every other key one value")
    if bool(OmegaConf.select(config, "bisect.enabled", default=False)):
        raise ConfigError("from_command with bisect=true: from_command.drop=minimal is the search over the line's "
                          "flags; drop bisect=true")
    fixed = [a for a in arguments if not a.lstrip("+~").startswith(("hydra/sweeper", "from_command"))]
    given = {o.key_or_group for o in sv.parse(fixed)}
    study = compose(fixed)
    drop = config.from_command.drop
    if drop not in DROPS:
        raise ConfigError(f"from_command.drop={drop}: give each (one variant per flag, reset to vLLM's default), "
                          "minimal (the smallest set of flags that still gives the baseline's result) or null")
    engine = facts(study.engine.name)
    build_knobs = {k: v for k, v in knobs.from_config(study).items() if k.startswith("vllm.")}
    python, env = engine.interpreter(build_knobs, str(Path(study.paths.builds).resolve()), print)
    from oneknob.engines.vllm import validate as vllm_validate

    runner = fc.script_runner(str(Path(study.paths.cache).resolve()),
                              vllm_validate.build_key(python, engine.versions(build_knobs)))
    line = fc.parse(fc.read(config.from_command.line), python, env, runner)
    options = {k: OmegaConf.select(study, f"engine.{k}") for k in engine.options
               if OmegaConf.select(study, f"engine.{k}") is not None}
    offline = study.engine.name == "vllm" and line.kind == "serve"
    defaults = (facts("vllm_server") if offline else engine).defaults(options)
    fc.assign(line, defaults)
    line_knobs = line.knobs
    clash = sorted(k for k in line_knobs if k in given)
    if clash:
        raise ConfigError(f"{clash[0]} is set both on the command line and by the reporter's line; drop it from the "
                          "command line (the line's value is the baseline's)")
    overrides = [o for o in line.overrides if o.split("=")[0] not in given]
    overrides += _model_override(line, study, given)
    with from_line(line):
        return _plan_line(config, line, fixed, given, overrides, compose, defaults, offline, drop)


def origins(line: fc.Line) -> dict[str, str]:
    """{key oneknob sets: the line's flag that set it}: a refusal naming the key says where the user wrote it."""
    found = {}
    for flag in line.flags:
        written = flag.option if flag.option.endswith("=") else f"{flag.option} "
        written += fc.json_text(flag.value) if isinstance(flag.value, (dict, list)) else str(flag.value)
        if flag.status == "setting" and flag.name in fc.SETTINGS:
            found[fc.SETTINGS[flag.name]] = written
        elif flag.knob:
            found[flag.knob] = written
    return found


@contextlib.contextmanager
def from_line(line: fc.Line | None):
    """A refusal that names a key the from_command line set (model.max_model_len from --max-model-len 100) says
    so: the user typed the flag, not the key."""
    try:
        yield
    except Refused as exc:
        said = str(exc)
        hits = [(key, written) for key, written in (origins(line) if line is not None else {}).items()
                if re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", said)]
        if not hits:
            raise
        where = "; ".join(f"{key} came from the from_command line's {written}" for key, written in hits)
        text = (f"{said} ({where}: change it in the line, or drop the flag from the line and give the key on the "
                "command line)")
        try:
            again = type(exc)(text)
        except TypeError:  # a refusal of another shape: its message is what matters
            again = ConfigError(text)
        raise again from None


def _plan_line(config, line: fc.Line, fixed: list[str], given: set[str], overrides: list[str], compose,
               defaults: dict, offline: bool, drop) -> SweepPlan:
    line_knobs = line.knobs
    cfg = compose([*fixed, *overrides])
    criterion = bisect.check_criterion(config.from_command.criterion, list(cfg.lengths))
    base = knobs.from_config(cfg) | {k: v for k, v in RESET_NAMED.items() if k not in given} | line_knobs
    if offline:  # `vllm serve` leaves these at the server's defaults, which LLM(...) does not share
        server = {"sched.max_num_seqs": defaults["default_max_num_seqs"],
                  "engine_args.max_num_batched_tokens": defaults["max_num_batched_tokens"]}
        applied = {k: v for k, v in server.items() if base.get(k) is None and k not in given}
        base |= applied
        if applied:
            line.notes.append("run offline (engine=vllm) with the server's defaults the line leaves out: "
                              + ", ".join(f"{k}={v}" for k, v in applied.items()) + " (engine=vllm_server runs it "
                              "through vllm serve)")
    reduction = Reduction(line, drop, criterion, list(cfg.lengths), base, cfg, tuple([*fixed, *overrides]))
    jobs = [_plan_kept(reduction, frozenset(reduction.names))]
    if drop == "each":
        jobs += [_plan_kept(reduction, frozenset(reduction.names) - {name}) for name in reduction.names]
    elif drop == "minimal" and reduction.names:
        jobs.append(_plan_kept(reduction, frozenset()))
    return SweepPlan(jobs, "from_command", Path(config.hydra.sweep.dir).resolve(), bool(config.dry_run),
                     reduction=reduction)


def _model_override(line: fc.Line, study, given: set[str]) -> list[str]:
    if "model.path" in given or "model" in given:
        line.notes.append(f"the line's model {line.model} replaced by the command line's model")
        return []
    path = Path(line.model).expanduser()
    if not path.is_dir():
        raise ConfigError(f"from_command: the line's model {line.model!r} is not a checkpoint directory here "
                          "(oneknob loads no hub model for this); set model.path=<a local copy> or "
                          "model=<a preset in conf/model/>, which then replaces it")
    if path.resolve() == Path(study.model.path).resolve():
        return []
    return [f"model.path={planning.override_value(str(path.resolve()))}", "model.build=null"]


def describe_plan(reduction: Reduction) -> list[str]:
    flags = ", ".join(reduction.names) or "none"
    return [f"from_command: {len(reduction.names)} flag(s) to reduce ({flags}); drop={reduction.drop}"]


def _label(reduction: Reduction, kept: frozenset, outcome: dict) -> str:
    if outcome.get("status") == "noop":  # resolved exactly as the baseline: its outcome, said
        return reduction.labels.get(frozenset(reduction.names), "")
    return bisect.label(reduction.criterion, outcome, reduction.lengths)


def record(reduction: Reduction, jobs: list[PlannedJob], outcomes: list[dict]) -> None:
    """drop=each / the baseline alone: each launched job's label, by the flags it kept."""
    by_id = {id(job): kept for kept, job in reduction.planned.items()}
    for job, outcome in zip(jobs, outcomes):
        kept = by_id[id(job)]
        reduction.outcomes[kept], reduction.order = outcome, [*reduction.order, kept]
        if outcome.get("status") in ("ok", "confounded", "noop"):
            reduction.labels[kept] = _label(reduction, kept, outcome)


def drive(sweep: SweepPlan, launch_one, provision, outcome_of, log) -> list:
    """drop=minimal: the baseline, the empty set, then ddmin's probes, one job at a time; Hydra's returns in
    launch order, with sweep.jobs in the same order."""
    reduction: Reduction = sweep.reduction
    returns: list = []
    sweep.jobs[:] = []
    everything = frozenset(reduction.names)

    def breaks(kept: frozenset) -> bool | None:
        if kept not in reduction.labels:
            if reduction.stopped:
                return None
            keeping = ", ".join(n for n in reduction.names if n in kept) or "no flag"
            try:
                job = _plan_kept(reduction, kept)
                if len(returns) > 1:
                    provision([job.plan])  # the baseline and the empty set were provisioned with the sweep
            except Refused as exc:
                reduction.stopped = f"the probe keeping {keeping} could not be planned: {exc}"
                return None
            ret = launch_one(job, len(returns))
            sweep.jobs.append(job)
            returns.append(ret)
            outcome = outcome_of(job, ret)
            reduction.outcomes[kept], reduction.order = outcome, [*reduction.order, kept]
            if outcome.get("status") not in ("ok", "confounded", "noop"):
                reduction.stopped = (f"the probe keeping {keeping} ended {outcome.get('status')}: "
                                     f"{outcome.get('error', '')}").rstrip(": ")
                return None
            reduction.labels[kept] = _label(reduction, kept, outcome)
            said = "every flag (the baseline)" if kept == everything else keeping
            log(f"from_command keeping {said}: {reduction.labels[kept]}")
        return reduction.labels[kept] == reduction.labels[frozenset(reduction.names)]

    if breaks(everything) is None:
        return returns
    if not reduction.names or breaks(frozenset()):
        reduction.minimal = [] if not reduction.stopped else None
        return returns
    found = ddmin(reduction.names, lambda subset: breaks(frozenset(subset)))
    reduction.minimal = None if reduction.stopped else found
    return returns


def ddmin(items: list[str], breaks) -> list[str]:
    """Zeller's ddmin: a 1-minimal subset of `items` for which breaks(subset) holds (breaks(items) does, breaks([])
    does not). `breaks` returns None to stop (the answer is then the smallest subset found so far)."""
    current, n = list(items), 2
    while len(current) >= 2:
        size = math.ceil(len(current) / n)
        chunks = [current[i:i + size] for i in range(0, len(current), size)]
        reduced = False
        for chunk in chunks:
            verdict = breaks(chunk)
            if verdict is None:
                return current
            if verdict:
                current, n, reduced = chunk, 2, True
                break
        if not reduced and len(chunks) > 2:
            for chunk in chunks:
                rest = [x for x in current if x not in chunk]
                verdict = breaks(rest)
                if verdict is None:
                    return current
                if verdict:
                    current, n, reduced = rest, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    return current


def answer(sweep: SweepPlan) -> dict:
    """summary.json's `from_command` (also the sweep run's tag oneknob.from_command); `each` (what resetting each
    flag did, versus_baseline's relation) is added by the comparison from the runs themselves."""
    reduction: Reduction = sweep.reduction
    line, everything = reduction.line, frozenset(reduction.names)
    counted = bisect.starts(sweep.baseline.cache_dir, reduction.started)
    kept_text = lambda kept: [n for n in reduction.names if n in kept]  # noqa: E731
    minimal = reduction.minimal
    flags = {f.name: f for f in line.flags}
    found = {**line.as_dict(), "drop": reduction.drop, "criterion": reduction.criterion, "lengths": reduction.lengths,
             "baseline": reduction.labels.get(everything), "ablated": reduction.names,
             "runs": {name: reduction.outcomes.get(everything - {name}, {}).get("run_id") for name in reduction.names},
             "each": {}, "minimal": minimal,
             "minimal_line": fc.serve_line(line.model, [flags[n] for n in minimal]) if minimal is not None else None,
             "probes": [{"kept": kept_text(kept), "outcome": reduction.labels.get(kept),
                         "status": reduction.outcomes.get(kept, {}).get("status"),
                         "run_id": reduction.outcomes.get(kept, {}).get("run_id")} for kept in reduction.order],
             "jobs": len(reduction.order), "engine_starts": counted.get("job", 0),
             "reference_starts": counted.get("reference", 0), "stopped": reduction.stopped}
    if reduction.drop == "minimal":
        found["bound"] = reduction.bound
    return found
