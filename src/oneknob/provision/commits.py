"""vLLM's build at a commit: `vllm.commit` with `vllm.source` (a vLLM git checkout).

The build for a commit is that commit's Python sources over the compiled parts of its nearest release (the latest
`v*` tag reachable from it, `git describe --tags --abbrev=0 --match 'v*'`), as vLLM's own python-only development
install does: <cache>/commits/<release>-<hash>/vllm/ is a tree of symlinks to the release build's vllm/ with real
copies of every file `git diff --name-only v<release> <commit>` lists under vllm/ (Python, JSON configs, ...;
deleted ones removed), first on the
worker's PYTHONPATH. A commit whose diff from its release touches compiled sources (csrc/, CMake files, .cu/.cpp)
is refused for the overlay, or built from source with uv when asked (`vllm.build_from_source=true`: minutes to
hours). `A..B` is the commits of `git rev-list --first-parent A..B`, oldest first, after A itself.

Nothing here runs for a commit a search never visits: `check` reads git only; `ensure` builds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from oneknob.errors import ConfigError

COMPILED = re.compile(r"(^|/)(csrc/|cmake/|CMakeLists\.txt$)|\.(cu|cuh|cpp|cc|c|h|hpp)$")
# vLLM's dependencies (its requirements/*.txt, setup.py, pyproject.toml): an overlay runs the commit's Python on the
# release's installed dependencies, so a commit that changes them is refused like a compiled change
DEPENDENCIES = re.compile(r"^(requirements/|requirements[\w.-]*\.txt$|setup\.py$|pyproject\.toml$)")
MARK = "oneknob-build.json"  # the marker oneknob writes in every build it creates (make clean-builds reads it)


@dataclass(frozen=True)
class Commit:
    hash: str
    release: str  # "0.32.0": the nearest v* tag, without the v
    files: tuple[str, ...]  # vllm/... files that differ from the release (added, changed or deleted), any kind
    compiled_files: tuple[str, ...]  # what an overlay cannot carry
    dependency_files: tuple[str, ...] = ()  # nor this: the release's installed dependencies stay

    @property
    def key(self) -> str:
        return f"{self.release}-{self.hash}"


def _git(source: str, *args: str, key: str, value, fix: str) -> str:
    done = subprocess.run(["git", "-C", source, *args], capture_output=True, text=True)
    if done.returncode:
        why = (done.stderr.strip().splitlines() or ["git failed"])[-1]
        raise ConfigError(f"{key}={value}: {why} (git {' '.join(args)} in {source}); {fix}")
    return done.stdout


def check_source(source) -> str:
    """The checkout's absolute path, or refused: vllm.source must be a vLLM git checkout."""
    if not source:
        raise ConfigError("vllm.source=null: vllm.commit needs a vLLM git checkout to read commits from; set "
                          "vllm.source=PATH (a clone of github.com/vllm-project/vllm)")
    path = Path(str(source)).expanduser().resolve()
    inside = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if not path.is_dir() or inside.returncode or Path(inside.stdout.strip()).resolve() != path:
        raise ConfigError(f"vllm.source={source}: not a git checkout (no .git at {path}); give the top directory of "
                          "a vLLM clone (git clone https://github.com/vllm-project/vllm)")
    if not (path / "vllm").is_dir():
        raise ConfigError(f"vllm.source={source}: a git checkout, but not of vLLM (no vllm/ package at its top)")
    return str(path)


def full_hash(source: str, rev: str, key: str = "vllm.commit") -> str:
    return _git(source, "rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}", key=key, value=rev,
                fix=f"give a commit, tag or branch of {source} (git log --oneline there)").strip()


def commit_range(source: str, text: str) -> list[str]:
    """`A..B` -> [A, then the first-parent commits after A up to B], full hashes, oldest first; one commit -> [it]."""
    if ".." not in text:
        return [full_hash(source, text)]
    start, _, end = text.partition("..")
    if not start or not end or "." in end[:1]:
        raise ConfigError(f"vllm.commit={text}: a range is A..B (two commits, A before B); give both ends")
    first, last = full_hash(source, start), full_hash(source, end)
    listed = _git(source, "rev-list", "--first-parent", "--reverse", f"{first}..{last}", key="vllm.commit",
                  value=text, fix="give two commits of vllm.source").split()
    if not listed:
        raise ConfigError(f"vllm.commit={text}: no commit of {end} follows {start} on its first-parent line (is "
                          f"{start} after {end}?); give A..B with A an ancestor of B")
    return [first, *listed]


def check(source: str, commit: str, *, build_from_source: bool = False) -> Commit:
    """The commit's release and changed files, read from git; refused (before anything starts) when the overlay
    cannot carry it and no source build was asked for."""
    described = _git(source, "describe", "--tags", "--abbrev=0", "--match", "v*", commit, key="vllm.commit",
                     value=commit, fix="the commit needs a release tag (v0.32.0, ...) among its ancestors: "
                                       "git fetch --tags in vllm.source").strip()
    release = described.removeprefix("v")
    changed = _git(source, "diff", "--name-only", "--no-renames", described, commit, key="vllm.commit", value=commit,
                   fix="check vllm.source").split("\n")
    changed = [name for name in changed if name]
    compiled = tuple(name for name in changed if COMPILED.search(name))
    dependencies = tuple(name for name in changed if DEPENDENCIES.search(name))
    found = Commit(commit, release, tuple(n for n in changed if n.startswith("vllm/") and n not in compiled), compiled,
                   dependencies)
    if (compiled or dependencies) and not build_from_source:
        what = "compiled sources" if compiled else "vLLM's dependencies"
        shown = _shown(compiled or dependencies)
        also = f" and vLLM's dependencies ({_shown(dependencies)})" if compiled and dependencies else ""
        carried = "compiled parts" if compiled else "installed dependencies"
        raise ConfigError(f"vllm.commit={commit[:12]}: its diff from {described} touches {what} ({shown}){also}, "
                          f"which the build for a commit (its Python files over the {described} release's {carried}) "
                          "cannot carry; narrow the range to commits without such changes, or set "
                          "vllm.build_from_source=true to build it from source (minutes to hours)")
    return found


def _shown(files: tuple[str, ...]) -> str:
    return ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")


def info(source: str, commit: str) -> dict:
    """Hash, subject, author date and a `git show --stat` summary, for the report."""
    fields = _git(source, "show", "-s", "--format=%H%n%s%n%aI%n%an", commit, key="vllm.commit", value=commit,
                  fix="check vllm.source").splitlines()
    stat = _git(source, "show", "--stat", "--format=", commit, key="vllm.commit", value=commit, fix="check vllm.source")
    return {"hash": fields[0], "subject": fields[1], "date": fields[2], "author": fields[3],
            "stat": stat.strip().splitlines()[-1].strip() if stat.strip() else "no files changed",
            "files": [line.split("|")[0].strip() for line in stat.strip().splitlines()[:-1]][:20]}


def overlay_dir(cache_dir, commit: str) -> Path | None:
    """The commit's overlay, made by `ensure`, found by hash (the job process reads only the knob value)."""
    found = sorted((Path(cache_dir) / "commits").glob(f"*-{commit}"))
    return next((p for p in found if (p / MARK).is_file()), None)


def ensure(source: str, found: Commit, release_site: Path, cache_dir, log=print) -> Path:
    """<cache>/commits/<release>-<hash>: the release's vllm/ as symlinks, the commit's changed files over it."""
    from oneknob.provision import builds

    final = Path(cache_dir) / "commits" / found.key
    try:  # an overlay made before every changed file was carried (only .py): oneknob's own, set aside and redone
        made = json.loads((final / MARK).read_text()).get("files")
    except (OSError, ValueError):
        made = None
    if made is not None and sorted(made) != sorted(found.files):
        os.replace(final, final.with_name(f"{final.name}.stale-{int(time.time())}"))

    def make(tmp: Path, say) -> None:
        origin = release_site / "vllm"
        tmp.mkdir()
        builds.mirror(tmp / "vllm", origin)
        for rel in found.files:
            target = tmp / rel
            builds.realise(tmp, rel)
            if target.exists():
                target.unlink()
            text = subprocess.run(["git", "-C", source, "show", f"{found.hash}:{rel}"], capture_output=True)
            if text.returncode == 0:  # else deleted at the commit: removed from the overlay
                target.write_bytes(text.stdout)
        say(f"vllm/ at {found.hash[:12]}: {len(found.files)} changed file(s) over vLLM {found.release}")
        (tmp / MARK).write_text(json.dumps({"kind": "commit", "commit": found.hash, "release": found.release,
                                            "source": source, "files": list(found.files),
                                            "origin": str(origin), "created": time.time()}))

    builds.build_once(final, f"vllm.commit={found.hash[:12]}", log, make)
    return final


def source_tree(source: str, commit: str, cache_dir) -> Path:
    """The commit's whole tree (git archive), for vllm.build_from_source=true: uv builds it like a vllm.version dir."""
    final = Path(cache_dir) / "commits" / f"src-{commit}"
    if not (final / "pyproject.toml").is_file():
        tmp = final.with_name(final.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", source, "archive", commit], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
        os.replace(tmp, final)
    return final
