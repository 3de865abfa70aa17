"""oneknob's vLLM plugin (src/oneknob/engines/vllm/plugin.py) inside vLLM's own processes, and the #53520 fix patch.

Three real engines (vLLM's CPU build, tiny MTP model), each started once in its
own process (this file run as a script) and reused for every length, all K = 3
with capture 256:
  plain        no emulation (the CPU build runs no CUDA graph)
  plain-fixed  the same, with patches/fix-53520-protect-prompt-hidden-states.diff
               applied to a symlinked copy of the installed vLLM on PYTHONPATH
  emulated     CUDA-graph emulation on, in vLLM's default multiprocessing (the
               plugin in vLLM's own worker process, not the frontend's)
The two plain engines run their engine core in the script's process
(VLLM_ENABLE_V1_MULTIPROCESSING=0): half the start, and the same plugin path.
The emulation's boundaries against a reference and the fix under emulation are
measured through the CLI in test_vllm_cli.py.
Each engine also cross-checks the plugin's report against the worker, read
through `collective_rpc` (a test-only oracle; it needs
VLLM_ALLOW_INSECURE_SERIALIZATION, which the plugin itself does not).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCH = ROOT / "patches" / "fix-53520-protect-prompt-hidden-states.diff"
LENGTHS = (256, 257)
# oneknob's verdict: polluted when |NLL - NLL_ref| > 0.1 nats and > 5 % of NLL_ref.
TOL_NLL, RTOL_NLL = 0.1, 0.05

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


def polluted(nll: float, ref: float) -> bool:
    return abs(nll - ref) > TOL_NLL and abs(nll - ref) > RTOL_NLL * abs(ref)


# ---------------------------------------------------------------------------
# fast: no engine


def test_register_is_a_noop_without_the_env_var(monkeypatch):
    import oneknob.engines.vllm.plugin as plugin

    monkeypatch.delenv(plugin.ENV, raising=False)
    monkeypatch.setattr(plugin, "_settings", None)
    monkeypatch.setattr(plugin, "_finder", None)
    meta_path = list(sys.meta_path)
    worker_modules = {name: sys.modules.get(name) for name in plugin.WORKER_CLASSES}
    plugin.register()
    plugin.register()
    assert sys.meta_path == meta_path
    assert plugin._settings is None and plugin._finder is None
    assert {name: sys.modules.get(name) for name in plugin.WORKER_CLASSES} == worker_modules
    for name, cls_name in plugin.WORKER_CLASSES.items():  # never wraps a class already imported
        module = sys.modules.get(name)
        if module is not None:
            assert not getattr(getattr(module, cls_name).compile_or_warm_up_model, "_oneknob_wrapped", False)
    monkeypatch.setenv(plugin.ENV, "  ")
    plugin.register()
    assert sys.meta_path == meta_path


def test_settings_are_validated(monkeypatch):
    import oneknob.engines.vllm.plugin as plugin

    monkeypatch.setenv(plugin.ENV, json.dumps({"report": "/tmp/r.json", "emulate_cuda_graphs": True}))
    assert plugin.settings() == {"report": "/tmp/r.json", "emulate_cuda_graphs": True, "steps": None}
    for bad in ("{", "[]", '{"report": "relative.json"}', '{"emulate_cuda_graphs": "yes"}', '{"reprot": "/x"}'):
        monkeypatch.setenv(plugin.ENV, bad)
        with pytest.raises(ValueError, match=plugin.ENV):
            plugin.settings()


def test_emulated_graphs_follow_vllm_resolution():
    from oneknob.engines.vllm.graph_pool import emulated_graphs

    base = {"enforce_eager": False, "spec_k": 3, "max_num_seqs": 128, "max_num_batched_tokens": 2048, "runner": "v1"}
    assert emulated_graphs(base, None)["max_capture_size"] == 512
    assert emulated_graphs(base, 256)["max_capture_size"] == 256
    assert emulated_graphs(base, 300)["max_capture_size"] == 288  # grid truncation
    assert emulated_graphs({**base, "spec_k": 0}, None)["max_capture_size"] == 256
    assert emulated_graphs({**base, "spec_k": 2}, None)["max_capture_size"] == 498  # V1 rounds to K+1
    assert emulated_graphs({**base, "spec_k": 2, "runner": "v2"}, None)["max_capture_size"] == 512
    assert emulated_graphs({**base, "max_num_batched_tokens": 300}, None)["max_capture_size"] == 300
    eager = emulated_graphs({**base, "enforce_eager": True}, 256)
    assert eager == {"max_capture_size": 0, "capture_sizes": [], "cudagraph_mode": "NONE", "cudagraph_emulated": True}


def test_graph_pool_places_small_outputs_only():
    torch = pytest.importorskip("torch")
    from oneknob.engines.vllm.graph_pool import GraphPool

    pool = GraphPool(4, 3, torch.float32, torch.device("cpu"))
    small, large = torch.ones(4, 3), torch.ones(5, 3)
    placed = pool.place(small, "target")
    assert placed.data_ptr() == pool.buffer.data_ptr() and torch.equal(placed, small)
    assert pool.place(large, "drafter") is large
    with torch.inference_mode():  # as in vLLM's runner
        other = pool.place(torch.full((2, 3), 7.0), "drafter")  # the drafter overwrites the target's rows
    assert torch.equal(placed[:2], other) and torch.equal(placed[2:], small[2:])
    assert pool.placed == {"target": 1, "drafter": 1} and pool.passed == {"target": 0, "drafter": 1}


# ---------------------------------------------------------------------------
# slow: the real engine, one process per configuration


def symlinked_patched_vllm(root: Path, patch: Path) -> Path:
    """`root/vllm`: symlinks to the installed vllm's files, the patched file a real copy."""
    src = Path(importlib.util.find_spec("vllm").origin).parent
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        out = root / "vllm" / Path(dirpath).relative_to(src)
        out.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            (out / name).symlink_to(Path(dirpath) / name)
    target = root / "vllm" / "v1" / "worker" / "gpu_model_runner.py"
    target.unlink()
    shutil.copyfile(src / "v1" / "worker" / "gpu_model_runner.py", target)
    subprocess.run(["patch", "-p1", "-s", "-i", str(patch)], cwd=root, check=True)
    return root


def run_engine(name: str, config: dict, tmp: Path, pythonpath: str | None = None, timeout: float = 900) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    result = tmp / "result.json"
    config = {**config, "report": str(tmp / "report.json"), "result": str(result)}
    env = {**os.environ, "VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if config.get("in_process") else "1"}
    env.pop("ONEKNOB_VLLM_PLUGIN", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, __file__, json.dumps(config)], env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0 or not result.exists():
        raise AssertionError(
            f"engine {name} failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return json.loads(result.read_text())


@pytest.fixture(scope="module")
def tiny_mtp_model() -> Path:
    from oneknob.provision import tiny_model

    return tiny_model.ensure(ROOT / "models" / "tiny-mtp")


@pytest.fixture(scope="module")
def engines(tiny_mtp_model, tmp_path_factory):
    """Each configuration's result, its engine started on first use and only once."""
    base = {"model": str(tiny_mtp_model), "lengths": list(LENGTHS)}
    configs = {  # the CLI tests (test_vllm_cli.py) measure the emulation's boundaries against a reference
        "plain": {**base, "k": 3, "capture": 256, "eager": False, "emulate": False, "in_process": True},
        "plain-fixed": {**base, "k": 3, "capture": 256, "eager": False, "emulate": False, "patched": True,
                        "in_process": True},
        "emulated": {**base, "k": 3, "capture": 256, "eager": False, "emulate": True},
    }
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            tmp = tmp_path_factory.mktemp(name)
            pythonpath = None
            if configs[name].get("patched"):
                pythonpath = str(symlinked_patched_vllm(tmp / "patched", PATCH))
            cache[name] = run_engine(name, configs[name], tmp / "run", pythonpath)
        return cache[name]

    return get


same_worker = pytest.mark.xdist_group("vllm-plugin")  # on one worker in make test: `engines` starts each once


def check_report_matches_worker(result: dict) -> None:
    report, worker = result["report"], result["worker"]
    assert report is not None, "the plugin wrote no report"
    assert report["pid"] == worker["pid"]  # written by the worker process, in or out of the frontend's
    assert (worker["pid"] == result["frontend_pid"]) == result["in_process"]
    assert report["runner_class"] == worker["runner_class"]
    assert report["drafter_class"] == worker["drafter_class"]
    assert report["vllm_version"] == worker["vllm_version"]
    actual = worker["resolved"]
    resolved = report["resolved"]
    for key in ("max_num_seqs", "max_num_batched_tokens", "spec_method", "spec_k", "enforce_eager", "platform"):
        assert resolved[key] == actual[key], key
    assert resolved["runner"] == actual["runner"] == "v1"
    emulation = report["emulation"]
    graph_fields = ("max_capture_size", "capture_sizes", "cudagraph_mode")
    if emulation is None:
        assert {key: resolved[key] for key in graph_fields} == {key: actual[key] for key in graph_fields}
        assert resolved["cudagraph_emulated"] is False
    else:
        assert emulation["actual"] == {key: actual[key] for key in graph_fields}
        assert resolved["cudagraph_emulated"] is True


@pytest.mark.parametrize("name", ["plain", "plain-fixed", "emulated"])
@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
@same_worker
def test_report_equals_what_the_worker_holds(engines, name):
    result = engines(name)
    check_report_matches_worker(result)
    resolved = result["report"]["resolved"]
    assert resolved["platform"] == "cpu" and result["report"]["drafter_class"] == "EagleProposer"
    if name != "emulated":
        assert result["report"]["emulation"] is None
        assert resolved["cudagraph_mode"] == "NONE" and resolved["capture_sizes"] == []
        assert resolved["max_capture_size"] == 256  # the CPU build keeps an explicit maximum, and runs no graph
    else:
        emulation = result["report"]["emulation"]
        assert resolved["cudagraph_mode"] == "FULL_AND_PIECEWISE"
        assert resolved["max_capture_size"] == 256 == resolved["capture_sizes"][-1]
        assert result["worker"]["resolved"]["cudagraph_mode"] == "NONE"  # the CPU build itself runs no graphs
        assert emulation["active"] is True
        assert emulation["pool"]["shape"] == [256, 128] and emulation["pool"]["dtype"] == "float32"
        assert emulation["target_class"] == "MiMoForCausalLM" and emulation["drafter_model_class"] == "MiMoMTP"
        assert result["worker"]["pool_counts"]["placed"]["drafter"] > 0


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
@same_worker
def test_emulated_capture_256_pollutes_up_to_256_and_leaves_257_bit_identical(engines):
    plain, emulated = engines("plain")["nll"], engines("emulated")["nll"]
    assert polluted(emulated["256"], plain["256"]) and emulated["256"] > plain["256"], (emulated, plain)
    assert emulated["257"] == plain["257"]  # a step above the capture size runs exactly as without emulation


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
@same_worker
def test_without_emulation_the_fix_patch_changes_nothing(engines):
    plain, fixed = engines("plain"), engines("plain-fixed")
    assert "patched" in fixed_runner_file(fixed) and "patched" not in fixed_runner_file(plain)
    assert fixed["nll"] == plain["nll"]  # bit-identical at every length


def fixed_runner_file(result: dict) -> str:
    return result["worker"]["gpu_model_runner_file"]


# ---------------------------------------------------------------------------
# the engine process: `python tests/vllm/test_vllm_plugin.py '<config json>'`


def _worker_view(worker) -> dict:
    """Runs in vLLM's worker process (collective_rpc); read straight from the worker, not via the plugin."""
    import os as _os

    import vllm as _vllm
    import vllm.v1.worker.gpu_model_runner as _gmr

    config = worker.vllm_config
    runner = worker.model_runner
    cls = getattr(runner, "_oneknob_original_class", None) or type(runner)
    drafter = getattr(runner, "drafter", None)
    spec = config.speculative_config
    mode = config.compilation_config.cudagraph_mode
    graph_pool = sys.modules.get("oneknob.engines.vllm.graph_pool")
    return {
        "pid": _os.getpid(),
        "vllm_version": _vllm.__version__,
        "runner_class": f"{cls.__module__}.{cls.__qualname__}",
        "drafter_class": type(drafter).__name__ if drafter is not None else None,
        "gpu_model_runner_file": _gmr.__file__,
        "pool_counts": graph_pool.pool_counts() if graph_pool is not None else None,
        "resolved": {
            "max_capture_size": config.compilation_config.max_cudagraph_capture_size,
            "capture_sizes": list(config.compilation_config.cudagraph_capture_sizes or []),
            "cudagraph_mode": getattr(mode, "name", str(mode)),
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "spec_method": spec.method if spec is not None else None,
            "spec_k": spec.num_speculative_tokens if spec is not None else 0,
            "enforce_eager": bool(config.model_config.enforce_eager),
            "runner": "v2" if cls.__module__.startswith(("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")) else "v1",
            "platform": "cpu",
        },
    }


def _prompt(model: str, length: int) -> list[int]:
    from tokenizers import Tokenizer

    from oneknob.provision import tiny_model

    tok = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    for path in tiny_model.stdlib_corpus_files():
        ids = tok.encode(path.read_text(encoding="utf-8", errors="replace")).ids
        if len(ids) >= length:
            return ids[:length]
    raise RuntimeError(f"no corpus file has {length} tokens")


def _engine_main(config: dict) -> None:
    plugin = {"report": config["report"], "emulate_cuda_graphs": config["emulate"]}
    os.environ["ONEKNOB_VLLM_PLUGIN"] = json.dumps(plugin)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = {
        "model": config["model"],
        "dtype": "float32",
        "max_model_len": 2048,
        "gpu_memory_utilization": 0.2,
        "max_num_seqs": 128,
        "max_num_batched_tokens": 2048,
        "seed": 0,
        "enforce_eager": config["eager"],
    }
    if config["k"]:
        kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": config["k"]}
    if config["capture"] is not None:
        kwargs["compilation_config"] = {"max_cudagraph_capture_size": config["capture"]}
    llm = LLM(**kwargs)
    ids = _prompt(config["model"], max(config["lengths"]))
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    nll = {}
    for length in config["lengths"]:  # one prompt per request: the step's token count is the length
        prompt = ids[:length]
        (out,) = llm.generate(TokensPrompt(prompt_token_ids=prompt), params, use_tqdm=False)
        logprobs = [out.prompt_logprobs[i][prompt[i]].logprob for i in range(1, length)]
        nll[str(length)] = -sum(logprobs) / len(logprobs)
    worker = llm.collective_rpc(_worker_view, timeout=120)[0]
    report = json.loads(Path(config["report"]).read_text()) if Path(config["report"]).exists() else None
    result = {"nll": nll, "report": report, "worker": worker, "frontend_pid": os.getpid(),
              "in_process": bool(config.get("in_process"))}
    Path(config["result"]).write_text(json.dumps(result, indent=1))
    llm.llm_engine.engine_core.shutdown()  # reap the engine core and its worker before leaving
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # vLLM's interpreter teardown is slow and sometimes noisy; the result is written


if __name__ == "__main__":
    _engine_main(json.loads(sys.argv[1]))


def test_steps_are_recorded_from_the_scheduler_output_before_each_step(tmp_path):
    import oneknob.engines.vllm.plugin as plugin

    class Output:  # the two fields of vLLM's SchedulerOutput the plugin reads
        def __init__(self, scheduled):
            self.num_scheduled_tokens, self.total_num_scheduled_tokens = scheduled, sum(scheduled.values())

    class Runner:
        def execute_model(self, scheduler_output, intermediate_tensors=None):
            return scheduler_output.total_num_scheduled_tokens

    runner, path = Runner(), tmp_path / "steps.jsonl"
    plugin.record_steps(runner, str(path))
    plugin.record_steps(runner, str(path))  # idempotent: one line per step, not two
    assert runner.execute_model(Output({"0-ab12cd34": 200, "1-ef56ab78": 312})) == 512
    assert runner.execute_model(Output({})) == 0  # an empty step is not a step
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"total": 512, "scheduled": {"0-ab12cd34": 200, "1-ef56ab78": 312}}]
