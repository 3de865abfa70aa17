"""The engine part of repro.py for engine=vllm: vLLM's offline `LLM`, nothing of oneknob (repro_common.py has the
rest; oneknob.explain.repro puts them together under one study's data)."""

from __future__ import annotations

import os

CONFIGS: dict = {}  # name -> {"run", "llm": LLM(...) kwargs, "env": variables to set, "unset": variables to remove}
SIDES: dict = {}  # {"polluted": L, "clean": L'}: the boundary's two sides, in prompt tokens
SAMPLING: dict = {}  # SamplingParams(...) kwargs, the same for every configuration
EMULATION: dict = {}  # the variables that turn on oneknob's CUDA-graph-pool emulation (vLLM's CPU build), or {}

# --- code ---
def nll(logprobs: list) -> float:
    """Mean NLL of a prompt of L tokens over its L - 1 scored positions."""
    return -sum(logprobs) / len(logprobs)


def score(name: str, samples: list[list[int]]) -> dict[str, list[float]]:
    """One configuration in this process: its LLM(...), the prompts at both sides, each sample's mean NLL."""
    config = CONFIGS[name]
    for key in config["unset"]:
        os.environ.pop(key, None)
    os.environ.update(config["env"])
    os.environ.update(EMULATION)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**config["llm"])
    params = SamplingParams(**SAMPLING)
    found = {}
    for side in ("polluted", "clean"):
        length, values = SIDES[side], []
        for ids in samples:
            ids = ids[:length]
            out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
            entries = out.prompt_logprobs  # entry 0 is None; entry i holds prompt token i's own logprob
            values.append(nll([entries[i][ids[i]].logprob for i in range(1, length)]))
        found[str(length)] = values
    return found
