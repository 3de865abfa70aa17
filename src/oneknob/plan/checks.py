"""What a composed config must satisfy before a job is planned: every check here names the key, the value and
the fix, and raises before anything starts (errors.ConfigError). plan.py calls them in order."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from oneknob.config import knobs, model_override, secrets
from oneknob import files
from oneknob.plan import single_variable as sv
from oneknob.config.schema import EngineConfig, ServerConfig, VerdictConfig
from oneknob.engines.base import ENGINES, facts
from oneknob.errors import ConfigError

TIMEOUTS = ("start_timeout_s", "request_timeout_s")
ROOTED = {"server": ServerConfig}  # root groups of settings one engine reads (engine=vllm_server: server.*)


def check_no_secrets(knob_values: dict[str, Any]) -> None:
    """A knob named like a credential (engine_args.hf_token, env.VLLM_API_KEY) is refused: every knob's value is
    recorded (the journal, MLflow, the cache key, the report), and credentials change no numerics."""
    for key, value in knob_values.items():
        if value is not None and secrets.secret_name(key.rsplit(".", 1)[-1]):
            raise ConfigError(f"{key}={secrets.MASK}: a credential, and oneknob records every knob's value (the "
                              "journal, MLflow, the report); it takes no secret: drop it, and set it in the "
                              "environment the engine runs in (e.g. HF_TOKEN=... python run.py ...)")


def check_settings(cfg) -> None:
    if cfg.samples < 1:
        raise ConfigError(f"samples={cfg.samples}: need at least one prompt per length; set samples=1 or more")
    policy = cfg.single_variable.side_effects
    if policy not in sv.POLICIES:
        raise ConfigError(f"single_variable.side_effects={policy}: must be one of {', '.join(sv.POLICIES)}")
    if cfg.search.max_probes < 1:
        raise ConfigError(f"search.max_probes={cfg.search.max_probes}: must be >= 1")
    name = cfg.tracking.experiment
    if not name.strip() or len(name) > 200 or not name.isprintable():
        raise ConfigError(f"tracking.experiment={name[:60]!r}{'...' if len(name) > 60 else ''}: an MLflow experiment "
                          "needs a printable name of 1 to 200 characters; e.g. tracking.experiment=my-study")
    if "/" in name or "\\" in name or name.strip(". ") == "":  # its artifacts live in a folder of that name
        raise ConfigError(f"tracking.experiment={name!r}: an experiment name is a name, not a path (no '/', '\\', "
                          "'.' or '..'): its artifacts are stored in a folder of that name under the store; e.g. "
                          "tracking.experiment=my-study")
    seed = cfg.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(f"seed={seed}: the engine's random seed must be an integer in [0, 2**32) (vLLM refuses "
                          "a negative one); e.g. seed=0")
    # common settings vLLM refuses only once an engine starts (its own config classes: the any-argument check)
    if cfg.model.max_model_len < 2:
        raise ConfigError(f"model.max_model_len={cfg.model.max_model_len}: must be a positive number of tokens "
                          "that holds a prompt and one generated token; e.g. model.max_model_len=2048")
    if cfg.model.tensor_parallel_size < 1:
        raise ConfigError(f"model.tensor_parallel_size={cfg.model.tensor_parallel_size}: the GPUs one engine spans, "
                          "must be >= 1; e.g. model.tensor_parallel_size=1")
    share = cfg.engine.gpu_memory_utilization
    if share is not None and not 0 < share <= 1:
        raise ConfigError(f"engine.gpu_memory_utilization={share}: a share of the device's memory, must be in "
                          "(0, 1]; e.g. engine.gpu_memory_utilization=0.9, or null for the default")
    if cfg.model.build not in (None, "tiny"):
        raise ConfigError(f"model.build={cfg.model.build}: oneknob builds one model, the tiny one; set "
                          "model.build=tiny (built into model.path when missing) or model.build=null (model.path is "
                          "a checkpoint)")
    for key in ("max_num_batched_tokens", "gpu_memory_utilization"):  # two paths to one LLM(...) argument
        given = (cfg.engine_args or {}).get(key)
        if cfg.engine[key] is not None and given is not None and given != cfg.engine[key] \
                and facts(cfg.engine.name).uses_model:  # the simulation reads engine.* alone
            raise ConfigError(f"engine.{key}={cfg.engine[key]} and engine_args.{key}={given}: both set "
                              f"LLM({key}=...), and engine_args would win without a word; give one: "
                              f"engine.{key}=null to vary engine_args.{key}, or drop engine_args.{key}")
    tokens = cfg.engine.max_num_batched_tokens
    if tokens is not None and tokens < 1:
        raise ConfigError(f"engine.max_num_batched_tokens={tokens}: must be a positive number of tokens, or null "
                          "for the engine's default")
    for key, value in cfg.verdict.items():  # nan compares false with everything: every length would be clean
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"verdict.{key}={value}: must be a finite number (nan and inf judge nothing); "
                              f"e.g. verdict.{key}={VerdictConfig.__dataclass_fields__[key].default}")
    for key in ("tol_nll", "rtol_nll", "tol_token", "max_nll", "topk_max_kl", "tol_decode", "tol_decode_token"):
        if cfg.verdict[key] < 0:
            raise ConfigError(f"verdict.{key}={cfg.verdict[key]}: must be >= 0")
    for key in ("topk_min_overlap", "greedy_min_match"):
        if not 0 <= cfg.verdict[key] <= 1:
            raise ConfigError(f"verdict.{key}={cfg.verdict[key]}: a share, must be in [0, 1]")
    if not 1 <= cfg.verdict.topk <= 20:  # vLLM refuses more than max_logprobs (20) per position
        raise ConfigError(f"verdict.topk={cfg.verdict.topk}: must be in [1, 20] (vLLM's max_logprobs), e.g. 5")
    if cfg.verdict.greedy_tokens < 1:
        raise ConfigError(f"verdict.greedy_tokens={cfg.verdict.greedy_tokens}: must be >= 1, e.g. 16")
    room = cfg.model.max_model_len - max(cfg.lengths or [0])
    if "greedy" in cfg.oracles and cfg.verdict.greedy_tokens > room:  # the engine holds prompt + continuation
        raise ConfigError(f"verdict.greedy_tokens={cfg.verdict.greedy_tokens}: a continuation after the longest "
                          f"prompt ({max(cfg.lengths)} tokens) must fit model.max_model_len={cfg.model.max_model_len}; "
                          f"give verdict.greedy_tokens={max(1, room)} or less")


PER_LENGTH = {"auto": "auto", "true": "true", "false": "false"}


def per_length(cfg) -> str:
    """reference_per_length as one of auto | true | false (Hydra hands true/false over as words or bools)."""
    value = str(cfg.reference_per_length).lower()
    if value not in PER_LENGTH:
        raise ConfigError(f"reference_per_length={cfg.reference_per_length}: must be auto (measure the reference "
                          "per length only when its prefix self-check fails and it is not under study), true "
                          "(always per length) or false (never: a failing check stops the job)")
    return value


def check_fits_model(longest: int, max_model_len: int) -> None:
    if longest + 1 > max_model_len:  # vLLM keeps room for the one token it generates
        raise ConfigError(f"lengths: {longest} needs model.max_model_len >= {longest + 1} (vLLM generates one "
                          f"token after the prompt), but it is {max_model_len}; drop the length or raise "
                          "model.max_model_len")


def check_lengths(lengths: list[int], sample_tokens: int) -> tuple[int, ...]:
    if not lengths:
        raise ConfigError("lengths=[]: give at least one prompt length, e.g. lengths=[256,512,1024]")
    for length in lengths:
        if length < 2:
            raise ConfigError(f"lengths: {length} is too short: a prompt needs >= 2 tokens to score one")
    duplicates = sorted({x for x in lengths if lengths.count(x) > 1})
    if duplicates:
        raise ConfigError(f"lengths: {duplicates} appear more than once; list each length once")
    if max(lengths) > sample_tokens:
        raise ConfigError(f"lengths: {max(lengths)} is longer than a corpus sample "
                          f"(corpus.sample_tokens={sample_tokens}); raise corpus.sample_tokens")
    return tuple(sorted(lengths))


def cover_capture(lengths: tuple[int, ...], max_capture: int | None, *limits: int) -> tuple[int, ...]:
    """The grid, reaching past the predicted max capture size (a boundary there needs its far side: 1024 on a
    B200 with a grid that stops at 1024), with a margin of a quarter; never past what the corpus and model hold."""
    if not max_capture or max_capture < max(lengths):
        return lengths
    extra = {L for L in (max_capture + 1, max_capture + max_capture // 4) if L + 1 <= min(limits)}
    return tuple(sorted(set(lengths) | extra))


def reference_knobs(cfg, requested: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The reference's knob values (registry defaults + the `reference` block); None in absolute mode.
    A reference equal to the job's requested config is refused: the job would be judged against itself."""
    if cfg.reference is None:
        return None
    try:
        values = {k.key: k.default for k in knobs.KNOBS.values()}
        values |= knobs.flatten(OmegaConf.to_container(cfg.reference, resolve=True))
        knobs.check_all(values)
    except knobs.KnobError as exc:
        raise ConfigError(f"reference: {exc}") from None
    # the job's model.override.<path> fields: the reference judges the model the job runs (so it is keyed by them)
    values |= {k: v for k, v in (requested or {}).items() if model_override.is_override(k) and v is not None}
    if values == requested and cfg.reference_engine == "vllm":
        plain = {k.key: k.default for k in knobs.KNOBS.values()} | {"cudagraph.enforce_eager": True, "spec.k": 0}
        fix = ("pick a reference with graphs off and no speculation, e.g. reference.cudagraph.enforce_eager=true "
               "reference.spec.k=0 (the default reference)") if requested != plain else (
            "this job already runs without graphs and speculation, the default reference's own config: judge it "
            "against the same checkpoint outside vLLM with reference_engine=transformers")
        raise ConfigError(f"reference={json.dumps(OmegaConf.to_container(cfg.reference, resolve=True))}: it is "
                          f"this job's own requested config ({json.dumps(requested)}), so every length would "
                          f"match itself and look clean; {fix}, or reference=null to judge by verdict.max_nll alone")
    return values


def engine_options(cfg, engine) -> dict[str, Any]:
    """The engine.* settings this engine reads; one it does not read, set away from its default, is refused
    (engine.fault.* on engine=vllm would otherwise be ignored in silence)."""
    given = OmegaConf.to_container(cfg.engine, resolve=True)
    unread = asdict(EngineConfig(name=cfg.engine.name))
    # engine-specific root groups (server.*): their keys are options named "server.clients"
    rooted = {f"{group}.{key}": (value, asdict(cls()).get(key)) for group, cls in ROOTED.items()
              for key, value in OmegaConf.to_container(cfg[group], resolve=True).items()}
    given_all = {f"engine.{k}": (v, unread[k]) for k, v in given.items()} | rooted
    for name in sorted(set(given_all) - {"engine.name", *(f"engine.{t}" for t in TIMEOUTS),
                                         *(o if "." in o else f"engine.{o}" for o in engine.options)}):
        value, default = given_all[name]
        if value != default:
            key = name.removeprefix("engine.")
            changed = next((f"{name}.{k}" for k in value if value[k] != default.get(k)), name) \
                if isinstance(value, dict) else name
            owner = next((other for other in ENGINES if other != engine.name and key in facts(other).options), None)
            label = changed if isinstance(value, dict) or name.startswith("engine.") else f"{name}={_shown(value)}"
            raise ConfigError(f"{label}: engine={engine.name} does "
                              "not read it" + (f" (it belongs to engine={owner})" if owner else "")
                              + f"; drop it, or use engine={owner or '...'}")
    return {key: given_all[key if "." in key else f"engine.{key}"][0] for key in engine.options}


def _shown(value: Any) -> str:
    return "null" if value is None else json.dumps(value) if not isinstance(value, str) else value


WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def check_tiny_build(model: dict[str, Any]) -> None:
    """model.build=tiny writes only where oneknob's builder may: a new directory or one of its own builds."""
    from oneknob.provision import tiny_model

    path = Path(model["path"])
    try:
        files.check_dir_place(path)  # a file on the way (model.path=<a file>/sub), a name too long
    except OSError as exc:
        raise ConfigError(f"model.path={model['path']}: the tiny model cannot be built there ({exc.strerror or exc}); "
                          "give model.path a new directory (model.build=tiny) or an existing checkpoint "
                          "(model.build=null)") from None
    if not tiny_model.may_build_into(path):
        raise ConfigError(f"model.build=tiny with model.path={model['path']}: that directory exists and was not made "
                          f"by oneknob's tiny-model builder (no {tiny_model.MARKER} marker), and oneknob never "
                          "writes into, replaces or deletes a directory it did not create; to run the checkpoint "
                          "in it set model.build=null, or give model.path a new directory for the tiny model")


def check_model_config(model_path: str) -> None:
    """A local checkpoint's config.json must parse (vLLM reads it first)."""
    path = Path(model_path)
    if not path.is_dir():
        return  # a hub id (prepare_model refused a missing directory)
    config = path / "config.json"
    try:
        data = json.loads(config.read_text())
    except FileNotFoundError:
        raise ConfigError(f"model.path={model_path}: no config.json in it, so it is not a checkpoint vLLM can "
                          "load; give a model directory with config.json and weights, or model=tiny") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"model.path={model_path}: its config.json cannot be read as JSON ({exc}); fix or "
                          "replace config.json") from None
    if not isinstance(data, dict):
        raise ConfigError(f"model.path={model_path}: its config.json holds {type(data).__name__}, not an object; "
                          "fix or replace config.json")


def check_model_overrides(knob_values: dict[str, Any], config: dict | None, where: str) -> None:
    """model.override.<path>=VALUE: the path exists in the model's config.json and the value has its type."""
    for path, value in model_override.of(knob_values).items():
        if problem := model_override.problem(config, path, value, where):
            raise ConfigError(problem)


def check_model_weights(model_path: str) -> None:
    """A local checkpoint must hold weights: vLLM says 'Cannot find any model weights' only after it started."""
    path = Path(model_path)
    if path.is_dir() and not any(next(path.glob(pattern), None) for pattern in WEIGHTS):
        raise ConfigError(f"model.path={model_path}: no weights in it (no {', '.join(WEIGHTS)} file), so no engine "
                          "could load it; give the directory that holds the checkpoint's weights, or model=tiny")


def check_timeouts_and_cache(cfg) -> None:
    timeouts = {f"engine.{key}": cfg.engine[key] for key in TIMEOUTS} | {"model.start_timeout_s":
                                                                        cfg.model.start_timeout_s}
    for key, value in timeouts.items():  # nan compares false with everything: a hang would never be caught
        if value is not None and (not math.isfinite(value) or value <= 0):
            default = EngineConfig.__dataclass_fields__[key.split(".")[1]].default if key.startswith("engine") \
                else 1800
            raise ConfigError(f"{key}={value}: must be > 0 seconds and finite (nan or inf would wait for a hung "
                              f"engine forever); e.g. {key}={default}")
    cache = Path(cfg.paths.cache)
    try:
        files.ensure_writable_dir(cache)
    except OSError as exc:
        raise ConfigError(f"paths.cache={cache}: cannot write there ({exc.strerror}); make it writable or set "
                          "paths.cache (or paths.root) elsewhere") from None


def oracles(cfg, model_path: str) -> tuple[str, ...]:
    """The oracles asked for, and a reference that can serve them (oracles.py)."""
    from oneknob.config.schema import ORACLES

    asked = tuple(dict.fromkeys(cfg.oracles))
    if len(asked) < len(cfg.oracles):
        twice = sorted({o for o in cfg.oracles if list(cfg.oracles).count(o) > 1})
        raise ConfigError(f"oracles=[{','.join(cfg.oracles)}]: {', '.join(twice)} listed more than once; list each "
                          f"oracle once: oracles=[{','.join(asked)}]")
    unknown = [o for o in asked if o not in ORACLES]
    if unknown or not asked:
        raise ConfigError(f"oracles={list(cfg.oracles)}: the oracles are {', '.join(ORACLES)}; give one or more, "
                          "e.g. oracles=[nll,topk,greedy]")
    if cfg.reference is None:  # absolute mode judges mean NLL alone: the oracles that need a reference go
        if {"greedy", "decode"} & set(asked) or "nll" not in asked:
            raise ConfigError(f"oracles={list(asked)}: topk, greedy and decode compare with a reference, and "
                              "reference=null judges by verdict.max_nll alone; give a reference or oracles=[nll]")
        asked = ("nll",)
    if cfg.reference_engine not in ("vllm", "transformers"):
        raise ConfigError(f"reference_engine={cfg.reference_engine}: use vllm (a vLLM configuration) or "
                          "transformers (the same checkpoint scored by HF transformers)")
    if cfg.reference_engine == "transformers":
        if cfg.reference is None:
            raise ConfigError("reference_engine=transformers with reference=null: absolute mode has no reference; "
                              "drop one of them")
        if not facts(cfg.engine.name).uses_model:
            raise ConfigError(f"reference_engine=transformers: engine={cfg.engine.name} has no checkpoint for "
                              "transformers to load; use engine=vllm")
        from oneknob.engines.transformers import DTYPES, check_loadable

        if cfg.reference_dtype is not None and cfg.reference_dtype not in DTYPES:
            raise ConfigError(f"reference_dtype={cfg.reference_dtype}: use one of {', '.join(DTYPES)}, or null for "
                              "the model's own dtype")
        check_loadable(model_path, bool(cfg.model.trust_remote_code))
    return asked
