"""vLLM checks a plan before any engine starts: its own lists of names, and its own config construction.

Both run standalone/introspect.py in the interpreter of the build the job runs on (the `vllm.version` / `vllm.patch`
build, else this one), never in this process (vLLM is imported only by workers and these subprocesses):
  - `names(...)`: the build's EngineArgs fields and vllm.envs variables (describe), cached per build; an
    `engine_args.X` / `env.VLLM_X` knob the build does not know is refused with "did you mean".
  - `validate(...)`: every distinct configuration of a sweep through `LLM(**kwargs)`'s kwarg handling and
    `create_engine_config`, with the exact kwargs and environment the worker will use (VllmEngine.llm_kwargs),
    no weights, no engine; one subprocess per build and environment, results cached per configuration. What
    vLLM refuses is refused here under the oneknob key that set it, quoting vLLM.
Both caches have two levels: the study's paths.cache (vllm-describe/, vllm-validate/), then the machine's
(~/.cache/oneknob/vllm-checks/, oneknob.files.user_cache), which every study reads: vLLM's verdict on a
configuration is a fact about a build (its interpreter, versions and patch), the kwargs, the environment vLLM
reads and the model's fingerprint, all in the key; the worker's read-back stays the authority on what ran.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from oneknob.config import knobs, model_override
from oneknob.errors import ConfigError
from oneknob.files import replace_via_tmp, user_cache

SCRIPT = Path(__file__).parent / "standalone" / "introspect.py"
TIMEOUT_S = 600.0  # `import vllm` is 10-45 s on a loaded 2-core machine; a cold model-info cache adds ~25 s
# LLM(...) kwargs oneknob sets from its own settings (VllmEngine.llm_kwargs): the key a refusal names
SETTING_OF = {"model": "model.path", "dtype": "model.dtype", "max_model_len": "model.max_model_len", "seed": "seed",
              "tokenizer": "model.tokenizer", "tensor_parallel_size": "model.tensor_parallel_size",
              "gpu_memory_utilization": "engine.gpu_memory_utilization",
              "max_num_batched_tokens": "engine.max_num_batched_tokens", "speculative_config.method": "spec.method",
              "trust_remote_code": "model.trust_remote_code"}


def key_digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:20]


def run_script(python: str, env: dict[str, str], command: str, spec: dict | None, timeout: float, what: str, *,
         script: Path | None = None, doing: str = "vLLM's own check") -> dict:
    """One answer of a script run in a build's interpreter (stdlib + vllm: standalone/introspect.py, command.py):
    its last stdout line, a JSON object with "ok"; a ConfigError naming `what` and `doing` otherwise. The
    default script is read at call time (SCRIPT, which the tests replace with a stand-in)."""
    env = {k: v for k, v in env.items() if k != "ONEKNOB_VLLM_PLUGIN"}  # the plugin stays a no-op in here
    try:
        done = subprocess.run([python, "-P", str(script or SCRIPT), command], input=json.dumps(spec or {}), env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what}: {doing} did not finish in {timeout:.0f} s ({python}); the machine "
                          "may be overloaded: retry") from None
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {}
    if not result.get("ok"):
        tail = (result.get("message") or done.stderr.strip()[-600:] or f"exit {done.returncode}")
        raise ConfigError(f"{what}: {doing} could not run in {python}: {tail}")
    return result


# What vLLM (and torch, transformers, the hub) may read from the environment of the check: part of its key.
READ_ENV = ("VLLM_", "TORCH_", "CUDA_", "HF_", "TRANSFORMERS_", "PYTHONPATH")


def ambient(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(READ_ENV)}


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None  # a torn write or an unreadable file: made again


def _write(path: Path, result: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_via_tmp(path, json.dumps(result))
    except OSError:
        if not path.is_relative_to(user_cache()):
            raise  # the study's own cache must take it; the machine's is a convenience


def _lookup(path: Path) -> dict | None:
    """The study's cached result, else the machine's (copied into the study's cache)."""
    found = _read(path)
    if found is None and (found := _read(_shared(path))) is not None:
        _write(path, found)
    return found


def _store(path: Path, result: dict) -> None:
    _write(path, result)
    _write(_shared(path), result)


def _shared(path: Path) -> Path:
    return user_cache() / "vllm-checks" / path.parent.name / path.name


def cached_answer(path: Path, make) -> dict:
    found = _lookup(path)
    if found is None:
        found = make()
        _store(path, found)
    return found


def build_key(python: str, versions: dict[str, Any]) -> str:
    return key_digest([python, versions])


def describe(python: str, env: dict[str, str], cache_dir: str, key: str) -> dict:
    """The build's EngineArgs fields and vllm.envs variables (names, defaults, help), cached per build."""
    return cached_answer(Path(cache_dir) / "vllm-describe" / f"{key}.json",
                   lambda: run_script(python, env, "describe", None, TIMEOUT_S, "engine_args/env knobs"))


def check_names(knob_values: dict[str, Any], described: dict) -> None:
    """Refuse a family knob whose name the build does not know, with "did you mean" from the build's list."""
    fields = [f["name"] for f in described["engine_args"]]
    variables = [v["name"] for v in described["env"]]
    for key, value in knob_values.items():
        family, _, name = key.partition(".")
        if family not in knobs.FAMILIES:
            continue
        known = fields if family == "engine_args" else variables
        if name in known:
            continue
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        what = "a field of vLLM's EngineArgs" if family == "engine_args" else "a variable vllm.envs knows"
        hint = f"did you mean {' or '.join(f'{family}.{n}' for n in near)}?" if near else \
            f"python run.py --help {family} lists them"
        raise ConfigError(f"{key}={_shown(value)}: not {what} in vLLM {described['vllm_version']}; {hint}")


def _shown(value: Any) -> str:
    return "null" if value is None else json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)


def blame(field: str | None, knob_values: dict[str, Any], kwargs: dict[str, Any], settings: dict) -> str:
    """`key=value` of the oneknob setting that put vLLM's offending field there."""
    if not field:
        return "this configuration"
    top = field.split(".")[0]
    overrides = [f"{key}={_shown(value)}" for key, value in knob_values.items()
                 if model_override.is_override(key) and value is not None]
    if overrides and top in ("hf_overrides", "max_model_len", "model_config"):  # the model's config changed under it
        if top == "hf_overrides":
            return ", ".join(overrides)
        rest = {k: v for k, v in knob_values.items() if not model_override.is_override(k)}
        return f"{blame(field, rest, kwargs, settings)} with {', '.join(overrides)}"
    if field.startswith("env."):
        name = field[4:]
        for key, value in knob_values.items():
            if name in knobs.knob(key).env:
                return f"{key}={_shown(value)}"
        return field
    if f"engine_args.{top}" in knob_values:
        return f"engine_args.{top}={_shown(knob_values[f'engine_args.{top}'])}"
    if field == "speculative_config.method":
        return f"spec.method={settings.get('spec_method')}"
    owner = knobs.named_kwargs().get(field) or knobs.named_kwargs().get(top)
    if owner:
        return f"{owner}={_shown(knob_values.get(owner))}"
    if top in SETTING_OF:
        return f"{SETTING_OF[top]}={_shown(kwargs.get(top))}"
    return f"engine_args.{top}" if top in kwargs else field


def validate(configs: list[dict[str, Any]], cache_dir: str, log=print, meanwhile=None) -> list[dict]:
    """Each item: {"python", "env" (the interpreter's), "kwargs", "knob_env", "knobs", "settings", "build",
    "fingerprint"}, and for a patched copy "shares": its release's {"python", "env", "build"} and the files its
    diff touches ("touched"). Returns vLLM's result per item (resolved config or error), refusing the first error.

    One process per build checks every configuration not cached, whatever environment each needs (the script
    forks after one `import vllm`; a group whose variables the import read gets a process of its own). A patched
    copy is checked by its release's process, watching the files its diff touches: the result stands for the
    patched copy when the check read none of them and started no Python process (it then ran the same code);
    else the patched copy is checked by its own process.

    `meanwhile()`, when given, is called once, before the first check: the first job's worker starts importing vLLM
    (oneknob.run.prepared), starting no engine. It may return `checker(python, env, knob_envs)`: where that worker
    runs this interpreter and environment (its build) and one of these knob environments, a function
    `(spec, env) -> answer` that checks every group in forks of the worker (None if the worker failed: then a
    process of its own), else None. A group whose environment differs from the worker's in a variable vLLM's
    import read comes back "redo": those go to one process. A check that watches a patched copy's files always
    has a process of its own; where the job's worker checks its release, a patched copy gets its own at once. Where
    the job's worker runs a patched copy itself (its interpreter and environment, the overlay on PYTHONPATH), that
    copy is checked there, as its own build: the worker runs the patched code, so nothing needs watching."""
    results: list[dict | None] = [None] * len(configs)
    paths, cached = [], set()
    hosts: dict[str, list[int]] = {}
    for i, item in enumerate(configs):
        digest = key_digest([item["build"], item["knob_env"], item["kwargs"], item["fingerprint"],
                          ambient(_check_env(item))])
        path = Path(cache_dir) / "vllm-validate" / f"{digest}.json"
        paths.append(path)
        results[i] = _lookup(path)
        if results[i] is not None:
            cached.add(i)
        else:
            hosts.setdefault(_host_key(item.get("shares") or item), []).append(i)
    own: dict[str, list[int]] = {}
    checker = meanwhile() if hosts and meanwhile is not None else None
    if checker:  # a patched copy the job's worker runs: checked there as its own build, not by its release
        mine = sorted(i for indices in hosts.values() for i in indices if configs[i].get("shares")
                      and checker(configs[i]["python"], configs[i]["env"], [configs[i]["knob_env"]]))
        if mine:
            hosts = {key: left for key, indices in hosts.items() if (left := [i for i in indices if i not in mine])}
            for i, result in zip(mine, _check([dict(c, shares=None) for c in configs], mine, log, checker)):
                results[i] = result
    for indices in hosts.values():
        for i, result in zip(indices, _check(configs, indices, log, checker)):
            if result is None:  # a patched copy whose diff touches what the check read, or left to its own
                own.setdefault(_host_key(configs[i]), []).append(i)
            else:
                results[i] = result
    for indices in own.values():
        for i, result in zip(indices, _check([dict(configs[i], shares=None) for i in range(len(configs))],
                                            indices, log)):
            results[i] = result
    for i, result in enumerate(results):
        if i not in cached:
            _store(paths[i], result)
    for item, result in zip(configs, results):
        if not result["ok"]:
            where = blame(result.get("field"), item["knobs"], item["kwargs"], item["settings"])
            first = result["message"].strip().splitlines()[0] if result["message"].strip() else result["error_type"]
            text = f"{first}: {result['summary']}" if result.get("summary") else first
            near = result.get("did_you_mean")
            fix = _fix(result.get("field"), item["knobs"])
            raise ConfigError(f"{where}: vLLM {result['vllm_version']} refuses it: {text}"
                              + (f" (did you mean {' or '.join(near)}?)" if near else "")
                              + (f"\nFix: {fix}" if fix else ""))
    return results


def _fix(field: str | None, knob_values: dict[str, Any]) -> str | None:
    """oneknob's fix for a refused variable a knob sets (the knob's refused_fix: runner=v1 on a vLLM without V1)."""
    if not field or not field.startswith("env."):
        return None
    for key in knob_values:
        owner = knobs.knob(key)
        if field[4:] in owner.env:
            return owner.refused_fix or f"{key}=null leaves {field[4:]} unset (the build's own default)"
    return None


def _host_key(item: dict[str, Any]) -> str:
    return key_digest([item["python"], item["build"]])


def _check(configs: list[dict[str, Any]], indices: list[int], log, checker=None) -> list[dict | None]:
    """One process of one build for configs[indices] (grouped by the environment vLLM reads, each distinct
    configuration once), or the job's prepared worker where `checker` serves them; None for a patched copy the
    check cannot stand for (or that has a process of its own: where the job's worker checks the release's)."""
    host = configs[indices[0]].get("shares") or configs[indices[0]]
    release = [i for i in indices if not configs[i].get("shares")]
    if checker and release and len(release) < len(indices) \
            and checker(host["python"], host["env"], [configs[i]["knob_env"] for i in release]):
        copies = sorted({str(configs[i]["knobs"].get("vllm.patch")) for i in indices if configs[i].get("shares")})
        log(f"vllm.patch={', '.join(copies)}: checked in a process of its own (the release's configurations are "
            "checked in the job's worker, which imports vLLM anyway)")
        served = dict(zip(release, _check(configs, release, log, checker)))
        return [served.get(i) for i in indices]
    groups: dict[str, dict[str, list]] = {}
    for i in indices:
        group = groups.setdefault(key_digest(configs[i]["knob_env"]), {"env": configs[i]["knob_env"], "configs": []})
        kwargs = configs[i]["kwargs"]
        if kwargs not in group["configs"]:
            group["configs"].append(kwargs)
    order = list(groups.values())
    watch = sorted({f for i in indices for f in (configs[i].get("shares") or {}).get("touched", ())})
    patched = sorted({configs[i]["knobs"].get("vllm.patch") for i in indices if configs[i].get("shares")})
    count = sum(len(g["configs"]) for g in order)
    started = time.monotonic()
    env = _check_env(dict(host, kwargs=configs[indices[0]]["kwargs"]))
    found = None
    if (serve := checker(host["python"], host["env"], [g["env"] for g in order]) if checker and not watch
            else None):
        log(f"vLLM checks {count} configuration(s) in the job's worker (one `import vllm` for the check and the "
            "engine, which starts once every configuration is accepted) ...")
        found = serve({"groups": order, "watch": []}, {k: v for k, v in env.items() if k == "HF_HUB_OFFLINE"})
    if found is None:
        log(f"vLLM checks {count} configuration(s) in one process ({host['python']}"
            + (f"; patched copies {', '.join(map(str, patched))} share it if their diffs touch nothing it reads"
               if patched else "") + ") ...")
        found = run_script(host["python"], env, "validate", {"groups": order, "watch": watch}, TIMEOUT_S,
                     "vLLM's config check")
    elif redo := [position for position, answer in enumerate(found["groups"]) if "redo" in answer]:
        read = sorted({name for position in redo for name in found["groups"][position]["redo"]})
        log(f"the job's worker imported vLLM reading {', '.join(read)}, which {len(redo)} other environment(s) "
            "set otherwise: one process checks them")
        again = run_script(host["python"], env, "validate", {"groups": [order[p] for p in redo], "watch": watch},
                     TIMEOUT_S, "vLLM's config check")
        for position, answer in zip(redo, again["groups"]):
            found["groups"][position] = answer
    answers = found["groups"]
    for position, answer in enumerate(answers):
        if "redo" in answer:  # the import read a variable this group sets: a process of its own
            log(f"vLLM's import read {', '.join(answer['redo'])}: a second process for that environment")
            alone = run_script(host["python"], env, "validate", {"groups": [order[position]], "watch": watch},
                         TIMEOUT_S, "vLLM's config check")
            answers[position] = alone["groups"][0]
    log(f"vLLM {found['vllm_version']} checked them in {time.monotonic() - started:.1f} s")
    out: list[dict | None] = []
    for i in indices:
        position = list(groups).index(key_digest(configs[i]["knob_env"]))
        answer = answers[position]
        if "failed" in answer:
            raise ConfigError(f"vLLM's config check could not run in {host['python']}: {answer['failed']}")
        result = dict(answer["results"][order[position]["configs"].index(configs[i]["kwargs"])],
                      vllm_version=found["vllm_version"])
        shares = configs[i].get("shares")
        if shares:
            read = sorted(set(shares["touched"]) & set(answer.get("read") or ()))
            if read or answer.get("spawned"):
                why = f"it read {', '.join(read)}" if read else "it started a Python process"
                log(f"vllm.patch={configs[i]['knobs'].get('vllm.patch')}: the release's check cannot stand for the "
                    f"patched copy ({why}): checked in its own")
                out.append(None)
                continue
            result["checked_by"] = "the release's process (the diff touches nothing the check read)"
        out.append(result)
    return out


def _check_env(item: dict[str, Any]) -> dict[str, str]:
    """The environment vLLM's check of this configuration runs in: the interpreter's, less the knobs' own
    variables (the spec's knob_env sets them inside, before vLLM is imported)."""
    env = {k: v for k, v in item["env"].items() if k not in knobs.owned_env()}
    # VLLM_CACHE_ROOT stays the worker's: vLLM keeps its model-class inspection there (a subprocess that
    # imports vLLM again, ~25 s cold on 2 cores), checked against each model file's hash, so a warm one
    # serves every build of that vLLM (a release environment has a root of its own: builds.release_cache_root);
    # a cache of oneknob's own per paths.cache paid it again in every new root
    if Path(item["kwargs"]["model"]).is_dir():
        env["HF_HUB_OFFLINE"] = "1"  # a local checkpoint: never the hub
    return env


def listing(family: str, facts, knob_values: dict[str, Any], cache_dir: str, log=print,
            builds_dir: str | None = None) -> str:
    """`run.py --help engine_args` / `--help env`: the family's names for the build these knobs run on
    (`facts`: the vLLM engine's VllmFacts, which knows where each build's interpreter lives)."""
    python, env = facts.interpreter(knob_values, builds_dir or cache_dir, log)
    described = describe(python, env, cache_dir, build_key(python, facts.versions(knob_values)))
    if family == "engine_args":
        rows = [(f"engine_args.{f['name']}", f"{f['type']}, default {_shown(f['default'])}", f["help"])
                for f in described["engine_args"]]
        head = f"engine_args.<field>=VALUE: the {len(rows)} EngineArgs fields of vLLM {described['vllm_version']}"
    else:
        rows = [(f"env.{v['name']}", f"default {_shown(v['default'])}", "") for v in described["env"]
                if v["name"].startswith("VLLM_")]
        head = f"env.VLLM_<NAME>=VALUE: the {len(rows)} VLLM_* variables vllm.envs {described['vllm_version']} knows"
    owners = knobs.named_kwargs()
    lines = [head + " (a field a named knob sets points to that knob)", ""]
    for key, kind, text in rows:
        short = key.partition(".")[2] if family == "engine_args" else key
        owner = f" [use {owners[short]}]" if short in owners else \
            f" [oneknob sets it: {SETTING_OF[short]}]" if family == "engine_args" and short in SETTING_OF else ""
        lines.append(f"  {key}  ({kind}){owner}")
        if text:
            lines.append(f"      {text[:300]}")
    return "\n".join(lines)
