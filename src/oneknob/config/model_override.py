"""Model config fields as knobs: `model.override.<path>=VALUE` changes one field of the model's config.json.

`model.override.rope_scaling.original_max_position_embeddings=300` is a knob like `engine_args.*`: sweepable under
the single-variable rule, in the cache key (the knob values) and in the model fingerprint. Every reader of the
model sees the same config: vLLM as `hf_overrides` (`hf_overrides`, below: a field inside a mapping of config.json,
such as rope_scaling, is passed as that whole mapping with the field changed, because vLLM replaces a mapping it is
given), HF transformers (the reference) and the tokenizer as the config.json dict with the field changed
(`applied`), and the model's length fields (the candidate quantities `model.<path>`, the suspect lengths) as they
are after it. A job's reference runs with the job's overrides: it judges the model the job runs.

Checked before any engine (`problem`): the path must exist in config.json (did you mean ...), and the value must
have the field's type (an integer field takes integers, a float field numbers, a flag true/false, a string a
string, a list a list; a null field anything). null is no override: the checkpoint's own value. Pure functions
over plain dicts, except `pretrained_config` (transformers, imported when called).
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from typing import Any

PREFIX = "model.override."
MAX_TOKENS = 2**31 - 1  # vLLM's sequence lengths and positions on its kernels are int32
# A model config field is length-like when its name says so (and it is no layer count or token id).
LENGTH_WORDS = ("position", "window", "length", "len", "chunk", "context", "ctx", "seq")
NOT_LENGTHS = ("layer", "token_id", "head", "vocab", "hidden", "expert")


def length_field(path: str) -> bool:
    """Whether a config.json field (a dotted path) is named like a length in tokens."""
    name = path.rsplit(".", 1)[-1].lower()
    return any(w in name for w in LENGTH_WORDS) and not any(w in name for w in NOT_LENGTHS)
_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_override(key: str) -> bool:
    """model.override.<path>, <path> dotted identifiers (rope_scaling.original_max_position_embeddings)."""
    return key.startswith(PREFIX) and all(_PART.fullmatch(part) for part in key[len(PREFIX):].split("."))


def leaves(mapping: Any, path: str = "") -> dict[str, Any]:
    """{"rope_scaling": {"factor": 2}} -> {"rope_scaling.factor": 2}: a nested mapping (Hydra nests dotted keys)
    as the dotted paths of its leaves."""
    if not hasattr(mapping, "items"):
        return {path: mapping}
    found: dict[str, Any] = {}
    for key, value in mapping.items():
        found |= leaves(value, f"{path}.{key}" if path else str(key))
    return found


def of(knob_values: dict[str, Any]) -> dict[str, Any]:
    """The overrides these knob values set, {path: value}, null ones (the checkpoint's own value) left out."""
    return {key[len(PREFIX):]: value for key, value in sorted(knob_values.items())
            if is_override(key) and value is not None}


def applied(config: dict | None, overrides: dict[str, Any]) -> dict:
    """config.json with every override set (a copy; the checkpoint's file is never written)."""
    result = copy.deepcopy(config or {})
    for path, value in overrides.items():
        *parents, name = path.split(".")
        node = result
        for part in parents:
            node = node[part]
        node[name] = value
    return result


def hf_overrides(config: dict | None, overrides: dict[str, Any]) -> dict:
    """vLLM's `hf_overrides` for these overrides: each top-level field they touch, with its value after them.
    vLLM sets a top-level mapping (rope_scaling) as a whole, so a nested field goes with its siblings."""
    after = applied(config, overrides)
    return {top: after[top] for top in dict.fromkeys(path.split(".")[0] for path in overrides)}


def digest(overrides: dict[str, Any]) -> str:
    """A short hash of these overrides, for fingerprints: another config is another model."""
    import hashlib

    return hashlib.sha256(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:8]


def fields(config: dict | None) -> list[str]:
    """Every path of config.json, mappings and their leaves alike."""
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        for key, value in node.items():
            found.append(f"{path}{key}")
            if isinstance(value, dict):
                walk(value, f"{path}{key}.")

    walk(config or {}, "")
    return found


_TYPES = ((bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string"), (list, "a list"))


def _kind(value: Any) -> str:
    return next(text for cls, text in _TYPES if isinstance(value, cls)) if isinstance(
        value, (bool, int, float, str, list)) else "a mapping" if isinstance(value, dict) else "null"


def _takes(current: Any, value: Any) -> bool:
    if current is None:
        return True
    if isinstance(current, bool) or isinstance(value, bool):
        return isinstance(current, bool) and isinstance(value, bool)
    if isinstance(current, float):
        return isinstance(value, (int, float))
    return type(current) is type(value) or (isinstance(current, int) and isinstance(value, int))


def problem(config: dict | None, path: str, value: Any, where: str) -> str | None:
    """What is wrong with setting `path` of this config.json to `value` (None when nothing): the message names
    the key, the value and the fix. `where` names the config: "the config.json of models/tiny-mtp"."""
    key, shown = f"{PREFIX}{path}", json.dumps(value)
    if value is None:
        return None
    if config is None:
        return (f"{key}={shown}: {where} is not on this machine, so no field of it can be checked or overridden; "
                "give a local checkpoint directory, or drop the override")
    node, parts = config, path.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            known = fields(config)
            near = difflib.get_close_matches(path, known, n=3, cutoff=0.75) or difflib.get_close_matches(
                path, [f for f in known if f.rsplit(".", 1)[-1] == parts[-1]] or known, n=1, cutoff=0.4)
            above = ".".join(parts[:depth])
            if above and not isinstance(node, dict):
                return (f"{key}={shown}: {above} is {_kind(node)} in {where} ({json.dumps(node)}), "
                        f"not a mapping with fields; set {PREFIX}{above} itself")
            hint = f"did you mean {' or '.join(PREFIX + n for n in near)}?" if near else \
                f"its fields: {', '.join(known[:40])}" if known else "it declares no field"
            return f"{key}={shown}: {where} has no field {path}; {hint}"
        node = node[part]
    if isinstance(node, dict):
        return (f"{key}={shown}: {path} is a mapping in {where}; override one of its fields: "
                + ", ".join(f"{key}.{sub}" for sub in node))
    if not _takes(node, value):
        return (f"{key}={shown}: {path} is {_kind(node)} in {where} ({json.dumps(node)}), so it "
                f"takes {_kind(node)}, not {_kind(value)}; e.g. {key}={json.dumps(node)} is the checkpoint's own "
                f"value (null: no override)")
    if isinstance(node, int) and not isinstance(node, bool) and node > 1 and length_field(path) \
            and not 1 <= value <= MAX_TOKENS:
        return (f"{key}={shown}: {path} is a length in tokens ({node} in {where}), so it takes an integer from 1 to "
                f"{MAX_TOKENS:,} (vLLM keeps sequence lengths as 32-bit integers); e.g. {key}={node} is the "
                f"checkpoint's own value (null: no override)")
    return None


def pretrained_config(path: str, overrides: dict[str, Any]):
    """The transformers config of the checkpoint at `path` with these overrides, built from its config.json as
    transformers would read the changed file (derived fields, such as the RoPE parameters, standardised as usual)."""
    from transformers import AutoConfig, PretrainedConfig

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if not overrides:
        return config
    as_read, _ = PretrainedConfig.get_config_dict(path, local_files_only=True)
    return type(config).from_dict(applied(as_read, overrides))
