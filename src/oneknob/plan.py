"""From a composed config to a checked job plan, before any engine starts.

Everything a user can get wrong is caught here with a message that names the
key, the value and the fix: knob values, lengths, samples, corpus, model,
settings, tracking store. `plan_job` returns a frozen `JobPlan`; nothing else
in oneknob reads the raw config for these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from oneknob import corpus as corpus_mod
from oneknob import knobs, provenance
from oneknob.tracking import resolve_uri

SIDE_EFFECT_POLICIES = ("pin", "flag", "refuse")
INJECTED_FAULTS = ("crash_at_length", "hang_at_length", "crash_on_start", "delay_s")  # engine.fault.*


class ConfigError(ValueError):
    pass


class UnavailableHere(ConfigError):
    """Valid knob values that this machine's engine build cannot run (an ablation skips them)."""


@dataclass(frozen=True)
class JobPlan:
    knobs: dict[str, Any]  # requested knob values, by key
    engine: str
    worker_spec: dict[str, Any]  # what the worker gets (engine, knobs, settings, model, options)
    corpus: corpus_mod.Corpus
    lengths: tuple[int, ...]
    samples: int
    model_fingerprint: str
    versions: dict[str, Any]
    hardware: dict[str, str]
    reference_knobs: dict[str, Any] | None  # None = absolute mode
    tracking_uri: str
    cfg: Any  # the composed config, for the settings the plan does not flatten

    def cache_key(self, requested: dict[str, Any] | None = None) -> dict[str, Any]:
        """What decides a measured point, except its sample and length."""
        spec = dict(self.worker_spec, knobs=requested if requested is not None else self.knobs)
        options = {k: v for k, v in spec["options"].items() if k not in ("start_timeout_s", "request_timeout_s")}
        if "fault" in options:  # injected failures never change a measured value; the fault model does
            options["fault"] = {k: v for k, v in options["fault"].items() if k not in INJECTED_FAULTS}
        spec["options"] = options
        return {"spec": spec, "versions": self.versions, "hardware": self.hardware,
                "model": self.model_fingerprint, "corpus": self.corpus.fingerprint}

    def with_knobs(self, values: dict[str, Any]) -> JobPlan:
        from dataclasses import replace

        return replace(self, knobs=values, worker_spec=dict(self.worker_spec, knobs=values))


def _engine_options(cfg) -> dict[str, Any]:
    options = OmegaConf.to_container(cfg.engine, resolve=True)
    options.pop("name")
    if cfg.engine.name == "vllm" and options.get("gpu_memory_utilization") is None:
        options["gpu_memory_utilization"] = 0.85 if provenance.gpu() else 0.2
    return options


def _check_settings(cfg) -> None:
    if cfg.engine.name not in ("vllm", "synthetic"):
        raise ConfigError(f"engine={cfg.engine.name}: unknown engine; use engine=vllm or engine=synthetic")
    if cfg.samples < 1:
        raise ConfigError(f"samples={cfg.samples}: need at least one prompt per length; set samples=1 or more")
    policy = cfg.single_variable.side_effects
    if policy not in SIDE_EFFECT_POLICIES:
        raise ConfigError(f"single_variable.side_effects={policy}: must be one of "
                          f"{', '.join(SIDE_EFFECT_POLICIES)}")
    if cfg.search.max_probes < 1:
        raise ConfigError(f"search.max_probes={cfg.search.max_probes}: must be >= 1")
    for key in ("tol_nll", "rtol_nll", "tol_token", "max_nll"):
        if cfg.verdict[key] < 0:
            raise ConfigError(f"verdict.{key}={cfg.verdict[key]}: must be >= 0")


def _check_lengths(lengths: list[int], max_model_len: int | None, sample_tokens: int) -> tuple[int, ...]:
    if not lengths:
        raise ConfigError("lengths=[]: give at least one prompt length, e.g. lengths=[256,512,1024]")
    for length in lengths:
        if length < 2:
            raise ConfigError(f"lengths: {length} is too short: a prompt needs >= 2 tokens to score one")
    duplicates = sorted({x for x in lengths if lengths.count(x) > 1})
    if duplicates:
        raise ConfigError(f"lengths: {duplicates} appear more than once; list each length once")
    longest = max(lengths)
    if max_model_len is not None and longest > max_model_len:
        raise ConfigError(f"lengths: {longest} is above model.max_model_len={max_model_len}; "
                          "drop it or raise model.max_model_len")
    if longest > sample_tokens:
        raise ConfigError(f"lengths: {longest} is longer than a corpus sample "
                          f"(corpus.sample_tokens={sample_tokens}); raise corpus.sample_tokens")
    return tuple(sorted(lengths))


def _check_model(cfg, requested: dict[str, Any]) -> str:
    """The model path the engine will load, built first if it is oneknob's tiny model."""
    model = cfg.model
    if cfg.engine.name == "synthetic":
        return model.path
    path = Path(model.path)
    if model.build == "tiny":
        from oneknob import tiny_model

        return str(tiny_model.ensure(path))
    if not path.is_dir() and (path.is_absolute() or model.path.startswith(".") or model.path.count("/") != 1):
        raise ConfigError(f"model.path={model.path}: no such model directory; give a local checkpoint "
                          "directory, a hub id (org/name) cached on this machine, or model=tiny")
    return model.path


def _check_platform(cfg, values: dict[str, Any]) -> None:
    # vLLM's CPU build refuses to start Model Runner V2 ("Model Runner V2 requires Triton",
    # vllm/config/vllm.py): say so before an engine start is spent on it.
    if cfg.engine.name == "vllm" and values["runner"] == "v2" and not provenance.gpu():
        raise UnavailableHere("runner=v2: vLLM's Model Runner V2 needs Triton, which vLLM's CPU build lacks "
                              "(vLLM refuses to start); use runner=v1 or runner=null on CPU, or run on a GPU")


def _check_spec_support(cfg, model_path: str, values: dict[str, Any]) -> None:
    if cfg.engine.name != "vllm" or values["spec.k"] == 0 or cfg.spec.method != "mtp":
        return
    config = provenance.model_config(model_path)
    if config is None:
        return  # a hub id: vLLM itself will say
    layers = max(config.get("num_nextn_predict_layers") or 0, config.get("num_mtp_layers") or 0,
                 config.get("mtp_num_hidden_layers") or 0)
    if layers == 0:
        raise ConfigError(f"spec.k={values['spec.k']}: model {model_path} has no MTP layers "
                          "(num_nextn_predict_layers is 0 or missing), so MTP speculation cannot run; "
                          "use spec.k=0, another spec.method, or a model with MTP layers")


def reference_knobs(cfg) -> dict[str, Any] | None:
    if cfg.reference is None:
        return None
    try:
        overrides = knobs.flatten(OmegaConf.to_container(cfg.reference, resolve=True))
    except knobs.KnobError as exc:
        raise ConfigError(f"reference: {exc}") from None
    values = {k.key: k.default for k in knobs.KNOBS.values()} | overrides
    try:
        knobs.check_all(values)
    except knobs.KnobError as exc:
        raise ConfigError(f"reference: {exc}") from None
    return values


def plan_job(cfg, requested: dict[str, Any] | None = None) -> JobPlan:
    """Check everything and build the plan; raises ConfigError (or KnobError) naming key and fix."""
    values = requested if requested is not None else knobs.from_config(cfg)
    knobs.check_all(values)
    _check_settings(cfg)
    ref_knobs = reference_knobs(cfg)
    tracking_uri = resolve_uri(cfg.tracking.uri, cfg.paths.mlruns)
    max_model_len = cfg.model.max_model_len if cfg.engine.name == "vllm" else None
    lengths = _check_lengths(list(cfg.lengths), max_model_len, cfg.corpus.sample_tokens)
    model_path = _check_model(cfg, values)
    _check_platform(cfg, values)
    _check_spec_support(cfg, model_path, values)
    tokenizer = corpus_mod.tokenizer_for(cfg.engine.name, cfg.model.tokenizer or model_path)
    try:
        corpus = corpus_mod.load(cfg.corpus.path, tokenizer, cfg.corpus.sample_tokens, cfg.samples)
    except corpus_mod.CorpusError as exc:
        raise ConfigError(str(exc)) from None
    worker_spec = {
        "engine": cfg.engine.name,
        "knobs": values,
        "settings": {"spec_method": cfg.spec.method},
        "model": {"path": model_path, "dtype": cfg.model.dtype, "max_model_len": cfg.model.max_model_len,
                  "tokenizer": cfg.model.tokenizer},
        "options": _engine_options(cfg),
        "seed": cfg.seed,
    }
    return JobPlan(
        knobs=values, engine=cfg.engine.name, worker_spec=worker_spec, corpus=corpus, lengths=lengths,
        samples=cfg.samples,
        model_fingerprint="synthetic" if cfg.engine.name == "synthetic" else provenance.model_fingerprint(model_path),
        versions=provenance.engine_versions(cfg.engine.name), hardware=provenance.hardware(),
        reference_knobs=ref_knobs, tracking_uri=tracking_uri, cfg=cfg,
    )
