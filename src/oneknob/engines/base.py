"""What an engine is to oneknob: the interface the worker process drives.

An engine lives inside a worker process (oneknob.worker), one per job. The
orchestrator never imports an engine; it sends the worker a `WorkerSpec` as
JSON and talks to it over a line protocol. Both engines (vLLM, synthetic)
report the same resolved-config shape, so nothing above the worker can tell
which one it is talking to.

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


class Engine(Protocol):
    name: str

    def start(self, spec: dict[str, Any]) -> None:
        """Build the engine for one job (a WorkerSpec as a dict)."""

    def resolved_config(self) -> dict[str, Any]:
        """The configuration the engine actually runs with, read back after start."""

    def provenance(self) -> dict[str, Any]:
        """Versions and hardware: engine/torch/CUDA versions, device, VLLM_* env."""

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """Logprob of each prompt token given the ones before it.

        One request, one prompt: the step's token count is the prompt's length.
        Returns len(token_ids) - 1 floats (position 0 has no logprob).
        """

    def close(self) -> None:
        """Release the engine (memory, child processes)."""


def load(name: str) -> Engine:
    """The engine class for a name, imported lazily (vLLM is heavy)."""
    if name == "synthetic":
        from oneknob.engines.synthetic import SyntheticEngine

        return SyntheticEngine()
    if name == "vllm":
        from oneknob.engines.vllm import VllmEngine

        return VllmEngine()
    raise ValueError(f"engine={name!r}: unknown engine; use engine=vllm or engine=synthetic")
