"""The CUDA-graph output pool of vLLM #53520, emulated on vLLM's CPU build (the plugin's `emulate_cuda_graphs`).

vLLM's CPU build runs without CUDA graphs. The emulation reproduces the mechanism of vLLM #53520: on a
GPU every step of at most max-capture tokens replays a graph whose output lives in one shared graph memory
pool, so the padded drafter's graph overwrites the target model's output before `_bookkeeping_sync`
computes prompt logprobs from it. Here the target model's and the drafter model's calls are wrapped (their
instance's class is swapped for a subclass whose `__call__` wraps the original, so vLLM's torch.compile
wrappers keep working) so that any output of at most max-capture tokens is copied into ONE static buffer
per process (max capture x hidden, allocated once) and returned as a view of it. Larger steps run as they
do without the plugin. Nothing in vLLM's prompt-logprob path is touched: any corruption comes from vLLM's
own order of events. The max capture size is the one vLLM 0.33.0 would resolve on a (non Blackwell) GPU
for this config, from `oneknob.config.resolution`.

Called by oneknob.engines.vllm.plugin in the worker of rank 0 after warm-up; imports torch and
oneknob.config.resolution only inside its functions.
"""

from __future__ import annotations

from typing import Any

# vLLM 0.33's default -O2 mode when graphs are on (vllm/config/vllm.py:311).
EMULATED_CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"

_pool: GraphPool | None = None  # one per process, as the graph memory pool


def emulated_graphs(resolved: dict[str, Any], explicit_max: int | None) -> dict[str, Any]:
    """What vLLM 0.33 would resolve on a GPU for this config (oneknob.config.resolution's rules)."""
    from oneknob.config.resolution import round_for_v1_spec_decode, capture_sizes

    if resolved["enforce_eager"]:
        return {"max_capture_size": 0, "capture_sizes": [], "cudagraph_mode": "NONE", "cudagraph_emulated": True}
    k = resolved["spec_k"]
    sizes = capture_sizes(
        explicit_max,
        max_num_seqs=resolved["max_num_seqs"],
        spec_k=k,
        max_num_batched_tokens=resolved["max_num_batched_tokens"],
    )
    if resolved["runner"] == "v1" and k > 0:
        sizes = round_for_v1_spec_decode(sizes, 1 + k)
    return {
        "max_capture_size": sizes[-1],
        "capture_sizes": sizes,
        "cudagraph_mode": EMULATED_CUDAGRAPH_MODE,
        "cudagraph_emulated": True,
    }


class GraphPool:
    """One static output buffer per process, like the output of a CUDA graph in vLLM's shared pool."""

    def __init__(self, max_tokens: int, hidden: int, dtype, device) -> None:
        import torch

        self.max_tokens, self.hidden = max_tokens, hidden
        # A normal tensor (not an inference tensor): vLLM writes it inside
        # inference_mode, tests outside it.
        with torch.no_grad():
            self.buffer = torch.zeros(max_tokens * hidden, dtype=dtype, device=device)
        self.placed = {"target": 0, "drafter": 0}
        self.passed = {"target": 0, "drafter": 0}

    def place(self, output, role: str):
        import torch

        if (
            isinstance(output, torch.Tensor)
            and output.dim() >= 1
            and 0 < output.shape[0] <= self.max_tokens
            and output.numel() <= self.buffer.numel()
            and output.dtype == self.buffer.dtype
            and output.device == self.buffer.device
        ):
            view = self.buffer[: output.numel()].view(output.shape)
            view.copy_(output)
            self.placed[role] += 1
            return view
        self.passed[role] += 1
        return output


def _pool_outputs(module, pool: GraphPool, role: str) -> str:
    """Swap the instance's class for a subclass whose __call__ places outputs in the pool."""
    cls = type(module)
    if getattr(cls, "_oneknob_pool_role", None) is not None:
        return cls._oneknob_original_class.__qualname__
    call = cls.__call__

    def __call__(self, *args, **kwargs):
        return pool.place(call(self, *args, **kwargs), role)

    module.__class__ = type(
        cls.__name__,
        (cls,),
        {
            "__call__": __call__,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "_oneknob_pool_role": role,
            "_oneknob_original_class": cls,
        },
    )
    return cls.__qualname__


def emulate(worker, resolved: dict[str, Any], drafter) -> dict[str, Any]:
    """Put the target's and the drafter's outputs of <= max-capture tokens into one shared pool. `resolved`:
    what the worker runs (the plugin's actual_resolved); `drafter`: the runner's drafter, or None."""
    global _pool
    runner = worker.model_runner
    if resolved["platform"] != "cpu":
        return {"active": False, "reason": f"platform {resolved['platform']} runs real CUDA graphs; not emulated"}
    graphs = emulated_graphs(resolved, worker.vllm_config.compilation_config.max_cudagraph_capture_size)
    details: dict[str, Any] = {
        "active": True,
        "resolved": graphs,
        "actual": {key: resolved[key] for key in ("max_capture_size", "capture_sizes", "cudagraph_mode")},
        "target_class": None,
        "drafter_class": None,
        "drafter_model_class": None,
        "pool": None,
    }
    max_tokens = graphs["max_capture_size"]
    if not max_tokens:
        details["note"] = "enforce_eager: no graph would run, nothing wrapped"
        return details
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model_config = worker.vllm_config.model_config
    if _pool is None:
        param = next(model.parameters())
        _pool = GraphPool(max_tokens, model_config.get_hidden_size(), model_config.dtype, param.device)
    details["pool"] = {
        "shape": [_pool.max_tokens, _pool.hidden],
        "dtype": str(_pool.buffer.dtype).replace("torch.", ""),
        "device": str(_pool.buffer.device),
    }
    details["target_class"] = _pool_outputs(model, _pool, "target")
    if drafter is not None:
        details["drafter_class"] = type(drafter).__name__
        drafter_model = getattr(drafter, "model", None)
        if drafter_model is not None and callable(drafter_model):
            details["drafter_model_class"] = _pool_outputs(drafter_model, _pool, "drafter")
    return details


def pool_counts() -> dict[str, dict[str, int]] | None:
    """How many outputs went into the pool / past it, per role (for tests and debugging)."""
    return None if _pool is None else {"placed": dict(_pool.placed), "passed": dict(_pool.passed)}
