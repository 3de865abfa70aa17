"""What a vLLM build says about itself, run by that build's interpreter (stdlib + vllm only, no oneknob).

    python introspect.py describe              # every EngineArgs field and vllm.envs variable
    python introspect.py validate < spec.json  # vLLM's own config construction, no engine, no weights
    import_recorded()                               # `import vllm` in a process that will check and run
    validate_imported(spec, env)                    # validate, in that process, after import_recorded()

Prints ONE JSON object on stdout; vLLM's logs go to stderr (stdout is redirected while vLLM runs).

validate spec: {"env": {"VLLM_X": "1", ...}, "configs": [{LLM kwargs}, ...]}. `env` is applied before vLLM is
imported (vllm.envs and platform detection read it then), so one process validates many configurations of one
environment: the cost is `import vllm` (10-40 s), each configuration ~0.1 s. Each configuration goes through
`vllm.LLM(**kwargs)`'s own kwarg handling, stopped where it would start the engine (LLMEngine is swapped for a
stub), then `create_engine_config(usage_context)` as `LLMEngine.from_engine_args` would: what oneknob's worker
does, minus the engine. Result per configuration: {"ok": true, "resolved": {"<section>.<field>": value}} or
{"ok": false, "message": vLLM's text, "summary": its first line, "field": the EngineArgs field (or
"env.VLLM_X") it is about when that can be told, "did_you_mean": [...] for an unknown name}.

`flatten_vllm_config` is importable without vLLM (the plugin flattens the worker's own config with it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import gc
import json
import math
import os
import re
import sys
from typing import Any

SUMMARIZED = {  # huge or recursive objects: their class only
    "hf_config", "hf_text_config", "hf_image_processor_config", "draft_model_config", "target_model_config",
    "target_parallel_config", "draft_parallel_config", "static_forward_context", "static_all_moe_layers",
    "traced_files", "enabled_custom_ops", "disabled_custom_ops", "bs_to_padded_graph_size", "encoder_config",
    "multimodal_config", "pooler_config",
}
SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.I)
# Keys that differ between runs of one configuration (paths, ports, ids, compile caches) or that the engine
# fills in at start-up (KV sizing from memory profiling, custom-op counters): never part of a diff.
VOLATILE = (
    "model_config.model", "model_config.tokenizer", "model_config.served_model_name", "model_config.model_weights",
    "model_config.hf_config_path", "model_config.hf_config._name_or_path", "speculative_config.model",
    "speculative_config.draft_model_config*",
    "compilation_config.cache_dir", "compilation_config.local_cache_dir", "compilation_config.traced_files",
    "compilation_config.*compilation_time", "compilation_config.static_*", "compilation_config.*_custom_ops",
    "cache_config.num_gpu_blocks", "cache_config.num_cpu_blocks", "cache_config.kv_cache_memory_bytes",
    "cache_config.cpu_kvcache_space_bytes", "cache_config.kv_cache_size_tokens",
    "cache_config.kv_cache_max_concurrency",
    "cache_config.effective_attention_block_size", "cache_config.cache_hit_alignment_tokens",
    "cache_config.hash_block_size", "cache_config.kv_cache_layout",
    "parallel_config.*_port", "parallel_config.*_port_list", "parallel_config.*_ip", "parallel_config.rank",
    "parallel_config._api_process_*", "kv_transfer_config.engine_id", "vllm.instance_id",
    "env.VLLM_RPC_BASE_PATH", "env.VLLM_CACHE_ROOT", "env.VLLM_CONFIG_ROOT", "env.VLLM_ASSETS_CACHE",
    "env.VLLM_XLA_CACHE_PATH", "env.VLLM_MEDIA_CACHE", "env.VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME", "env.VLLM_HOST_IP",
    "env.VLLM_PORT", "env.VLLM_LOGGING_*", "env.VLLM_ALLOW_INSECURE_SERIALIZATION",
)


def stable(flat: dict[str, Any]) -> dict[str, Any]:
    """flat without the VOLATILE keys: what two runs of one configuration share."""
    import fnmatch

    return {k: v for k, v in flat.items() if not any(fnmatch.fnmatchcase(k, p) for p in VOLATILE)}


def jsonable(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device"):
        return str(value).replace("torch.", "")
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if depth < 6 and isinstance(value, dict) and len(value) <= 1024:
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if depth < 6 and isinstance(value, (list, tuple, set, frozenset)) and len(value) <= 1024:
        items = list(value)
        if isinstance(value, (set, frozenset)):
            with contextlib.suppress(TypeError):
                items = sorted(items)
        return [jsonable(v, depth + 1) for v in items]
    if depth < 6 and dataclasses.is_dataclass(value):
        return {f.name: jsonable(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value)}
    text = repr(value)
    return text if len(text) <= 200 and " at 0x" not in text else f"<{type(value).__qualname__}>"


def _flatten_into(out: dict[str, Any], prefix: str, obj: Any, depth: int) -> None:
    for f in dataclasses.fields(obj):
        key = f"{prefix}.{f.name}"
        try:
            value = getattr(obj, f.name)
        except Exception as exc:  # a property-like field that raises
            out[key] = f"<error {type(exc).__name__}>"
            continue
        if f.name in SUMMARIZED and value is not None:
            out[key] = f"<{type(value).__qualname__}>"
            if f.name == "hf_config" and hasattr(value, "to_dict"):  # the model's config as vLLM holds it (after
                out |= _config_fields(key, value)  # hf_overrides): its scalar fields, model_config.hf_config.<path>
        elif dataclasses.is_dataclass(value) and not isinstance(value, type) and depth < 4:
            _flatten_into(out, key, value, depth + 1)
        else:
            out[key] = jsonable(value)


def _config_fields(prefix: str, config: Any) -> dict[str, Any]:
    """A transformers config's scalar fields (nested mappings dotted), as `{prefix}.<path>`."""
    out: dict[str, Any] = {}

    def walk(node: Any, path: str, depth: int) -> None:
        for name, value in node.items():
            if isinstance(value, dict) and depth < 3:
                walk(value, f"{path}.{name}", depth + 1)
            elif value is None or isinstance(value, (bool, int, float, str)):
                out[f"{path}.{name}"] = jsonable(value)

    try:
        walk(config.to_dict(), prefix, 0)
    except Exception as exc:  # a read-back that fails must not fail the job
        out[f"{prefix}.error"] = f"<error {type(exc).__name__}>"
    return out


def flatten_vllm_config(vllm_config: Any, env: bool = True) -> dict[str, Any]:
    """Every field of every section of a VllmConfig: {"<section>.<field>": value}, nested configs dotted
    further (compilation_config.pass_config.x), VllmConfig's own scalars under "vllm.", and with `env` the
    VLLM_* variables as vllm.envs reads them now under "env."."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(vllm_config):
        value = getattr(vllm_config, f.name, None)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _flatten_into(out, f.name, value, 1)
        else:
            out[f"vllm.{f.name}"] = jsonable(value)
    if env:
        import vllm.envs as envs

        for name, getter in envs.environment_variables.items():
            if name.startswith("VLLM_"):
                try:
                    out[f"env.{name}"] = ("<set>" if os.environ.get(name) else None) if SECRET.search(name) \
                        else jsonable(getter())
                except Exception as exc:  # an invalid value: reported, not raised
                    out[f"env.{name}"] = f"<error {type(exc).__name__}: {exc}>"
    return dict(sorted(out.items()))


def _versions():
    """oneknob.engines.vllm.standalone.versions (stdlib only), loaded from its file beside this one: this script
    runs in a build's interpreter, where oneknob may not be importable."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_oneknob_vllm_versions", os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "versions.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- describe ------------------------------------------------------------------------------------

def _helps() -> dict[str, str]:
    """EngineArgs field -> help text, from vLLM's own argparse (help is computed only when NEEDS_HELP)."""
    from vllm.engine import arg_utils

    FlexibleArgumentParser = _versions().load("argparse")  # where this release defines it
    saved = getattr(arg_utils, "NEEDS_HELP", False)
    try:
        arg_utils.NEEDS_HELP = True
        with contextlib.suppress(AttributeError):
            arg_utils._compute_kwargs.cache_clear()
        parser = arg_utils.EngineArgs.add_cli_args(FlexibleArgumentParser(prog="vllm"))
        return {a.dest: " ".join((a.help or "").replace("%%", "%").split()) for a in parser._actions
                if a.dest and a.help and a.help != "==SUPPRESS=="}
    except Exception:  # help texts are a courtesy
        return {}
    finally:
        arg_utils.NEEDS_HELP = saved
        with contextlib.suppress(AttributeError):
            arg_utils._compute_kwargs.cache_clear()


def _default(f: dataclasses.Field) -> Any:
    value = f.default
    if value is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        with contextlib.suppress(Exception):
            value = f.default_factory()
    if type(value).__name__ == "FieldInfo":  # pydantic.Field(...)
        value = getattr(value, "default", None)
    return None if value is dataclasses.MISSING else jsonable(value)


def describe() -> dict[str, Any]:
    import vllm
    import vllm.envs as envs
    from vllm.engine.arg_utils import EngineArgs

    helps = _helps()
    fields = [{"name": f.name, "type": f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type)),
               "default": _default(f), "help": helps.get(f.name, "")}
              for f in dataclasses.fields(EngineArgs) if f.init]
    variables = []
    for name, getter in envs.environment_variables.items():
        saved = dict(os.environ)
        os.environ.pop(name, None)
        try:
            default = None if SECRET.search(name) else jsonable(getter())
        except Exception as exc:
            default = f"<error {type(exc).__name__}>"
        finally:  # some getters export what they made (a uuid)
            os.environ.clear()
            os.environ.update(saved)
        variables.append({"name": name, "default": default})
    return {"ok": True, "vllm_version": vllm.__version__, "engine_args": fields, "env": variables}


# -- validate ------------------------------------------------------------------------------------

class _Stop(Exception):
    def __init__(self, engine_args: Any, usage_context: Any) -> None:
        super().__init__("engine start intercepted")
        self.engine_args, self.usage_context = engine_args, usage_context


def _through_llm(kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """vllm.LLM(**kwargs)'s own handling up to the engine start: (EngineArgs, usage context)."""
    from vllm.entrypoints import llm as llm_module

    class Stub:
        @classmethod
        def from_engine_args(cls, engine_args, usage_context=None, **_):
            raise _Stop(engine_args, usage_context)

    original, llm_module.LLMEngine = llm_module.LLMEngine, Stub
    try:
        llm_module.LLM(**kwargs)
    except _Stop as stop:
        return stop.engine_args, stop.usage_context
    finally:
        llm_module.LLMEngine = original
    raise RuntimeError("vllm.LLM(...) returned without starting its engine")


_CLASS_TO_KWARG = {"SpeculativeConfig": "speculative_config", "CompilationConfig": "compilation_config",
                   "AttentionConfig": "attention_config", "PassConfig": "compilation_config.pass_config",
                   "KVTransferConfig": "kv_transfer_config", "StructuredOutputsConfig": "structured_outputs_config"}


def _field_of(exc: BaseException, kwargs: dict[str, Any], names: list[str], env: dict[str, Any]) -> dict[str, Any]:
    """Which kwarg (or variable) vLLM's error is about, as far as its text and pydantic's loc say."""
    message = str(exc)
    if isinstance(exc, TypeError) and (m := re.search(r"unexpected keyword argument '([^']+)'", message)):
        return {"field": m.group(1), "did_you_mean": difflib.get_close_matches(m.group(1), names, n=3, cutoff=0.6)}
    if m := re.search(r"Field '([^']+)' not found in (\w+)", message):
        section = _CLASS_TO_KWARG.get(m.group(2))
        return {"field": f"{section}.{m.group(1)}" if section else m.group(1)}
    errors = []
    if type(exc).__name__ == "ValidationError" and callable(getattr(exc, "errors", None)):
        with contextlib.suppress(Exception):
            errors = exc.errors()
        section = _CLASS_TO_KWARG.get(getattr(exc, "title", ""))
        loc = [str(p) for p in (errors[0].get("loc") or ())] if errors else []
        if section and loc:
            return {"field": ".".join([section, *loc]), "summary": errors[0].get("msg")}
        if section:
            return {"field": section, "summary": errors[0].get("msg") if errors else None}
        if loc and loc[0] in names:
            return {"field": loc[0], "summary": errors[0].get("msg")}
    for name in env:  # a variable whose value vLLM's own check names (0.34.0's validate_environ: VLLM_X=0 is ...)
        if re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", message):
            return {"field": f"env.{name}", "summary": None}
    import vllm.envs as envs

    for name in env:  # a variable vLLM cannot read
        with contextlib.suppress(KeyError):
            try:
                envs.environment_variables[name]()
            except Exception:
                return {"field": f"env.{name}", "summary": errors[0].get("msg") if errors else None}
    words = " ".join(e.get("msg") or "" for e in errors) if errors else message  # vLLM's words, not the input repr
    named = sorted((words.find(n), n) for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?!\w)", words))
    given = [n for _, n in named if n in kwargs]
    field = (given or [n for _, n in named] or [None])[0]
    return {"field": field, "summary": errors[0].get("msg") if errors else None}


class _Reads:
    """What a check depended on: the environment variables vLLM's code read (os.environ / os.getenv; an
    iteration of the whole environment by vLLM's own code counts as reading all of it: tqdm's, networkx's and
    the standard library's prefix scans at import do not), and, with `watch` (files relative to the folder
    holding vllm/), those of them it opened, imported, or discovered by listing their folder outside the import
    system (which lists a package's folder only to find a name it was asked for: the import event says which),
    and whether it started a Python process (whose reads are not seen here)."""

    SPAWN = ("subprocess.Popen", "os.posix_spawn", "os.spawn", "os.exec", "os.system")

    def __init__(self, watch: list[str], site: str | None) -> None:
        self.names: set[str] = set()
        self.everything = False
        self.watch, self.site, self.hit, self.spawned = set(watch), site, set(), False

    def _ours(self, filename: str) -> bool:
        return bool(self.site) and filename.startswith(os.path.join(self.site, "vllm") + os.sep)

    def _by_vllm(self) -> bool:
        """Whether the environment is being read by vLLM's own code (the first caller outside os and
        collections.abc): its variables mean something to vLLM alone (tqdm, networkx and the standard library
        copy or scan the whole environment at import, for prefixes of their own)."""
        frame = sys._getframe(2)
        while frame and frame.f_code.co_filename in (os.__file__, "<frozen os>", "<frozen _collections_abc>"):
            frame = frame.f_back
        return frame is not None and self._ours(frame.f_code.co_filename)

    def environ(self):
        reads, cls = self, type(os.environ)

        class Recording(cls):
            def __getitem__(self, key):
                if reads._by_vllm():
                    reads.names.add(os.fsdecode(key) if isinstance(key, (str, bytes)) else str(key))
                return super().__getitem__(key)

            def __iter__(self):
                reads.everything = reads.everything or reads._by_vllm()
                return super().__iter__()
        return _swap_class(os.environ, Recording)

    def audit(self, event: str, args: tuple) -> None:
        if event in self.SPAWN:
            words = [os.fsdecode(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            words += [os.fsdecode(a) for a in (args[1] if len(args) > 1 and isinstance(args[1], (list, tuple))
                                               else ()) if isinstance(a, (str, bytes, os.PathLike))][:1]
            self.spawned |= any("python" in os.path.basename(w) or w == sys.executable or "python" in w
                                for w in words) or not words
            return
        if not self.watch or not self.site:
            return
        if event == "import" and isinstance(args[0], str) and args[0].split(".")[0] == "vllm":
            base = args[0].replace(".", "/")
            self.hit |= self.watch & {f"{base}.py", f"{base}/__init__.py"}
        elif event in ("open", "os.listdir", "os.scandir") and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(args[0]))
            if not path.startswith(self.site + os.sep):
                return
            rel = path[len(self.site) + 1:]
            if event == "open":
                if "/__pycache__/" in rel and rel.endswith(".pyc"):  # the source's compiled twin
                    folder, _, name = rel.rpartition("/__pycache__/")
                    rel = f"{folder}/{name.split('.')[0]}.py"
                self.hit |= self.watch & {rel}
            elif sys._getframe(1).f_code.co_name != "_fill_cache":  # not the import system's own listing
                self.hit |= {w for w in self.watch if w.rpartition("/")[0] == rel}


@contextlib.contextmanager
def _swap_class(obj: Any, cls: type):
    saved, obj.__class__ = obj.__class__, cls
    try:
        yield
    finally:
        obj.__class__ = saved


def _effective(env: dict[str, Any], ambient: dict[str, str]) -> dict[str, str]:
    out = dict(ambient)
    for name, value in env.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = str(value)
    return out


def _against(imported: dict[str, str], target: dict[str, str], read, everything: bool) -> tuple[dict, list[str]]:
    """A group's environment `target` against the one vLLM was imported with: the changes a fork makes (name ->
    value, None to unset), and those of them that make the import stale (a variable the import read, or every
    one if it read the whole environment; one not VLLM_*, which C code may read at load)."""
    differ = sorted(k for k in set(target) | set(imported) if target.get(k) != imported.get(k))
    stale = [k for k in differ if everything or k in read or not k.startswith("VLLM_")]
    return {k: target.get(k) for k in differ}, stale


def _set_environ(target: dict[str, str]) -> None:
    for name in [k for k in os.environ if k not in target]:
        del os.environ[name]
    for name, value in target.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _check(configs: list[dict], names: list[str], env: dict[str, Any]) -> list[dict[str, Any]]:
    results = []
    for kwargs in configs:
        try:
            engine_args, usage_context = _through_llm(dict(kwargs))
            config = engine_args.create_engine_config(usage_context=usage_context)
            results.append({"ok": True, "resolved": flatten_vllm_config(config)})
        except Exception as exc:  # every vLLM refusal is a result
            report = {"ok": False, "error_type": type(exc).__name__, "message": str(exc)}
            with contextlib.suppress(Exception):
                report |= _field_of(exc, kwargs, names, env)
            results.append(report)
    return results


def _in_child(work) -> dict[str, Any]:
    """work() in a forked copy of this process (vLLM imported once, its state never shared between groups)."""
    read_fd, write_fd = os.pipe()
    gc.freeze()  # vLLM's objects: the child's collections skip them (as oneknob.run.worker's host, before it forks)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            payload = json.dumps(work(), default=repr).encode()
        except BaseException as exc:  # noqa: BLE001 (the child must always answer and exit)
            payload = json.dumps({"failed": f"{type(exc).__name__}: {exc}"}).encode()
        with os.fdopen(write_fd, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return {"failed": f"the check's child process ended with status {status} and no answer"}
    return json.loads(data)


def validate(spec: dict[str, Any]) -> dict[str, Any]:
    """Every group's configurations, after ONE `import vllm`. The import runs with the first group's
    environment; each group is then checked in a forked copy of the process with its own environment set, unless
    it differs from the import's in a variable the import read (or one not VLLM_*, which C code may read):
    such a group comes back as {"redo": [variables]} for a process of its own. `watch` (files relative to the
    folder holding vllm/): per group, those the check opened, imported or listed the folder of ("read"), and
    whether it started a process ("spawned"): a patched copy that touches none of them runs the same code."""
    groups = spec.get("groups")
    if groups is None:  # one environment (the spec's older form)
        groups = [{"env": spec.get("env") or {}, "configs": spec.get("configs") or []}]
    ambient = dict(os.environ)
    first = _effective(groups[0]["env"], ambient)
    _set_environ(first)
    import importlib.util

    origin = importlib.util.find_spec("vllm").origin
    reads = _Reads(spec.get("watch") or [], os.path.dirname(os.path.dirname(origin)) if origin else None)
    sys.addaudithook(reads.audit)
    with reads.environ():
        import vllm
        import vllm.entrypoints.llm  # noqa: F401 (the expensive import, once for every configuration)
        from vllm.engine.arg_utils import EngineArgs

    names = [f.name for f in dataclasses.fields(EngineArgs)]
    imported_hit, imported_spawn = set(reads.hit), reads.spawned
    out = []
    for group in groups:
        target = _effective(group["env"], ambient)
        _, stale = _against(first, target, reads.names, reads.everything)
        if stale:
            out.append({"redo": stale})
            continue

        def work(group=group, target=target):
            _set_environ(target)
            reads.hit, reads.spawned = set(imported_hit), imported_spawn
            results = _check(group.get("configs") or [], names, group["env"])
            return {"results": results, "read": sorted(reads.hit), "spawned": reads.spawned}
        out.append(work() if len(groups) == 1 else _in_child(work))
    return {"ok": True, "vllm_version": vllm.__version__, "groups": out,
            "import_read_env": sorted(reads.names) if not reads.everything else ["*"]}


# What the import of vLLM in this process saw (import_recorded): the environment, and which of its variables
# vLLM's own code read ("everything": it iterated the whole environment, or the import was not recorded).
_imported: dict[str, Any] | None = None


def import_recorded() -> None:
    """`import vllm.entrypoints.llm` (the offline entry point), recording the environment it ran with and the
    variables vLLM's code read meanwhile, as validate() does: validate_imported() then knows which environments
    a fork of this process may check without importing vLLM again. A process that imported vLLM before this
    (unrecorded) counts as having read everything."""
    global _imported
    if _imported is not None:
        return
    seen, before = dict(os.environ), "vllm" in sys.modules
    import importlib.util

    origin = importlib.util.find_spec("vllm").origin
    reads = _Reads([], os.path.dirname(os.path.dirname(origin)) if origin else None)
    with reads.environ():
        import vllm.entrypoints.llm  # noqa: F401
    _imported = {"env": seen, "read": sorted(reads.names), "everything": before or reads.everything}


def _seen() -> dict[str, Any]:
    """What this process's import of vLLM saw (import_recorded); an unrecorded import read everything."""
    return _imported or {"env": dict(os.environ), "read": [], "everything": True}


def import_stale(target: dict[str, str]) -> list[str]:
    """The variables of the environment `target` that differ from the one vLLM was imported with in this process
    and that the import read (import_recorded; every one that differs where the import was not recorded): a
    process with `target` would import vLLM otherwise."""
    seen = _seen()
    return _against(seen["env"], target, seen["read"], seen["everything"])[1]


def validate_imported(spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """validate() of the spec's groups in a process that imported vLLM already (oneknob's prepared worker: vLLM
    imported once for the check and the engine, import_recorded()). Each group is checked in a forked copy, so
    nothing it builds or loads (vLLM's plugins) stays in the process that then starts the engine. A group's
    environment is the import's, less the spec's "unset" variables (those the knobs own), with the group's
    `env` applied; one that differs from the import's in a variable the import read (or one not VLLM_*, which C
    code may read) comes back as {"redo": [variables]}, for a process of its own, as in validate(). `env` (the
    process's own: HF_HUB_OFFLINE for a local checkpoint) is set in every fork, as the worker sets it for its
    engine. Nothing is watched (no "read"): a patched copy shares no check done this way."""
    import vllm
    from vllm.engine.arg_utils import EngineArgs

    if spec.get("watch"):
        raise ValueError("a check that watches files needs a process of its own (validate)")
    seen = _seen()
    unset = set(spec.get("unset") or ())
    base = {k: v for k, v in seen["env"].items() if k not in unset}
    names = [f.name for f in dataclasses.fields(EngineArgs)]
    out = []
    for group in spec["groups"]:
        changes, stale = _against(seen["env"], _effective(group["env"], base), seen["read"], seen["everything"])
        if stale:
            out.append({"redo": stale})
            continue

        def work(group=group, changes=changes):
            _set_environ({**_effective(changes, dict(os.environ)), **env})
            return {"results": _check(group.get("configs") or [], names, group["env"]), "read": [],
                    "spawned": False}
        out.append(_in_child(work))
    return {"ok": True, "vllm_version": vllm.__version__, "groups": out}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("describe", "validate"):
        print(json.dumps({"ok": False, "message": "usage: introspect.py describe | validate < spec.json"}))
        return 2
    real_stdout = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):  # vLLM logs to stdout by default
            result = describe() if argv[0] == "describe" else validate(json.loads(sys.stdin.read() or "{}"))
    except Exception as exc:  # the script itself failed: still one JSON object
        result = {"ok": False, "message": f"{type(exc).__name__}: {exc}"}
    real_stdout.write(json.dumps(result, default=repr) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
