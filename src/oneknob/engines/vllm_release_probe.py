"""Questions answered by a vLLM release's own Python code, in a process of its own (the standard library and that
release; never imported by oneknob):

    python -P vllm_release_probe.py SOURCE < questions.json     # one JSON line on stdout

SOURCE: a wheel (imported straight from the zip: a CUDA release reads here, on a CPU machine, as far as its Python
goes), a directory holding vllm/, or "" for this interpreter's own vLLM. Questions (oneknob.engines.vllm_release
asks them and keeps the answers):

  "environ": [{"VLLM_X": "0"}, ...]  each environment oneknob would set, through the release's own
      `Platform.validate_environ(hard_fail=False)` (what `EngineArgs.create_engine_config` calls first: vLLM
      0.34.0 vllm/engine/arg_utils.py:2294 -> vllm/platforms/interface.py:1476) -> "ok" or vLLM's message.
  "capture": [{"max_num_seqs", "spec_k", "max_num_batched_tokens", "max_capture", "capability": [9, 0]}, ...]
      the release's own `VllmConfig._set_cudagraph_sizes` (0.34.0 vllm/config/vllm.py:2322, 0.33.0 :2398) on a
      config holding only what it reads: the release's CompilationConfig in its -O2 graph mode
      (OPTIMIZATION_LEVEL_02), the scheduler's two numbers, a single-module MTP drafter of K tokens (no draft
      model's config: multi-module MTP and dynamic speculative decoding are not modelled) and the device's compute
      capability -> {"sizes", "max", "mode"} (and, where the release resolves prefill and decode graphs
      apart, as 0.34.0 does, "max_prefill" tokens and "max_decode_requests") or {"not_predicted": why}. The
      worker's own adjustment (V1's rounding, a backend's downgrade) happens later, on the GPU, and is not here.
  "defaults": ["gpu_memory_utilization", ...]  CacheConfig's own defaults (0.34.0 vllm/config/cache.py:216).
"""

from __future__ import annotations

import json
import os
import sys
import types


def _validate_environ(platform_cls, variables: dict[str, str]) -> str:
    saved = dict(os.environ)
    try:
        for name in [n for n in os.environ if n.startswith("VLLM_")]:
            del os.environ[name]
        os.environ.update(variables)
        platform_cls.validate_environ(False)
        return "ok"
    except ValueError as exc:
        return str(exc)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _capture(question: dict) -> dict:
    from vllm.config.compilation import CompilationConfig
    from vllm.config import vllm as vllm_config_module
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    major, minor = question.get("capability") or (9, 0)
    type(current_platform).get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(major, minor))
    level = getattr(vllm_config_module, "OPTIMIZATION_LEVEL_02", {}).get("compilation_config", {})
    compilation = CompilationConfig(max_cudagraph_capture_size=question.get("max_capture"))
    compilation.cudagraph_mode = level.get("cudagraph_mode", compilation.cudagraph_mode)
    config = object.__new__(vllm_config_module.VllmConfig)  # no __post_init__: only what the rule reads is set
    spec = None
    if question["spec_k"]:
        from vllm.config.speculative import SpeculativeConfig

        spec = object.__new__(SpeculativeConfig)
        object.__setattr__(spec, "method", "mtp")
        object.__setattr__(spec, "num_speculative_tokens", question["spec_k"])
    scheduler = types.SimpleNamespace(max_num_seqs=question["max_num_seqs"],
                                      max_num_batched_tokens=question["max_num_batched_tokens"])
    for name, value in {"model_config": types.SimpleNamespace(enforce_eager=False), "compilation_config": compilation,
                        "scheduler_config": scheduler, "speculative_config": spec, "performance_mode": "balanced",
                        "diffusion_config": None}.items():
        object.__setattr__(config, name, value)
    config._set_cudagraph_sizes()
    mode = compilation.cudagraph_mode
    split = {"max_prefill": getattr(compilation, "max_prefill_cudagraph_capture_tokens", None),
             "max_decode_requests": getattr(compilation, "max_decode_cudagraph_capture_requests", None)}
    return {"sizes": list(compilation.cudagraph_capture_sizes), "max": compilation.max_cudagraph_capture_size,
            "mode": getattr(mode, "name", str(mode))} | {k: v for k, v in split.items() if isinstance(v, int)}


def _default(name: str):
    from vllm.config.cache import CacheConfig

    field = CacheConfig.__dataclass_fields__[name]
    value = getattr(field.default, "default", field.default)  # a pydantic Field(...) holds its default inside
    return None if value is None else value if isinstance(value, (int, float, str, bool)) else repr(value)


def main() -> None:
    source = sys.argv[1] if len(sys.argv) > 1 else ""
    if source:
        sys.path.insert(0, source)
    questions = json.loads(sys.stdin.read() or "{}")
    answer: dict = {"ok": True}
    try:
        import vllm.envs  # noqa: F401  (the release's own list of variables, read by validate_environ)
        from vllm.platforms.interface import Platform

        answer["source"] = os.path.dirname(os.path.dirname(vllm.envs.__file__))
        answer["environ"] = [_validate_environ(Platform, dict(v)) for v in questions.get("environ", [])]
    except Exception as exc:  # a release whose Python does not import here: every question unanswered
        answer["environ"] = [{"not_predicted": f"{type(exc).__name__}: {exc}"[:400]}
                             for _ in questions.get("environ", [])]
    answer["capture"] = []
    for question in questions.get("capture", []):
        try:
            answer["capture"].append(_capture(question))
        except Exception as exc:
            answer["capture"].append({"not_predicted": f"{type(exc).__name__}: {exc}"[:400]})
    answer["defaults"] = {}
    for name in questions.get("defaults", []):
        try:
            answer["defaults"][name] = {"value": _default(name)}
        except Exception as exc:
            answer["defaults"][name] = {"not_predicted": f"{type(exc).__name__}: {exc}"[:400]}
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
