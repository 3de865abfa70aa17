"""The synthetic engine: a documented SIMULATION of vLLM, for demos and tests.

It needs no GPU and no model. It is honest about being a stand-in:

* Resolution: knobs resolve with vLLM 0.33's rules (oneknob.resolution), so
  K moves the default capture size exactly as it does in vLLM.
* Language model: an adaptive, causal bigram model over byte tokens. The
  logprob of token t depends only on tokens before it, so prefixes score
  exactly as in a longer prompt; mean NLL starts near log(256) and falls with
  context to a few nats.
* Fault model (the mechanism of vLLM PR #53520, as a rule): when CUDA graphs
  are on, K > 0, the runner is a polluting one, and the step's token count
  (the prompt's length: one prompt per request) is <= the resolved max capture
  size, the returned logprobs are garbage of 10-16 nats per token, as if read
  from an output buffer the padded drafter overwrote.
* Injected failures for tests of the orchestrator: crash or hang at a given
  length, crash during start, a delay per request.

`SyntheticFacts` is what the planner knows of it: byte tokens, no model, the
defaults set under `engine.*` in conf/engine/synthetic.yaml.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any

import numpy as np

from oneknob import resolution

VOCAB = 256  # byte tokens


def bigram_logprobs(token_ids: list[int]) -> np.ndarray:
    """Causal adaptive bigram model with unigram back-off, Laplace-smoothed."""
    ids = np.asarray(token_ids, dtype=np.int64)
    bigram = np.zeros((VOCAB, VOCAB))
    unigram = np.ones(VOCAB)  # add-one prior
    out = np.empty(len(ids) - 1)
    for i in range(1, len(ids)):
        prev, tok = ids[i - 1], ids[i]
        unigram[ids[i - 1]] += 1.0
        p_uni = unigram[tok] / unigram.sum()
        row = bigram[prev]
        p = (row[tok] + 2.0 * p_uni) / (row.sum() + 2.0)
        out[i - 1] = np.log(p)
        bigram[prev, tok] += 1.0
    return out


def _predict(knob_values: dict[str, Any], settings: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    resolved = resolution.predict(knob_values, platform="cuda", spec_method=settings.get("spec_method", "mtp"),
                                  default_max_num_seqs=defaults["default_max_num_seqs"],
                                  max_num_batched_tokens=defaults["max_num_batched_tokens"],
                                  default_runner=defaults["default_runner"])
    return resolved | {"platform": "synthetic"}


class SyntheticFacts:
    name = "synthetic"

    def platform(self) -> str:
        return "synthetic"

    def defaults(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"default_max_num_seqs": options.get("default_max_num_seqs", 256),
                "default_runner": options.get("default_runner", "v2"),
                "max_num_batched_tokens": options.get("max_num_batched_tokens", 2048)}

    def prepare_model(self, model: dict[str, Any]) -> str:
        return model["path"]  # no model: the bigram model needs none

    def tokenizer(self, model_path: str, tokenizer: str | None):
        from oneknob.corpus import BYTES

        return BYTES

    def versions(self) -> dict[str, Any]:
        from oneknob import __version__

        return {"oneknob": __version__}

    def model_fingerprint(self, model_path: str) -> str:
        return "synthetic"

    def preflight(self, knob_values: dict[str, Any], model_path: str, settings: dict[str, Any]) -> None:
        pass

    def predict(self, knob_values: dict[str, Any], settings: dict[str, Any], defaults: dict[str, Any]) -> dict:
        return _predict(knob_values, settings, defaults)


class SyntheticEngine:
    name = "synthetic"

    def start(self, spec: dict[str, Any]) -> None:
        options = spec.get("options", {})
        self.fault = options.get("fault", {})
        if self.fault.get("crash_on_start"):
            print("synthetic: injected crash during start", file=sys.stderr, flush=True)
            os._exit(3)
        self.seed = spec.get("seed", 0)
        self.resolved = _predict(spec["knobs"], spec.get("settings", {}), SyntheticFacts().defaults(options))
        print(f"synthetic: resolved {self.resolved}", file=sys.stderr, flush=True)

    def resolved_config(self) -> dict[str, Any]:
        return dict(self.resolved)

    def provenance(self) -> dict[str, Any]:
        from oneknob import __version__

        return {
            "engine": "synthetic",
            "engine_version": __version__,
            "device": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        }

    def polluted(self, num_tokens: int) -> bool:
        r = self.resolved
        return bool(
            self.fault.get("pollute", True)
            and r["cudagraph_mode"] != "NONE"
            and r["spec_k"] > 0
            and r["runner"] in self.fault.get("polluting_runners", ["v1"])
            and r["max_capture_size"]
            and num_tokens <= r["max_capture_size"]
        )

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        length = len(token_ids)
        if self.fault.get("crash_at_length") == length:
            print(f"synthetic: injected crash at length {length}", file=sys.stderr, flush=True)
            os._exit(4)
        if self.fault.get("hang_at_length") == length:
            print(f"synthetic: injected hang at length {length}", file=sys.stderr, flush=True)
            time.sleep(10**6)
        if self.fault.get("delay_s"):
            time.sleep(self.fault["delay_s"])
        if any(not 0 <= t < VOCAB for t in token_ids):
            raise ValueError(f"synthetic engine: token ids must be bytes (0..{VOCAB - 1})")
        if self.polluted(length):
            rng = np.random.default_rng([self.seed, length, *token_ids[:8]])
            return (-rng.uniform(10.0, 16.0, size=length - 1)).tolist()
        return bigram_logprobs(token_ids).tolist()

    def close(self) -> None:
        pass
