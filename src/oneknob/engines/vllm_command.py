"""A bug report's `vllm serve` flags as that vLLM build's own parser reads them (stdlib + vllm only, no oneknob).

    python vllm_command.py serve < {"argv": ["models/x", "--max-num-seqs", "128", ...]}
    python vllm_command.py engine_args < {"kwargs": {"max_num_seqs": 128, ...}}
    python vllm_command.py serve < {"batch": [{"argv": [...]}, ...]}      # several, one import of vLLM

Run by oneknob.plan.from_command in the interpreter of the job's build (as vllm_introspect.py is). Prints ONE JSON
object on stdout: {"ok": true, "model": ..., "flags": [{"dest", "option", "options", "value", "default",
"deprecated", "engine_arg", "secret"}], "vllm_version"} for the flags the line gives, in its order (a flag vLLM
redacts from its own log is "secret", its value masked), or {"ok": false, "message": vLLM's parser's own
message}. `engine_args` (an `LLM(...)` call) checks the names against EngineArgs' fields and gives
each its EngineArgs default.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import sys
from typing import Any


def _sibling(name: str):
    """A sibling script by its file (its folder holds vllm.py, which must not shadow vLLM on sys.path)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(f"_oneknob_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


jsonable = _sibling("vllm_introspect").jsonable


def serve_parser():
    """vLLM's `vllm serve` parser, found where this release keeps it (oneknob.engines.vllm_versions: its module moved
    in 0.33.0)."""
    versions = _sibling("vllm_versions")
    make_arg_parser = versions.load(versions.SERVE_PARSER)
    FlexibleArgumentParser = versions.load(versions.ARGPARSE)
    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


class ParserError(Exception):
    pass


# Where a release keeps the flags vLLM redacts from its own "non-default args" log line (0.32: api_key, hf_token,
# watermark_config); a release without one redacts by oneknob's names alone (oneknob.config.secrets).
SENSITIVE = ("vllm.entrypoints.serve.utils.api_utils", "vllm.entrypoints.utils", "vllm.entrypoints.openai.api_server")
MASK = "***"


def sensitive() -> frozenset:
    """The dests vLLM's own parser treats as secret (redacted from its log): their values are masked here, so no
    answer (nor the parse cache holding it) carries them."""
    import importlib

    for name in SENSITIVE:
        try:
            found = getattr(importlib.import_module(name), "_SENSITIVE_ARG_FIELDS", None)
        except Exception:  # noqa: BLE001 (a module another release moved or that needs what is missing)
            continue
        if found:
            return frozenset(found)
    return frozenset()


def _given_only(value: Any, default: Any) -> Any:
    """A config section the parser filled in whole (compilation_config): only the keys that differ from its default."""
    if isinstance(value, dict) and isinstance(default, dict):
        return {k: _given_only(v, default.get(k)) for k, v in value.items() if v != default.get(k)}
    return value


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return jsonable(value)


def serve(spec: dict) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs

    parser = serve_parser()

    def refuse(message: str):
        raise ParserError(message)

    parser.error = refuse  # argparse would print usage and exit 2: its message is what oneknob quotes
    unset = object()
    actions = [a for a in parser._actions if a.dest != "help"]
    namespace = argparse.Namespace(**{a.dest: unset for a in actions})
    with contextlib.redirect_stdout(sys.stderr):
        parsed = parser.parse_args(spec["argv"], namespace=namespace)
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    deprecated = {a.dest for a in getattr(parser, "_deprecated", ())} | {a.dest for a in actions
                                                                          if getattr(a, "deprecated", False)}
    flags, model, secret = [], None, sensitive()
    for action in actions:
        value = getattr(parsed, action.dest, unset)
        if value is unset:
            continue
        default = _plain(action.default)
        given = _given_only(_plain(value), default)
        if action.dest in ("model_tag", "model"):
            if model is not None and given != model:
                raise ParserError(f"two models: {model!r} (the positional model) and --model {given!r}; give one")
            model = given
            continue
        options = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
        hidden = action.dest in secret
        flags.append({"dest": action.dest, "option": (options or action.option_strings or [""])[0],
                      "options": [o for o in action.option_strings if o.startswith("--")],
                      "value": MASK if hidden and given not in (None, False) else given, "default": default,
                      "deprecated": action.dest in deprecated, "engine_arg": action.dest in fields,
                      "secret": hidden})
    order = {arg.split("=", 1)[0].lstrip("-").replace("-", "_").split(".")[0]: i
             for i, arg in reversed(list(enumerate(spec["argv"]))) if arg.startswith("-")}
    flags.sort(key=lambda f: order.get(f["dest"], len(order)))
    return {"ok": True, "model": model, "flags": flags}


def engine_args(spec: dict) -> dict:
    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    flags = []
    for name, value in spec["kwargs"].items():
        if name not in fields:
            near = difflib.get_close_matches(name, list(fields), n=3)
            raise ParserError(f"EngineArgs has no field {name!r}" + (f" (did you mean {', '.join(near)}?)" if near
                                                                     else ""))
        f = fields[name]
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        flags.append({"dest": name, "option": "--" + name.replace("_", "-"), "value": jsonable(value),
                      "default": _plain(default), "secret": name in sensitive(),
                      "deprecated": False, "engine_arg": True})
    return {"ok": True, "model": None, "flags": flags}


def _one(command: str, spec: dict) -> dict:
    try:
        return {"serve": serve, "engine_args": engine_args}[command](spec)
    except ParserError as exc:
        return {"ok": True, "refused": str(exc)}


def main() -> None:
    command, spec = sys.argv[1], json.loads(sys.stdin.read() or "{}")
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # vLLM's own prints never mix with the one JSON line
    try:
        import vllm

        version = getattr(vllm, "__version__", "?")
        if "batch" in spec:  # several lines in one process (tests): one import of vLLM
            result = {"ok": True, "results": [_one(command, item) | {"vllm_version": version}
                                              for item in spec["batch"]]}
        else:
            result = _one(command, spec) | {"vllm_version": version}
    except Exception as exc:  # noqa: BLE001 (said, with its type, to the caller)
        result = {"ok": False, "message": f"{type(exc).__name__}: {exc}"}
    real_stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
