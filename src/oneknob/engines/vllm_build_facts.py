"""A job's vLLM build as a plan sees it without installing anything: which release it is (its vllm.* knobs), a copy
of that release on this machine (the installed vLLM, or a wheel make vllm-contract kept), the runner the job runs there,
and why a pinned runner cannot run on it (the release's own validate_environ, vllm_release.own). VllmFacts.predict says
it per job in the plan; VllmFacts.preflight refuses before anything is built or started.
"""

from __future__ import annotations

import re
from pathlib import Path

from oneknob.engines import vllm_sources
from oneknob.engines.vllm_release import RUNNER_NAMES, own, runner_file, runners
_RELEASE = re.compile(r"\d+\.\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?(?:\+[\w.]+)?")


def setup_default(platform: str) -> str | None:
    """The release `make setup` installs on this platform (pyproject's gpu / cpu extra, as oneknob's metadata says)."""
    from importlib import metadata

    extra = "gpu" if platform == "cuda" else "cpu"
    for requirement in metadata.requires("oneknob") or []:
        found = re.match(r"vllm(?:-cpu)?\s*==\s*(\S+?)\s*;\s*extra\s*==\s*['\"](\w+)['\"]", requirement)
        if found and found.group(2) == extra:
            return found.group(1)
    return None


def release_of_build(knob_values: dict, installed: str | None, here: bool, platform: str) -> tuple[str | None, str]:
    """(the vLLM release a job's build is, how oneknob knows) from its vllm.* knobs: vllm.version's release, pin or
    wheel name; null: the installed vLLM when the plan is for this machine, else what `make setup` installs there."""
    version = knob_values.get("vllm.version")
    if knob_values.get("vllm.commit") is not None:
        return None, "a commit's build: its nearest release, found when it is built"
    if version is None:
        if here:
            return installed, "the vLLM installed here"
        return setup_default(platform), "the release make setup installs there, pyproject.toml"
    text = str(version).strip()
    name = Path(text).name
    found = re.fullmatch(_RELEASE, text) or re.search(rf"==\s*({_RELEASE.pattern})$", text) or \
        (re.match(rf"vllm(?:_cpu)?-({_RELEASE.pattern})-", name) if name.endswith(".whl") else None)
    if not found:
        return None, f"vllm.version={text}: a source checkout, whose release is known once built"
    return (found.group(1) if found.groups() else found.group(0)), f"vllm.version={text}"


def source_here(release: str | None, installed: str | None) -> Path | None:
    """A copy of `release`'s files on this machine without installing anything: this interpreter's vLLM when it is
    that release, else a kept wheel of it (vllm_wheels.wheels_dir: make vllm-contract RELEASE=X keeps one)."""
    from oneknob.engines import vllm_wheels

    if release is None:
        return None
    if installed is not None and installed.split("+")[0] == release.split("+")[0]:
        import importlib.util

        spec = importlib.util.find_spec("vllm")
        if spec is not None and spec.submodule_search_locations:
            return Path(list(spec.submodule_search_locations)[0]).parent
    kept = [w for w in vllm_wheels.cached_wheels() if re.match(rf"vllm(?:_cpu)?-{re.escape(release)}-", w.name)
            and vllm_wheels.problem(w) is None]
    return kept[0] if kept else None


def build_facts(knob_values: dict, default_runner: str, platform: str, installed: str | None, here: bool) -> dict:
    """What a plan can say of a job's build here: {"release", "how", "source" (a copy of it here, or None), "has"
    (its runners, None without a copy), "runs" (the runner it runs, None: not known), "note" (one sentence)}."""
    from oneknob.config import resolution

    release, how = release_of_build(knob_values, installed, here, platform)
    source = source_here(release, installed)
    tree = vllm_sources.open_tree(source.resolve()) if source is not None else None
    has = runners(tree) if tree is not None else None
    runner = knob_values.get("runner")
    present = [r for r, found in (has or {}).items() if found]
    if runner is not None:
        runs, why = runner, f"runner={runner}"
    elif len(present) == 1:
        runs, why = present[0], f"runner=null: the only runner vLLM {release} has"
    elif present or resolution.has_rules(release):
        runs, why = default_runner, f"runner=null: vLLM {release}'s default on {platform}"
    else:
        runs, why = None, None
    where = f"vLLM {release or 'unknown'} ({how}{', read from ' + str(source) if source is not None else ''})"
    if runner is not None and has is not None and not has.get(runner):
        note = f"runner={runner}: {where} has no {RUNNER_NAMES[runner]} (no {runner_file(runner)}): refused"
    elif runs is not None:
        note = f"runs {RUNNER_NAMES[runs]} ({why}) on {where}"
    else:
        note = (f"runner=null: the default runner of {where} is not known here, as no copy of it is on this machine "
                f"(make vllm-contract RELEASE={release} keeps its wheel)")
    return {"release": release, "how": how, "source": source, "has": has, "runs": runs, "note": note}


def refusal(knob_values: dict, facts: dict) -> str | None:
    """Why a job cannot run on its build, read from a copy of the build kept here, or None: its vllm.patch does not
    apply to that release, or a variable its knobs set (runner's VLLM_USE_V2_MODEL_RUNNER, an env.VLLM_X=V) is refused
    by the release's own validate_environ, or its explicit runner's module is missing. The installed vLLM's values and
    the environments oneknob builds are checked by vLLM's own config check (vllm_validate) instead, in their
    interpreter."""
    runner, source = knob_values.get("runner"), facts["source"]
    if source is not None and (refused := _patch_refusal(knob_values.get("vllm.patch"), source, facts)):
        return refused
    if source is None or source.is_dir():
        return None
    if refused := _environ_refusal(knob_values, source, facts):
        return refused
    if runner is not None and facts["has"] is not None and not facts["has"].get(runner):
        from oneknob.config import knobs

        return f"runner={runner}: vLLM {facts['release']} has no {RUNNER_NAMES[runner]} (no {runner_file(runner)} " \
               f"in {source.name})\nFix: {knobs.KNOBS['runner'].refused_fix}."
    return None


def _environ_refusal(knob_values: dict, source: Path, facts: dict) -> str | None:
    """The first variable the job's knobs set that the release's own validate_environ refuses, under the knob that
    sets it, with oneknob's fix (the knob's refused_fix, else leaving the variable unset)."""
    from oneknob.config import knobs

    setting = {k: v for k, v in knob_values.items() if k == "runner" or k.startswith("env.")}
    env = knobs.engine_args(setting).env
    if not env:
        return None
    answers = own(source, {"environ": [{name: value} for name, value in env.items()]})["environ"]
    for (name, value), said in zip(env.items(), answers):
        if not isinstance(said, str) or said == "ok":
            continue
        key = next((k for k in setting if name in knobs.knob(k).env), f"env.{name}")
        owner = knobs.knob(key)
        shown = setting.get(key, value)
        fix = owner.refused_fix or f"{key}=null leaves {name} unset (the build's own default), or a vLLM release " \
                                   "that accepts it (vllm.version=...)"
        return (f"{key}={shown}: vLLM {facts['release']} refuses it: {said} (its own validate_environ, run on "
                f"{source.name}, before anything starts)\nFix: {fix}.")
    return None


def _patch_refusal(patch: str | None, source: Path, facts: dict) -> str | None:
    """The job's vllm.patch against the release's own files (GNU patch --dry-run), before its environment is built:
    a diff of a file the release no longer has (fix-53520 on vLLM 0.34.0, which removed Model Runner V1) is refused."""
    from oneknob.config.schema import REPO_ROOT
    from oneknob.engines.vllm_release import patch_applies
    from oneknob.provision import builds

    if patch is None:
        return None
    path = builds._patch_path(patch, REPO_ROOT)  # refuses a missing file, naming it
    applies, said = patch_applies(vllm_sources.open_tree(source.resolve()), Path(path))
    if applies or said.startswith("GNU patch is not installed"):  # no patch here: the build's own apply says it
        return None
    return (f"vllm.patch={patch}: does not apply to vLLM {facts['release']}: {said} (checked on {source.name}, "
            f"before anything is built)\nFix: vllm.patch=null, or a vllm.version the diff was written for (make "
            "vllm-contract RELEASE=X says whether each patch in patches/ applies to X).")
