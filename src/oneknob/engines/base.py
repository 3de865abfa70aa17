"""What an engine is to oneknob: the worker-side interface, and the facts the planner needs.

An engine runs inside a worker process (oneknob.run.worker), one per job; the
orchestrator sends it a worker spec as JSON and talks to it over a line
protocol (`Engine`, below). Everything the orchestrator needs to know about an
engine before one starts - its tokenizer, versions, model fingerprint,
platform, defaults, pre-flight checks, predicted resolved config - comes from
the engine's `Facts`. Nothing else branches on an engine's name.

Resolved config (a dict, keys = oneknob.config.knobs.RESOLVED_FIELDS, plus "platform"):
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

import importlib
from typing import Any, Protocol

from oneknob.errors import ConfigError


class Engine(Protocol):
    """Inside the worker process."""

    def start(self, spec: dict[str, Any]) -> None: ...  # build the engine for one job (the worker spec)
    def resolved_config(self) -> dict[str, Any]: ...  # what the engine runs with, read back after start
    def provenance(self) -> dict[str, Any]: ...  # engine/torch/CUDA versions, device, VLLM_* env
    def score(self, token_ids: list[int], topk: int = 0, greedy: int = 0) -> dict: ...  # one prompt, one request:
    # {"logprobs": L - 1 floats, "topk": per position [(id, logprob)] x k, "greedy": a continuation of ids}
    def batch(self, prompts: list[list[int]], scored: list[int], topk: int = 0) -> dict: ...  # ONE engine call of
    # several prompts (axis=batch, axis=repeat): {"results": {index: as score's, for the `scored` indices},
    # "steps": [{"total": tokens the step scheduled, "scheduled": [[prompt index, tokens], ...]}] in order}
    def close(self) -> None: ...  # release memory and child processes
    # Optional (oneknob.run.prepared): prepare() imports the engine, starting nothing; check(spec, env) answers the
    # engine's config check of configurations of this worker's environment before start (vllm_introspect's).
    # Optional (oneknob.run.worker._score): score() in two halves, submit(token_ids, topk, greedy) -> a request
    # handed to the engine, collect(request, done) -> its answer, calling done() once the engine is done with it
    # (the worker hands it the next request there); one request in the engine at a time.


class Facts(Protocol):
    """In the orchestrator, before any engine starts (cheap: no engine import)."""

    name: str
    options: tuple[str, ...]  # the engine.* settings it reads (a dotted name: a root key, server.clients)
    uses_model: bool  # loads a checkpoint (model.path; the planner builds model.build=tiny first)

    def platform(self) -> str: ...  # "cuda", "cpu" or "synthetic": what the resolution rules predict for
    def defaults(self, options: dict[str, Any]) -> dict[str, Any]: ...  # where a knob is null; recorded
    def prepare_model(self, model: dict[str, Any]) -> str: ...  # the path to load (built if oneknob builds it)
    def tokenizer(self, model_path: str, tokenizer: str | None,  # corpus text -> this engine's ids
                  overrides: dict | None = None, trust_remote_code: bool = False): ...
    def versions(self, knob_values: dict) -> dict[str, Any]: ...  # of the build these knobs run on: cache keys
    def model_fingerprint(self, model_path: str) -> str: ...
    def preflight(self, worker: dict, context: dict) -> None: ...  # refuse the worker spec, naming key and fix
    def predict(self, knob_values: dict, settings: dict, defaults: dict) -> dict: ...  # by the resolution rules
    def interpreter(self, knob_values: dict, builds_dir: str, log=print,  # python, env, its build made in
                    settings: dict | None = None) -> tuple[str, dict]: ...  # builds_dir (paths.builds) if missing
    def validate(self, workers: list[dict], cache_dir: str, log=print,  # the engine's own check of every
                 builds_dir: str | None = None,  # worker spec (refuses what it rejects), cached in cache_dir;
                 meanwhile=None) -> list[dict]: ...  # its resolved config per spec ({} where none); meanwhile()
    # is called once as a check process starts (the job's worker imports its engine alongside)


# name -> (its Facts class, its Engine class), each "module:Class". Named, never imported here: the planner loads
# one engine's facts, the worker one engine (vLLM itself is imported only inside the worker).
REGISTRY = {
    "vllm": ("oneknob.engines.vllm.facts:VllmFacts", "oneknob.engines.vllm.engine:VllmEngine"),
    "vllm_server": ("oneknob.engines.vllm.server:VllmServerFacts",  # `vllm serve`, HTTP
                    "oneknob.engines.vllm.server:VllmServerEngine"),
    "synthetic": ("oneknob.engines.synthetic:SyntheticFacts", "oneknob.engines.synthetic:SyntheticEngine"),
    "transformers": ("oneknob.engines.transformers:TransformersFacts",  # a reference only
                     "oneknob.engines.transformers:TransformersEngine"),
}
ENGINES = ("vllm", "vllm_server", "synthetic")  # what `engine=` takes (transformers is `reference_engine=transformers`)


def _entry(name: str) -> tuple[str, str]:
    if name not in REGISTRY:
        raise ConfigError(f"engine={name}: unknown engine; use engine=vllm, engine=vllm_server or engine=synthetic")
    return REGISTRY[name]


def _load(named: str):
    module, _, attr = named.partition(":")
    return getattr(importlib.import_module(module), attr)


def facts(name: str) -> Facts:
    return _load(_entry(name)[0])()


def engine_class(name: str) -> type:
    """The engine's class, not instantiated (its module imports no engine: vLLM is imported lazily)."""
    return _load(_entry(name)[1])


def load(name: str) -> Engine:
    """The engine for a name, in the worker."""
    return engine_class(name)()
