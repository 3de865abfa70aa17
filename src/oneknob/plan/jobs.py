"""From the composed config to checked plans: the only reader of the config.

`plan_job(cfg)` checks everything a user can get wrong before any engine starts
(knob values, lengths, samples, tolerances, model, corpus, tracking store; the
engine's own pre-flight) and returns a `JobPlan` that carries the whole job.
`plan_sweep(...)` turns a multirun into a baseline plus variants: a command-line
list of one knob's values, or the `ablation:` block, are two ways to write the
same plan. Plans are plain data: the sweep writes each job's plan to a file,
and the job process runs from that file without reading its config again.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from oneknob.plan import checks
from oneknob.plan.axis import Axis
from oneknob.plan import axis as axis_mod
from oneknob.config import knobs, model_override, quantities, resolution
from oneknob.provision import provenance, tiny_model
from oneknob.plan import single_variable as sv
from oneknob.plan.checks import TIMEOUTS
from oneknob.config.schema import SearchConfig, SingleVariableConfig, VerdictConfig
from oneknob.provision.corpus import Corpus, load_corpus
from oneknob.engines.base import facts
from oneknob.errors import ConfigError, UnavailableHere
from oneknob.config.tracking import user_tags
from oneknob.config.tracking import resolve_uri

INJECTED_FAULTS = ("crash_at_length", "hang_at_length", "crash_on_start", "delay_s")  # engine.fault.*


def run_label(knob: str | None, value: Any) -> str:
    """The one name of a job everywhere (MLflow run, report row, console): baseline or knob=value."""
    return "baseline" if knob is None else f"{knob}={json.dumps(value)}"


@dataclass(frozen=True)
class SweepContext:
    id: str
    parent_run_id: str
    dir: str
    index: int
    # a follow-up is diffed against the run whose edge it tests, not the sweep's baseline: that run's
    # {knobs, resolved, transitions}, written by the sweep
    against: str | None = None

    @property
    def baseline_path(self) -> Path:
        return Path(self.against) if self.against else Path(self.dir) / "baseline.json"

    @property
    def publishes_baseline(self) -> bool:
        """The sweep's baseline job: it writes baseline.json, the variants read it."""
        return self.index == 0 and self.against is None


@dataclass(frozen=True)
class JobPlan:
    name: str  # run label
    knob: str | None  # the varied knob; None for a baseline or a single run
    knobs: dict[str, Any]  # requested knob values, by key
    worker: dict[str, Any]  # the worker spec: engine, knobs, settings, model, options, seed
    defaults: dict[str, Any]  # the engine's defaults where a knob is null (engines.base.Facts.defaults)
    platform: str
    corpus: Corpus
    lengths: tuple[int, ...]
    samples: int
    verdict: VerdictConfig
    search: SearchConfig
    single_variable: SingleVariableConfig
    reference_knobs: dict[str, Any] | None  # None = absolute mode
    reference_engine: str  # vllm, or transformers (the same checkpoint outside vLLM)
    reference_dtype: str | None
    oracles: tuple[str, ...]  # what is compared with the reference per length (oracles.py)
    timeouts: dict[str, float]
    cache_dir: str
    use_cache: bool
    tracking_uri: str
    experiment: str
    versions: dict[str, Any]  # of the engine build these knobs run on
    hardware: dict[str, str]
    model_fingerprint: str
    predicted: dict[str, Any]  # the resolved config the rules predict (dry runs, plan.json)
    tags: dict[str, str] = field(default_factory=dict)  # the user's tags (config `tags`), on every run
    # auto | true | false: measure the reference per length when it is not prefix-consistent (study/reference.py)
    reference_per_length: str = "auto"
    # the model's config.json length fields, {"model.<path>": value} (config.quantities.model_quantities)
    model_quantities: dict[str, int] = field(default_factory=dict)
    sweep: SweepContext | None = None
    # what the search moves along (oneknob.plan.axis); for batch/repeat `lengths` is the probe's length alone
    axis: Axis = field(default_factory=Axis)
    # tracking.trail: a one-job run on a local store leaves MLflow to an uploader trailing its journal
    trail: bool = True
    builds_dir: str | None = None  # paths.builds: where the engine builds live (None: cache_dir)
    # a follow-up run (explain.followups): {run, transition, oracle, direction, quantity, offset, relation,
    # predicted: [lo, hi], edge: [lo, hi]}; its search probes the predicted edge and the old one first
    followup: dict[str, Any] | None = None

    @property
    def engine(self) -> str:
        return self.worker["engine"]

    @property
    def builds(self) -> str:
        """The folder of the engine builds these knobs run on (vllm.version environments, patched copies)."""
        return self.builds_dir or self.cache_dir

    def cache_key(self, requested: dict[str, Any] | None = None) -> dict[str, Any]:
        """What decides a measured point, except its sample and length."""
        requested = self.knobs if requested is None else requested
        options = {k: v for k, v in self.worker["options"].items() if k not in TIMEOUTS}
        if "fault" in options:  # injected failures never change a measured value; the fault model does
            options["fault"] = {k: v for k, v in options["fault"].items() if k not in INJECTED_FAULTS}
        spec = dict(self.worker, knobs=requested, options=options)
        key = {"spec": spec, "versions": facts(self.engine).versions(requested), "hardware": self.hardware,
               "model": self.model_fingerprint, "corpus": self.corpus.fingerprint}
        return key | ({"axis": axis} if (axis := self.axis.key()) else {})  # a batch point never answers for another

    @property
    def grid(self) -> tuple[int, ...]:
        """The search's grid along the axis: prompt lengths, neighbours, neighbour lengths or concurrencies."""
        return self.lengths if self.axis.name == "length" else self.axis.values

    @property
    def runs_here(self) -> bool:
        """Planned for this machine, not for an engine.target_gpu elsewhere: its engine can be asked here."""
        target = self.worker["options"].get("target_gpu")
        return not target or resolution.same_device(target, provenance.local_device().name)

    @property
    def exclusive_device(self) -> bool:
        """Whether two engines (the job's and its reference) must never run at once: vLLM on a GPU claims a share
        of the device at start (`gpu_memory_utilization`: 0.92 by default up to vLLM 0.33; 0.34.0 leaves it None
        and takes 1.0 with its extensible KV cache, else 0.92, vllm/config/cache.py:216), so a second engine there
        fails to start. vLLM's CPU build (host RAM shares) and the simulation run them side by side.
        ONEKNOB_EXCLUSIVE_DEVICE=1 forces the GPU behaviour (tests of it on CPU)."""
        return self.platform not in ("cpu", "synthetic") or os.environ.get("ONEKNOB_EXCLUSIVE_DEVICE") == "1"

    def predict(self, requested: dict[str, Any]) -> dict[str, Any]:
        """The resolved config the rules predict for other knob values on this plan's engine and device."""
        return facts(self.engine).predict(requested, self.worker["settings"], self.defaults)

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> JobPlan:
        data = json.loads(text)
        data["corpus"] = Corpus(tuple(map(tuple, data["corpus"]["samples"])), data["corpus"]["source"],
                                data["corpus"]["fingerprint"])
        data["lengths"], data["oracles"] = tuple(data["lengths"]), tuple(data["oracles"])
        data["verdict"] = VerdictConfig(**data["verdict"])
        data["search"] = SearchConfig(**data["search"])
        data["single_variable"] = SingleVariableConfig(**data["single_variable"])
        data["sweep"] = SweepContext(**data["sweep"]) if data["sweep"] else None
        data["axis"] = Axis.from_dict(data["axis"]) if data.get("axis") else Axis(values=data["lengths"])
        return cls(**data)


def plan_job(cfg, requested: dict[str, Any] | None = None, *, knob: str | None = None,
             name: str | None = None) -> JobPlan:
    """Check everything and build the plan; raises a Refused error naming key, value and fix."""
    values = knobs.from_config(cfg) if requested is None else requested
    knobs.check_all(values)
    checks.check_no_secrets(values)
    checks.check_settings(cfg)
    checks.check_timeouts_and_cache(cfg)
    engine = facts(cfg.engine.name)
    options = checks.engine_options(cfg, engine)
    defaults = engine.defaults(options)
    settings = {"spec_method": cfg.spec.method}
    if values.get("vllm.commit") is not None:  # the checkout the commit is read from (oneknob.provision.commits)
        settings |= {"vllm_source": cfg.vllm.source, "vllm_build_from_source": bool(cfg.vllm.build_from_source)}
    lengths = checks.check_lengths(list(cfg.lengths), cfg.corpus.sample_tokens)
    axis = axis_mod.from_config(cfg, lengths, cfg.corpus.sample_tokens)
    try:
        predicted = engine.predict(values, settings, defaults)
    except ValueError as exc:  # the resolution rules cannot resolve these values (K+1 past every capture size)
        given = " ".join(f"{k}={json.dumps(values.get(k))}" for k in ("spec.k", "cudagraph.capture"))
        raise ConfigError(f"{given}: {exc}") from None
    axis_mod.check_capacity(axis, predicted.get("max_num_seqs"))
    if cfg.search.cover_capture and axis.name == "length":
        lengths = checks.cover_capture(lengths, predicted.get("max_capture_size"), cfg.corpus.sample_tokens,
                                       cfg.model.max_model_len)
    if axis.name != "length":  # the reference (batch) and the corpus see the probe's length alone
        lengths = (axis.probe_length,)
        axis_lengths = (*lengths, *axis.neighbours(max(axis.values)))
    else:
        axis = Axis(values=lengths)
        axis_lengths = lengths
    if len(axis.values) > cfg.search.max_probes:  # else the budget would end the search with grid points unmeasured
        what = f"lengths: {len(axis.values)} lengths" if axis.name == "length" else \
            f"axis={axis.name}: {len(axis.values)} grid points"
        raise ConfigError(f"{what} but search.max_probes={cfg.search.max_probes}: the grid alone exceeds the probe "
                          "budget, so some points would never be measured; raise "
                          f"search.max_probes to at least {len(axis.values)} (plus room to bisect), or thin the grid")
    model = OmegaConf.to_container(cfg.model, resolve=True)
    ref_knobs = checks.reference_knobs(cfg, values) if axis.name != "repeat" else None  # judged by its 1st repeat
    tracking_uri = resolve_uri(cfg.tracking.uri, cfg.paths.mlruns)
    if engine.uses_model and model.get("build") == "tiny":  # provisioning: oneknob's own checkpoint
        checks.check_tiny_build(model)
        model["path"] = str(tiny_model.ensure(Path(model["path"])))
    model_path = engine.prepare_model(model)
    if engine.uses_model:
        checks.check_model_config(model_path)
    # the model's config.json (the synthetic engine's simulated one), then the job's model.override.<path> fields
    model_json = provenance.model_config(model_path) if engine.uses_model else \
        (options.get("fault") or {}).get("model_config") or {}
    overrides = model_override.of(values)
    checks.check_model_overrides(values, model_json, f"the config.json of {model_path}" if engine.uses_model else
                                 "engine.fault.model_config (the synthetic engine's simulated config.json)")
    worker = {"engine": engine.name, "knobs": values, "settings": settings,
              "model": {"path": model_path, "dtype": model["dtype"], "max_model_len": model["max_model_len"],
                        "tokenizer": model.get("tokenizer"), "tensor_parallel_size": model["tensor_parallel_size"],
                        "trust_remote_code": bool(model.get("trust_remote_code"))},
              "options": options | {"gpu_memory_utilization": defaults.get("gpu_memory_utilization")},
              "seed": cfg.seed}
    checks.check_fits_model(max(axis_lengths), model["max_model_len"])  # every engine, the simulation too
    engine.preflight(worker, {"lengths": tuple(sorted(set(axis_lengths))), "defaults": defaults,
                              "dry_run": bool(cfg.dry_run)})
    corpus = load_corpus(cfg.corpus.path, engine.tokenizer(model_path, model.get("tokenizer"), overrides,
                                                         trust_remote_code=bool(model.get("trust_remote_code"))),
                         cfg.corpus.sample_tokens, cfg.samples)
    if engine.uses_model:
        checks.check_model_weights(model_path)
    return JobPlan(
        name=name or run_label(knob, values.get(knob)), knob=knob, knobs=values, worker=worker,
        defaults=defaults, platform=defaults["platform"], corpus=corpus, lengths=lengths, samples=cfg.samples,
        verdict=VerdictConfig(**cfg.verdict), search=SearchConfig(**cfg.search),
        single_variable=SingleVariableConfig(**cfg.single_variable), reference_knobs=ref_knobs,
        reference_engine=cfg.reference_engine, reference_dtype=cfg.reference_dtype,
        reference_per_length=checks.per_length(cfg),
        model_quantities=quantities.model_quantities(model_override.applied(model_json, overrides)),
        oracles=checks.oracles(cfg, model_path) if axis.name != "repeat" else ("nll",), tags=user_tags(cfg.tags),
        axis=axis,
        timeouts={"start_timeout_s": max(cfg.engine.start_timeout_s, cfg.model.start_timeout_s or 0),
                  "request_timeout_s": float(cfg.engine.request_timeout_s)},
        cache_dir=str(Path(cfg.paths.cache).resolve()), builds_dir=str(Path(cfg.paths.builds).resolve()),
        use_cache=cfg.cache, tracking_uri=tracking_uri, experiment=cfg.tracking.experiment, trail=cfg.tracking.trail,
        versions=engine.versions(values), hardware=provenance.hardware(),
        model_fingerprint=engine.model_fingerprint(model_path, overrides),
        predicted=predicted)


def check_output_dir(key: str, path: Path) -> None:
    """A place for a study's files (hydra.sweep.dir, hydra.run.dir): written to when it exists, else checked that
    it can be made (it is made once nothing is refused: a refusal leaves no directory behind), or refused."""
    from oneknob import files
    from oneknob.errors import ConfigError

    try:
        files.check_dir_place(path)
        if Path(path).is_dir():
            files.ensure_writable_dir(path)
    except OSError as exc:
        raise ConfigError(f"{key}={path}: cannot write there ({exc.strerror or exc}); set {key} to a writable "
                          "directory with a shorter name") from None


def provision(plans: list[JobPlan], log, meanwhile=None) -> list[dict[str, Any]]:
    """Create the engine builds these plans run on (vLLM environments, patched copies) before anything is
    recorded: a version that does not install or a patch that does not apply is refused here. Then the
    engine checks every configuration itself (vLLM's config construction, all jobs of a sweep and their
    reference at once): what it refuses is refused here, exit 2, nothing recorded; `meanwhile()` is called
    once as a check process starts (the engine's check imports the engine: so may the first job's worker,
    starting nothing). Returns what the engine's own config construction resolved per plan ({} for an engine
    without one): the dry run prints it."""
    for plan in plans:
        for knob_values in filter(None, (plan.knobs, plan.reference_knobs)):
            facts(plan.engine).interpreter(knob_values, plan.builds, log, settings=plan.worker["settings"])
    resolved: dict[int, dict[str, Any]] = {}
    for engine in dict.fromkeys(plan.engine for plan in plans):
        mine = [plan for plan in plans if plan.engine == engine]
        references = [dict(plan.worker, knobs=plan.reference_knobs) for plan in mine
                      if plan.reference_knobs is not None and plan.reference_engine != "transformers"
                      and plan.reference_knobs != plan.knobs]
        results = facts(engine).validate([plan.worker for plan in mine] + references, mine[0].cache_dir, log,
                                         builds_dir=mine[0].builds, meanwhile=meanwhile)
        resolved.update((id(plan), result.get("resolved") or {}) for plan, result in zip(mine, results))
    return [resolved[id(plan)] for plan in plans]


# -- sweeps --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlannedJob:
    plan: JobPlan
    overrides: tuple[str, ...]  # what Hydra composes the job from (the job itself reads only its plan)


@dataclass(frozen=True)
class SweepPlan:
    jobs: list[PlannedJob]  # the baseline first
    varied: str | None  # the varied knob, or the swept settings, or None
    dir: Path
    dry_run: bool
    notes: list[str] = field(default_factory=list)  # skipped variants, an ignored ablation block
    bisection: Any = None  # bisect=true: the ordered axis searched (oneknob.study.bisect.Bisection)
    reduction: Any = None  # from_command=...: the reporter's flags (oneknob.study.reduce.Reduction)

    @property
    def baseline(self) -> JobPlan:
        return self.jobs[0].plan


def override_value(value: Any) -> str:
    """A Python value as a Hydra override value, quoted where Hydra's grammar would read it otherwise."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    plain = text.replace("_", "a").replace("-", "a").replace(".", "a").isalnum() and text[0].isalpha()
    if plain and text.lower() not in ("true", "false", "null", "inf", "nan"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def plan_sweep(config, arguments: list[str], compose) -> SweepPlan:
    """A multirun as a baseline plus variants; `compose(overrides)` composes one job's config.

    A knob list on the command line is a one-knob study: its baseline is the composed config's value of
    that knob if the list holds it, else the list's first value. Without a list, the `ablation:` block
    gives the variants. Lists of other keys (samples=1,2) make one job per combination, the first one the
    baseline. A variant this machine's engine cannot run is skipped with a note.
    """
    arguments = sv.force_add_families(arguments)
    shape = sv.sweep_shape(arguments)
    swept = (shape.knob, *shape.other)
    count = math.prod(map(len, shape.other.values())) if shape.other else len(shape.values)
    if count > sv.MAX_SWEEP_JOBS:  # refused before a single job is composed (a range is never materialised)
        what = "; ".join(f"{k} over {sv.said(v)}" for k, v in ({shape.knob: shape.values} if shape.knob
                                                              else shape.other).items())
        raise ConfigError(f"this sweep would plan {count} jobs ({what}), more than a sweep plans "
                          f"({sv.MAX_SWEEP_JOBS}: every job is planned before the first starts, and each starts "
                          "an engine); search the values instead with bisect=true (two jobs up front, at most "
                          "log2(N) + 2 in all), or give fewer values")
    fixed = [a for a in arguments if sv.parse([a])[0].key_or_group not in swept
             and not a.lstrip("+~").startswith("hydra/sweeper")]
    base_cfg = compose(fixed)
    block = OmegaConf.to_container(base_cfg.ablation, resolve=True) or {}
    notes = [f"the ablation block is not run: the command line varies {', '.join(k for k in swept if k)}"] \
        if block and (shape.knob or shape.other) else []
    if shape.other:  # a sweep of study settings: one job per combination, the first is the baseline
        combos = [tuple(f"{key}={value}" for key, value in zip(shape.other, combo))
                  for combo in itertools.product(*shape.other.values())]
        jobs = [PlannedJob(plan_job(compose([*fixed, *combo]), name=None if i == 0 else " ".join(combo)),
                           (*fixed, *combo)) for i, combo in enumerate(combos)]
        return SweepPlan(jobs, ", ".join(shape.other), Path(config.hydra.sweep.dir).resolve(),
                         bool(config.dry_run), notes)
    baseline_knobs = knobs.from_config(base_cfg)
    candidates = []  # (knob, value, overrides, composed config)
    if shape.knob:
        for text in shape.values:
            overrides = (*fixed, *sv.force_add_families([f"{shape.knob}={text}"]))
            cfg = compose(list(overrides))
            candidates.append((shape.knob, knobs.from_config(cfg)[shape.knob], overrides, cfg))
        values = [value for _, value, _, _ in candidates]
        base_value = baseline_knobs.get(shape.knob) if baseline_knobs.get(shape.knob) in values else values[0]
        baseline_knobs |= {shape.knob: base_value}
        base = next(c for c in candidates if c[1] == base_value)
        jobs = [PlannedJob(plan_job(base[3], baseline_knobs), base[2])]
    else:
        jobs = [PlannedJob(plan_job(base_cfg, baseline_knobs), tuple(fixed))]
        candidates = [(knob, value, overrides := (*fixed, *sv.force_add_families([f"{knob}={override_value(value)}"])),
                       compose(list(overrides))) for knob, value in sv.variants_of_block(block, baseline_knobs)]
    seen = [json.dumps(baseline_knobs)]
    for i, (knob, value, overrides, cfg) in enumerate(candidates):
        requested = baseline_knobs | {knob: value}  # a family knob the baseline lacks is its first value
        if json.dumps(requested) in seen:  # the baseline, or a value listed twice: one job, said
            if any(c[0] == knob and c[1] == value for c in candidates[:i]):
                notes.append(f"{run_label(knob, value)} is listed more than once: it runs once")
            continue
        seen.append(json.dumps(requested))
        try:
            jobs.append(PlannedJob(plan_job(cfg, requested, knob=knob), overrides))
        except UnavailableHere as exc:
            notes.append(f"{run_label(knob, value)} not run here: {exc}")
    for job in jobs:  # never launch a job that differs from the baseline in two knobs
        assert sum(job.plan.knobs.get(k) != baseline_knobs.get(k) for k in {*baseline_knobs, *job.plan.knobs}) <= 1, \
            job.plan.name
    extended = sorted({L for job in jobs if job.plan.axis.name == "length" for L in job.plan.lengths}
                      - set(base_cfg.lengths))
    if extended:
        top = max(job.plan.predicted.get("max_capture_size") or 0 for job in jobs)
        notes.append(f"lengths {extended} added past the predicted max capture size {top} (on "
                     f"{jobs[0].plan.defaults.get('device', jobs[0].plan.platform)}), so a boundary there has "
                     "its far side measured")
    varied = shape.knob or ", ".join(dict.fromkeys(job.plan.knob for job in jobs[1:])) or None
    return SweepPlan(jobs, varied, Path(config.hydra.sweep.dir).resolve(), bool(config.dry_run), notes)

