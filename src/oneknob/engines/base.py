"""What an engine is to oneknob: the worker-side interface, and the facts the planner needs.

An engine runs inside a worker process (oneknob.worker), one per job; the
orchestrator sends it a worker spec as JSON and talks to it over a line
protocol (`Engine`, below). Everything the orchestrator needs to know about an
engine before one starts - its tokenizer, versions, model fingerprint,
platform, defaults, pre-flight checks, predicted resolved config - comes from
the engine's `Facts`. Nothing else branches on an engine's name.

Resolved config (a dict, keys = oneknob.knobs.RESOLVED_FIELDS, plus "platform"):
    max_capture_size        int | None   largest CUDA-graph capture size
    capture_sizes           list[int]    the capture grid ([] when no graphs)
    cudagraph_mode          str          "NONE" when no graphs run
    max_num_seqs            int
    max_num_batched_tokens  int
    spec_method             str | None   None when K = 0
    spec_k                  int
    enforce_eager           bool
    runner                  "v1" | "v2"
    platform                str          "cpu", "cuda" or "synthetic"
"""

from __future__ import annotations

from typing import Any, Protocol

from oneknob.errors import ConfigError


class Engine(Protocol):
    """Inside the worker process."""

    def start(self, spec: dict[str, Any]) -> None: ...  # build the engine for one job (the worker spec)
    def resolved_config(self) -> dict[str, Any]: ...  # what the engine runs with, read back after start
    def provenance(self) -> dict[str, Any]: ...  # engine/torch/CUDA versions, device, VLLM_* env
    def score(self, token_ids: list[int], topk: int = 0, greedy: int = 0) -> dict: ...  # one prompt, one request:
    # {"logprobs": L - 1 floats, "topk": per position [(id, logprob)] x k, "greedy": a continuation of ids}
    def close(self) -> None: ...  # release memory and child processes


class Facts(Protocol):
    """In the orchestrator, before any engine starts (cheap: no engine import)."""

    name: str
    options: tuple[str, ...]  # the engine.* settings it reads

    def platform(self) -> str: ...  # "cuda", "cpu" or "synthetic": what the resolution rules predict for
    def defaults(self, options: dict[str, Any]) -> dict[str, Any]: ...  # where a knob is null; recorded
    def prepare_model(self, model: dict[str, Any]) -> str: ...  # the path to load (built if oneknob builds it)
    def tokenizer(self, model_path: str, tokenizer: str | None): ...  # corpus text -> this engine's ids
    def versions(self, knob_values: dict) -> dict[str, Any]: ...  # of the build these knobs run on: cache keys
    def model_fingerprint(self, model_path: str) -> str: ...
    def preflight(self, worker: dict, context: dict) -> None: ...  # refuse the worker spec, naming key and fix
    def predict(self, knob_values: dict, settings: dict, defaults: dict) -> dict: ...  # by the resolution rules
    def interpreter(self, knob_values: dict, cache_dir: str, log=print) -> tuple[str, dict]: ...  # python, env


ENGINES = ("vllm", "synthetic")


def facts(name: str) -> Facts:
    if name == "synthetic":
        from oneknob.engines.synthetic import SyntheticFacts

        return SyntheticFacts()
    if name == "vllm":
        from oneknob.engines.vllm import VllmFacts

        return VllmFacts()
    if name == "transformers":  # a reference engine only (reference_engine=transformers)
        from oneknob.engines.transformers import TransformersFacts

        return TransformersFacts()
    raise ConfigError(f"engine={name}: unknown engine; use engine=vllm or engine=synthetic")


def load(name: str) -> Engine:
    """The engine class for a name, in the worker (vLLM is imported lazily there)."""
    if name == "synthetic":
        from oneknob.engines.synthetic import SyntheticEngine

        return SyntheticEngine()
    if name == "transformers":
        from oneknob.engines.transformers import TransformersEngine

        return TransformersEngine()
    from oneknob.engines.vllm import VllmEngine

    return VllmEngine()
