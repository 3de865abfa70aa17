"""A reference from outside vLLM: the same checkpoint scored by Hugging Face transformers, eagerly.

Every verdict compares a configuration with a reference. With `reference_engine=transformers` that
reference is not vLLM at all, so a bug in the path every vLLM configuration shares (the prompt-logprob
gather, a dtype cast) shows too. transformers loads the checkpoint's body by its `model_type`; an MTP head
is not part of it (MiMo's `mtp_layers` are left unused), which is what a reference must be. One forward
pass over the prompt gives every position's logprobs; greedy continuations use `generate` without
sampling. Runs inside a worker process like any engine (oneknob.run.worker), on the GPU when there is one.

Measured on the tiny model: its per-length NLL agrees with vLLM's CPU build to within 6e-7 nats.
"""

from __future__ import annotations

import json
import os
import platform as _platform
import sys
from pathlib import Path
from typing import Any

from oneknob.config import model_override
from oneknob.errors import ConfigError

DTYPES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16",
          "half": "float16"}


def check_loadable(model_path: str, trust_remote_code: bool = False) -> str:
    """The model_type transformers loads the checkpoint as; ConfigError (before any engine) when it cannot. With
    model.trust_remote_code a model_type transformers lacks loads through the checkpoint's own class (its
    config.json's auto_map names one for AutoModelForCausalLM)."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        raise ConfigError(f"reference_engine=transformers: model.path={model_path} has no config.json here; "
                          "transformers can only score a checkpoint on this machine (use reference_engine=vllm)")
    data = json.loads(config.read_text())
    model_type = data.get("model_type")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and trust_remote_code \
            and "AutoModelForCausalLM" in (data.get("auto_map") or {}):
        return model_type
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        if (data.get("auto_map") or {}).get("AutoModelForCausalLM"):
            raise ConfigError(f"reference_engine=transformers: model.path={model_path} is model_type={model_type!r}, "
                              "which transformers loads only through the checkpoint's own code; set "
                              "model.trust_remote_code=true (it runs that code), or use reference_engine=vllm")
        raise ConfigError(f"reference_engine=transformers: model.path={model_path} is model_type={model_type!r}, "
                          "which transformers has no causal LM for; use reference_engine=vllm")
    return model_type


def dtype_name(model_dtype: str, reference_dtype: str | None) -> str:
    """reference_dtype when given, else the model's dtype ('auto' -> float32, the exact choice on CPU)."""
    wanted = reference_dtype or model_dtype
    return DTYPES.get(wanted, "float32")


class TransformersFacts:
    """Only what the orchestrator needs to start it as a reference: its interpreter (oneknob's own)."""

    name = "transformers"
    uses_model = True
    options = ("reference_dtype",)

    def interpreter(self, knob_values: dict[str, Any], builds_dir: str, log=print,
                    settings: dict | None = None) -> tuple[str, dict[str, str]]:
        return sys.executable, dict(os.environ)


class TransformersEngine:
    def __init__(self) -> None:
        self.model = None
        self.spec: dict[str, Any] = {}

    def start(self, spec: dict[str, Any]) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.spec = spec
        model = spec["model"]
        self.dtype = dtype_name(model.get("dtype", "auto"), (spec.get("options") or {}).get("reference_dtype"))
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(spec.get("seed", 0))
        # the job's model.override.<path> fields: the same config vLLM runs with (the reference judges that model)
        overrides = model_override.of(spec.get("knobs") or {})
        config = {"config": model_override.pretrained_config(model["path"], overrides)} if overrides else {}
        self.model = AutoModelForCausalLM.from_pretrained(
            model["path"], torch_dtype=getattr(torch, self.dtype), local_files_only=True,
            trust_remote_code=bool(model.get("trust_remote_code")), **config).to(self.device).eval()

    def resolved_config(self) -> dict[str, Any]:
        cls = type(self.model)
        overridden = {f"model_config.{path}": model_override.leaves(self.model.config.to_dict()).get(path)
                      for path in model_override.of(self.spec.get("knobs") or {})}  # what the model was built with
        return {"engine": "transformers", "model_class": f"{cls.__module__}.{cls.__qualname__}",
                "dtype": self.dtype, "platform": self.device, "enforce_eager": True, "spec_k": 0} | overridden

    def provenance(self) -> dict[str, Any]:
        import torch
        import transformers

        return {"engine": "transformers", "transformers": transformers.__version__, "torch": torch.__version__,
                "cuda": torch.version.cuda, "python": _platform.python_version(), "dtype": self.dtype,
                "device": torch.cuda.get_device_name(0) if self.device == "cuda" else self.device}

    def _logprobs(self, token_ids: list[int]):
        import torch

        with torch.no_grad():
            ids = torch.tensor([token_ids], device=self.device)
            logits = self.model(input_ids=ids).logits[0, :-1].float()
            return torch.log_softmax(logits, dim=-1)  # row i scores token i + 1

    def score(self, token_ids: list[int], topk: int = 0, greedy: int = 0) -> dict[str, Any]:
        """Logprob of each prompt token, the top-k per position, and a greedy continuation."""
        import torch

        table = self._logprobs(token_ids)
        targets = torch.tensor(token_ids[1:], device=table.device)
        result: dict[str, Any] = {"logprobs": table.gather(1, targets[:, None])[:, 0].tolist()}
        if topk:
            values, indices = table.topk(topk, dim=-1)
            result["topk"] = [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
        if greedy:
            with torch.no_grad():
                ids = torch.tensor([token_ids], device=self.device)
                out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=greedy,
                                          min_new_tokens=greedy, do_sample=False, pad_token_id=0,
                                          output_logits=True, return_dict_in_generate=True)
            result["greedy"] = out.sequences[0, len(token_ids):].tolist()
            # the raw logits of each step (min_new_tokens masks EOS only in the processed scores)
            result["greedy_logprobs"] = [float(torch.log_softmax(step[0].float(), dim=-1)[token])
                                         for step, token in zip(out.logits, result["greedy"])]
        return result

    def close(self) -> None:
        self.model = None
