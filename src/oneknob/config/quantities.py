"""The named quantities a transition may track (claims, confounds, the synthetic engine's fault edges and the
suspect probes all draw on this one list), from three places: the engine's resolved config (`CANDIDATES`, by
id), the model's config.json (every length-like integer field, nested ones included, named `model.<path>`:
`model.rope_scaling.original_max_position_embeddings`), and the knobs' values (the suspect probes only).
A resolved config carries the model's under the key `model_quantities` where it is known (explain reads it
back from the params `model_config.<path>`).
"""

from __future__ import annotations

from typing import Any

from oneknob.config.model_override import length_field
from oneknob.config.resolution import DEFAULT_CAPTURE_CEILING, GRID_STRIDE_EDGE, graphs_on

# id -> label, in the order they are listed and preferred.
CANDIDATES: dict[str, str] = {
    "max_capture_size": "resolved max capture size",
    # vLLM 0.34.0 resolves prefill and decode graphs apart (read back from the engine where the release has them)
    "max_prefill_capture_size": "resolved max prefill capture size",
    "decode_requests_x_query_len": "max decode graph requests x (K+1)",
    "seqs_x_query_len": "max_num_seqs x (K+1)",
    "twice_seqs_x_query_len": "2 x max_num_seqs x (K+1)",
    "max_num_batched_tokens": "max_num_batched_tokens",
    # the seed thread's hypothesis (a per-step budget of 2048/(K+1)); vLLM 0.33 computes no such quantity
    # (max_num_scheduled_tokens = max_num_batched_tokens, config/vllm.py:2341-2348), so it is listed, not assumed
    "batched_tokens_per_query_len": "max_num_batched_tokens / (K+1)",
    "default_capture_ceiling": "vLLM's default capture ceiling",
    "grid_stride_edge": "capture-grid stride edge (steps of 8 below it, 16 from it)",
    "power_of_two": "a power of two",
}
# Not a quantity of the config but a property of the boundary: it is listed when
# it coincides, never claimed as what a boundary tracks, and a suggestion avoids it.
POWER_OF_TWO = "power_of_two"

def model_quantities(config: dict | None) -> dict[str, int]:
    """{"model.<path>": value} for every length-like integer of a model's config.json, nested dicts included."""
    found: dict[str, int] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, int) and not isinstance(node, bool) and node > 1 and length_field(path):
            found[f"model.{path}"] = node

    walk(config or {}, "")
    return found


def overridden(model: dict[str, int] | None, knob_values: dict[str, Any]) -> dict[str, int]:
    """The model's length fields ({"model.<path>": value}) after these knob values' model.override.<path>."""
    from oneknob.config.model_override import of

    return (model or {}) | {f"model.{path}": value for path, value in of(knob_values).items()
                            if f"model.{path}" in (model or {}) and isinstance(value, int)
                            and not isinstance(value, bool)}


# The engine's own config sections whose integers are candidates (`<section>.<field>`, as vLLM names them: the KV
# cache's block geometry, the scheduler's limits, the compilation's sizes). Fields that ARE a named candidate
# (CANDIDATES) are that candidate.
CONFIG_SECTIONS = ("scheduler_config", "cache_config", "compilation_config")
CONFIG_ALIASES = {"compilation_config.max_cudagraph_capture_size": "max_capture_size",
                  "scheduler_config.max_num_batched_tokens": "max_num_batched_tokens"}


def is_config_quantity(name: str) -> bool:
    return name.split(".", 1)[0] in CONFIG_SECTIONS


def config_quantities(flat: dict | None) -> dict[str, int]:
    """{"<section>.<field>": value} for every integer > 1 of the engine's scheduler, cache and compilation config
    (`flat`: vLLM's resolved config as the plugin read it back, "<section>.<field>" -> value)."""
    return {k: v for k, v in sorted((flat or {}).items()) if is_config_quantity(k) and k not in CONFIG_ALIASES
            and isinstance(v, int) and not isinstance(v, bool) and v > 1}


def ordered(quantities: dict[str, int]) -> list[str]:
    """The candidate ids of these quantities in preference order: the engine's (CANDIDATES), then the model's."""
    return [c for c in CANDIDATES if c in quantities] + sorted(q for q in quantities if q not in CANDIDATES)


def label(candidate: str) -> str:
    return CANDIDATES.get(candidate, candidate)


def suspect_text(why: str) -> str:
    """A suspect length's reason ("grid_stride_edge - 1") with the quantity's label in place of its id."""
    parts = why.rsplit(" ", 2)
    if len(parts) == 3 and parts[1] in ("+", "-") and parts[0] in CANDIDATES:
        return f"{label(parts[0])} {parts[1]} {parts[2]}"
    return label(why)


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def derived_quantities(resolved: dict[str, Any]) -> dict[str, int]:
    """Candidate quantities of one resolved config, by id (see CANDIDATES).

    max_num_batched_tokens / (K+1) is floored: a per-request-slot share of a
    token budget is an integer division in a scheduler. It is left out when
    K = 0, where it would only repeat max_num_batched_tokens. Graph-only
    quantities are left out when no graphs run (eager, CPU).
    """
    query_len = 1 + (resolved.get("spec_k") or 0)
    max_num_seqs = resolved["max_num_seqs"]
    max_num_batched_tokens = resolved["max_num_batched_tokens"]
    quantities: dict[str, int] = {}
    max_capture = resolved.get("max_capture_size")
    if isinstance(max_capture, int) and max_capture > 0:
        quantities["max_capture_size"] = max_capture
    for field, candidate, factor in (("max_prefill_capture_size", "max_prefill_capture_size", 1),
                                     ("max_decode_capture_requests", "decode_requests_x_query_len", query_len)):
        value = resolved.get(field)  # only where the engine resolved it (vLLM >= 0.34) and graphs run
        if isinstance(value, int) and value > 0 and graphs_on(resolved):
            quantities[candidate] = value * factor
    quantities["seqs_x_query_len"] = max_num_seqs * query_len
    quantities["twice_seqs_x_query_len"] = 2 * max_num_seqs * query_len
    quantities["max_num_batched_tokens"] = max_num_batched_tokens
    if query_len > 1:
        quantities["batched_tokens_per_query_len"] = max_num_batched_tokens // query_len
    if graphs_on(resolved):
        # Constants of vLLM's capture logic (resolution.py): a fixed boundary at
        # one of them would not move with any knob.
        # the device's ceiling (1024 on compute capability 10.x), recorded with the run's engine defaults
        quantities["default_capture_ceiling"] = resolved.get("device_capture_ceiling") or DEFAULT_CAPTURE_CEILING
        quantities["grid_stride_edge"] = GRID_STRIDE_EDGE
    return quantities | (resolved.get("model_quantities") or {})
