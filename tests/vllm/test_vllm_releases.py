"""vLLM releases as oneknob sees them without installing them (oneknob.engines.vllm.release, vllm_fit, vllm_wheels):
the runners a release has, its install facts, the fit of each study (`make vllm-contract`), the plan's runner per job
and the refusal of runner=v1 on a release without Model Runner V1, and broken wheel downloads.

Most of it runs on a wheel shaped like vLLM 0.34.0, made here from the installed CPU build's own Python files (so its
code runs on this machine): without the Model Runner V1 modules, with 0.34.0's validate_environ check of
VLLM_USE_V2_MODEL_RUNNER (tests/data/reject-v1-runner-like-0.34.diff), version 0.34.0, torch pinned to 2.14.0 and an
extension that links libcudart.so.13. The real 0.33.0 / 0.34.0 wheels are read where one is kept on this machine
(test_vllm_contract._kept_wheels; never downloaded by the suite), else those tests are skipped saying so.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
from helpers import run_cli
from test_vllm_contract import KEPT

from oneknob.config import resolution
from oneknob.engines.vllm import build_facts as vllm_build_facts, contract as vllm_contract
from oneknob.engines.vllm import release as vllm_release, wheels as vllm_wheels
from oneknob.engines.vllm.sources import Tree

DATA = Path(__file__).parents[1] / "data"
# one machine cache of the release's answers for the module (the plan's question reuses the contract check's): on one
# worker
pytestmark = pytest.mark.xdist_group("vllm-releases")
WHEEL_NAME = "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"


def tiny_elf(needed: list[str]) -> bytes:
    """An ELF64 shared object whose dynamic section names `needed` (DT_NEEDED) and nothing else."""
    strtab = b"\0" + b"".join(name.encode() + b"\0" for name in needed)
    offsets, at = [], 1
    for name in needed:
        offsets.append(at)
        at += len(name) + 1
    dynamic_at = 64 + 2 * 56
    dynamic = b"".join(struct.pack("<qQ", 1, o) for o in offsets)
    strtab_at = dynamic_at + len(dynamic) + 32
    dynamic += struct.pack("<qQ", 5, strtab_at) + struct.pack("<qQ", 0, 0)
    total = strtab_at + len(strtab)
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8) + struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, 0, 0, 64, 56, 2, 64, 0, 0)
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, total, total, 0x1000)
    dyn = struct.pack("<IIQQQQQQ", 2, 6, dynamic_at, dynamic_at, dynamic_at, len(dynamic), len(dynamic), 8)
    return header + load + dyn + dynamic + strtab


@pytest.fixture(scope="module")
def machine_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("xdg")


@pytest.fixture(scope="module")
def like_034(tmp_path_factory) -> Path:
    site = vllm_contract.installed()
    work = tmp_path_factory.mktemp("like-034")
    (work / "vllm" / "platforms").mkdir(parents=True)
    shutil.copy(site / "vllm" / "platforms" / "interface.py", work / "vllm" / "platforms" / "interface.py")
    done = subprocess.run(["patch", "-p1", "--batch", "--fuzz=0", "-i", str(DATA / "reject-v1-runner-like-0.34.diff")],
                          cwd=work, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    wheel = work / WHEEL_NAME
    gone = {"vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/cpu_model_runner.py"}
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as out:
        for path in sorted((site / "vllm").rglob("*.py")):
            rel = str(path.relative_to(site))
            if rel in gone:
                continue
            if rel == "vllm/platforms/interface.py":
                out.write(work / rel, rel)
            elif rel == "vllm/_version.py":
                out.writestr(rel, "__version__ = version = '0.34.0'\n__version_tuple__ = version_tuple = (0, 34, 0)\n")
            else:
                out.write(path, rel)
        out.writestr("vllm/_C.abi3.so", tiny_elf(["libtorch.so", "libcudart.so.13", "libc.so.6"]))
        out.writestr("vllm-0.34.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n"
                                                       "Requires-Dist: torch==2.14.0\nRequires-Dist: numpy\n")
    return wheel


def test_runners_default_runner_and_install_facts_are_read_from_the_release(like_034):
    tree = Tree(like_034)
    assert tree.version == "0.34.0"
    assert vllm_release.runners(tree) == {"v1": False, "v2": True} and vllm_release.default_runner(tree) == "v2"
    facts = vllm_release.install_facts(tree)
    assert (facts["torch"], facts["cuda"], facts["linked"]) == ("torch==2.14.0", 13, "libcudart.so.13")
    assert "CUDA 13, so the NVIDIA driver must support CUDA 13 or newer" in vllm_release.install_text(facts, "0.34.0")
    here = Tree(vllm_contract.installed())  # the CPU build: both runners, V1 by default (no Triton), no CUDA
    assert vllm_release.runners(here) == {"v1": True, "v2": True} and vllm_release.default_runner(here) == "v1"
    assert vllm_release.install_facts(here)["cuda"] is None


def test_the_contract_check_fits_each_study_to_a_release_without_v1(like_034, monkeypatch, capsys, machine_cache):
    """The default study (runner=null) runs there (exit 0); the seed's study (runner=v1, the #53520 patch) is named
    broken: V1 gone, vLLM's own validate_environ refusal quoted with oneknob's fix, the patch's missing file."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(machine_cache))  # the module's: the release's answers computed here
    assert vllm_contract.main(["--source", str(like_034)]) == 0
    out = capsys.readouterr().out
    assert "study conf/config.yaml (the default configuration) (runner=null): runs on vLLM 0.34.0" in out, out
    assert "ok     runner=null: runs Model Runner V2 (the release's default); its points found: vllm.v1.worker.gpu." \
           "model_runner, GPUModelRunner.execute_model(scheduler_output), GPUModelRunner.speculator" in out
    assert "study experiments/mtp_prompt_logprobs.yaml (runner=v1, v2; vllm.patch=fix-53520-protect-prompt-hidden-" \
           "states): does NOT run on vLLM 0.34.0 (not the default study: the check still passes)" in out
    assert "BREAK  runner=v1: Model Runner V1 is gone in vLLM 0.34.0 (no vllm/v1/worker/gpu_model_runner.py); " \
           "vLLM's own validate_environ refuses VLLM_USE_V2_MODEL_RUNNER=0: \"VLLM_USE_V2_MODEL_RUNNER=0 is no " \
           "longer supported: Model Runner V1 has been removed. Unset this variable.\". Fix: runner=null" in out
    assert "BREAK  vllm.patch=fix-53520-protect-prompt-hidden-states: does not apply to vLLM 0.34.0: " \
           "vllm/v1/worker/gpu_model_runner.py is not in vLLM 0.34.0" in out
    assert "vLLM's validate_environ accepts VLLM_USE_V2_MODEL_RUNNER=1" in out  # the ablation's runner=v2
    assert "oneknob: not predicted (its rules are vLLM 0.31, 0.32, 0.33's" in out
    assert "install: vllm 0.34.0 pins torch==2.14.0; its extensions link libcudart.so.13 (vllm/_C.abi3.so)" in out
    assert "Model Runner V1 is not in vLLM 0.34.0: its points are not needed here" in out


def test_the_installed_builds_own_capture_rule_is_oneknobs(monkeypatch, capsys, tmp_path):
    """On the installed vLLM, whose release the rules are for, its own _set_cudagraph_sizes gives what
    config/resolution.py predicts for every shape of every study (else the default study breaks: exit 1)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert vllm_contract.main([]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip().startswith("ok     capture sizes for ")]
    assert len(lines) >= 6 and all(line.endswith("oneknob predicts the same") for line in lines), out
    assert "engine.gpu_memory_utilization=null leaves vLLM's own default: 0.92" in out


def test_predictions_past_the_rules_releases_are_not_predicted():
    seed = {"spec.k": 3, "sched.max_num_seqs": 128}
    known = resolution.predict(seed, max_num_batched_tokens=2048, vllm_version="0.33.0")
    assert known["max_capture_size"] == 512 and "not_predicted" not in known
    later = resolution.predict(seed, max_num_batched_tokens=2048, vllm_version="0.34.0", default_runner="v2")
    assert later["max_capture_size"] is None and later["capture_sizes"] is None and later["runner"] == "v2"
    assert "capture sizes and max capture size of vLLM 0.34.0: oneknob's rules are vLLM 0.31, 0.32, 0.33's" \
        in later["not_predicted"]
    eager = resolution.predict(seed | {"cudagraph.enforce_eager": True}, vllm_version="0.34.0")
    assert eager["max_capture_size"] == 0 and "not_predicted" not in eager  # no graphs: nothing to predict


@pytest.mark.parametrize("values, release", [
    ({"vllm.version": "0.34.0"}, "0.34.0"), ({"vllm.version": "vllm==0.34.0"}, "0.34.0"),
    ({"vllm.version": f"/w/{WHEEL_NAME}"}, "0.34.0"), ({"vllm.version": "/src/vllm"}, None),
    ({"vllm.version": None}, "0.33.0"),  # planned for a GPU elsewhere: what make setup installs there
])
def test_a_jobs_release_is_read_from_its_vllm_knobs(values, release):
    assert vllm_build_facts.release_of_build(values, "0.32.0", False, "cuda")[0] == release
    assert vllm_build_facts.release_of_build({"vllm.version": None}, "0.32.0", True, "cpu")[0] == "0.32.0"


def test_the_plan_says_which_runner_each_side_runs_and_refuses_v1_where_it_is_gone(like_034, tmp_path, machine_cache):
    """vllm.version=0.34.0 against the default build, planned for an H100: each side's runner (0.34.0's only one
    read from the kept wheel); the seed's study (runner=v1) on 0.34.0 is refused by the release's validate_environ
    before anything starts, with oneknob's fix."""
    builds = tmp_path / "builds"
    (builds / "wheels").mkdir(parents=True)
    shutil.copy2(like_034, builds / "wheels" / WHEEL_NAME)  # the same file to the machine's cache of its answers
    env = {"ONEKNOB_BUILDS": str(builds), "XDG_CACHE_HOME": str(machine_cache)}
    rc, out = run_cli(tmp_path / "plan", "vllm.version=null,0.34.0", "dry_run=true", "engine.target_gpu=H100",
                      multirun=True, engine="vllm", env=env, timeout=300)
    assert rc == 0, out
    text = " ".join(out.split())
    assert "baseline: runs Model Runner V2 (runner=null: vLLM 0.33.0's default on cuda) on vLLM 0.33.0 (the release " \
           "make setup installs there, pyproject.toml)" in text, text
    assert f'vllm.version="0.34.0": runs Model Runner V2 (runner=null: the only runner vLLM 0.34.0 has) on vLLM ' \
           f"0.34.0 (vllm.version=0.34.0, read from {builds / 'wheels' / WHEEL_NAME})" in text, text
    plan = json.loads(next((tmp_path / "plan").rglob("plan.json")).read_text())
    assert plan["jobs"][1]["predicted"]["runner"] == "v2" and plan["jobs"][1]["predicted"]["max_capture_size"] is None
    rc, out = run_cli(tmp_path / "seed", "experiment=mtp_prompt_logprobs", "vllm.version=0.34.0", "dry_run=true",
                      "engine.target_gpu=H100", multirun=True, engine="vllm", env=env, timeout=300)
    text = " ".join(out.split())
    assert rc == 2 and "runner=v1: vLLM 0.34.0 refuses it: VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported: Model " \
                       "Runner V1 has been removed. Unset this variable. (its own validate_environ" in text, text
    assert "Fix: runner=null runs this build's own default runner" in text and "vllm.version=0.33.0" in text


def test_a_patch_that_does_not_apply_to_a_kept_release_is_refused_before_anything_is_built(like_034, tmp_path,
                                                                                          monkeypatch):
    """vllm.patch=fix-53520 on vLLM 0.34.0 patches a file the release no longer has: the plan refuses it from the kept
    wheel (before, the job built 0.34.0's environment and then failed applying the diff); on the installed build the
    same diff applies and nothing is refused."""
    (tmp_path / "wheels").mkdir()
    shutil.copy2(like_034, tmp_path / "wheels" / WHEEL_NAME)
    monkeypatch.setenv("ONEKNOB_BUILDS", str(tmp_path))
    values = {"vllm.version": "0.34.0", "vllm.patch": "fix-53520-protect-prompt-hidden-states", "vllm.commit": None,
              "runner": None}
    facts = vllm_build_facts.build_facts(values, "v1", "cuda", "0.32.0", False)
    said = vllm_build_facts.refusal(values, facts) or ""
    assert said.startswith("vllm.patch=fix-53520-protect-prompt-hidden-states: does not apply to vLLM 0.34.0: "
                           "vllm/v1/worker/gpu_model_runner.py is not in vLLM 0.34.0 (checked on " + WHEEL_NAME), said
    assert "Fix: vllm.patch=null" in said
    here = dict(values, **{"vllm.version": None})
    assert vllm_build_facts.refusal(here, vllm_build_facts.build_facts(here, "v1", "cpu", "0.32.0", True)) is None


# vLLM 0.34.0's own resolution (its _set_cudagraph_sizes, run by the contract check's probe) for K=3, max_num_seqs=64,
# max_num_batched_tokens=2048 on an H100: 61 sizes, the prefill graphs up to 512 tokens, the decode graphs up to 64
# requests x (K+1) = 256 tokens (0.33's rules: 51 sizes, and no split)
SIZES_034 = [1, 2, 3, 4, 5, 6, *range(8, 17, 2), *range(20, 49, 4), *range(56, 257, 8), *range(272, 513, 16)]
RESOLVED_034 = {"max_capture_size": 512, "capture_sizes": SIZES_034, "cudagraph_mode": "FULL_AND_PIECEWISE",
                "max_num_seqs": 64, "max_num_batched_tokens": 2048, "spec_method": "mtp", "spec_k": 3,
                "enforce_eager": False, "runner": "v2", "platform": "cuda", "cudagraph_emulated": False,
                "build": "vllm 0.34.0", "max_prefill_capture_size": 512, "max_decode_capture_requests": 64}


def test_a_0_34_runs_decode_graph_size_is_a_candidate_and_its_sizes_are_not_predicted_from_0_33s_rules():
    """On a release that resolves prefill and decode graphs apart, the widest decode graph n x (K+1) and the widest
    prefill graph (read back from the engine: vllm_plugin.release_graph_sizes) are candidates like any other, and the
    run's capture sizes are not held against 0.33's rules ("not predicted"); on 0.33 they still are."""
    from oneknob.explain import analysis, confounds
    from oneknob.config import quantities

    from types import SimpleNamespace

    from oneknob.engines.vllm.plugin import release_graph_sizes

    assert len(SIZES_034) == 61
    assert release_graph_sizes(SimpleNamespace(max_prefill_cudagraph_capture_tokens=512,
                                               max_decode_cudagraph_capture_requests=64)) == \
        {"max_prefill_capture_size": 512, "max_decode_capture_requests": 64}
    assert release_graph_sizes(SimpleNamespace(max_cudagraph_capture_size=512)) == {}  # 0.33's CompilationConfig
    found = quantities.derived_quantities(RESOLVED_034)
    assert found["decode_requests_x_query_len"] == 256 and found["max_prefill_capture_size"] == 512
    at_256 = confounds.matches({"lo": 256, "hi": 257, "direction": "polluted->clean"}, RESOLVED_034)
    assert {m["quantity"] for m in at_256} >= {"decode_requests_x_query_len", "seqs_x_query_len"}
    assert "max decode graph requests x (K+1)" in confounds.matches_text(at_256)
    old = {k: v for k, v in RESOLVED_034.items() if not k.startswith(("max_prefill", "max_decode"))}
    assert not {"decode_requests_x_query_len", "max_prefill_capture_size"} & set(quantities.derived_quantities(old))
    run = {"resolved": RESOLVED_034, "requested": {"cudagraph.capture": None, "cudagraph.enforce_eager": False,
                                                   "sched.max_num_seqs": 64, "spec.k": 3, "runner": None},
           "defaults": {"default_max_num_seqs": 256, "default_runner": "v2", "max_num_batched_tokens": 2048}}
    assert analysis._check_prediction(run) == []
    on_033 = analysis._check_prediction(run | {"resolved": RESOLVED_034 | {"build": "vllm 0.33.0"}})
    assert any(line.startswith("capture_sizes") for line in on_033), on_033


# -- broken downloads (issue 64: a BadZipFile traceback and exit 1 before) ------------------------------------------

def _small_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("vllm/__init__.py", "")
        out.writestr("vllm/_version.py", "__version__ = '0.34.0'\n")
        out.writestr("vllm-0.34.0.dist-info/METADATA", "Name: vllm\nVersion: 0.34.0\n")
    return path


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 cut short"])
def test_a_broken_kept_wheel_oneknob_did_not_download_is_refused_with_exit_2(content, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ONEKNOB_BUILDS", str(tmp_path))
    (tmp_path / "wheels").mkdir()
    broken = tmp_path / "wheels" / WHEEL_NAME
    broken.write_bytes(content)
    monkeypatch.setattr(vllm_wheels, "_download", lambda *a: pytest.fail("downloaded over a file not oneknob's"))
    assert vllm_contract.main(["--release", "0.34.0", "--no-run"]) == 2
    err = capsys.readouterr().err
    assert f"vllm-contract: {broken}: " in err and "oneknob did not download it" in err and f"rm '{broken}'" in err
    assert ("empty (0 bytes)" if not content else "does not open as a zip (BadZipFile") in err
    assert broken.read_bytes() == content and "Traceback" not in err
    given = tmp_path / "given.whl"
    given.write_bytes(content)
    assert vllm_contract.main(["--source", str(given), "--no-run"]) == 2
    assert f"{given}: " in capsys.readouterr().err and given.exists()


def test_a_broken_download_of_oneknobs_is_deleted_and_fetched_again(tmp_path, monkeypatch):
    folder = tmp_path / "wheels"
    folder.mkdir()
    broken = folder / WHEEL_NAME
    broken.write_bytes(b"PK\x03\x04 cut short")
    broken.with_name(broken.name + vllm_wheels.MARK).write_text("{}")
    fetched = []
    monkeypatch.setattr(vllm_wheels, "_download",
                        lambda name, version, into, stem: fetched.append(version) or _small_wheel(into / WHEEL_NAME))
    said = []
    got = vllm_wheels.wheel("0.34.0", folder, log=said.append)
    assert fetched == ["0.34.0"] and got == broken and vllm_wheels.problem(got) is None
    assert "is deleted and downloaded again" in said[0]


@pytest.mark.skipif(not any("-0.34.0-" in w.name for w in KEPT),
                    reason="no vLLM 0.34.0 wheel kept here (make vllm-contract RELEASE=0.34.0 downloads it, 239 MB)")
def test_vllm_0_34_0s_own_wheel(monkeypatch, capsys, tmp_path):
    wheel = next(w for w in KEPT if "-0.34.0-" in w.name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert vllm_contract.main(["--source", str(wheel)]) == 0
    out = capsys.readouterr().out
    assert "study conf/config.yaml (the default configuration) (runner=null): runs on vLLM 0.34.0" in out
    assert "BREAK  runner=v1: Model Runner V1 is gone in vLLM 0.34.0" in out
    assert "vllm.patch=fix-53520-protect-prompt-hidden-states: does not apply to vLLM 0.34.0" in out
    assert "vLLM 0.34.0's own rule: 61 sizes, max 512 (FULL_AND_PIECEWISE), widest prefill graph 512 tokens, " \
           "widest decode graph 128 requests x (K+1) = 512; oneknob: not predicted" in out
    assert "max_num_seqs=64 max_num_batched_tokens=2048 cudagraph.capture=null: vLLM 0.34.0's own rule: 61 sizes, " \
           "max 512 (FULL_AND_PIECEWISE), widest prefill graph 512 tokens, widest decode graph 64 requests x (K+1) " \
           "= 256" in out
    assert "install: vllm 0.34.0 pins torch==2.14.0; its extensions link libcudart.so.13" in out
    assert "leaves vLLM's own default: None" in out


@pytest.mark.skipif(not any("-0.33.0-" in w.name for w in KEPT),
                    reason="no vLLM 0.33.0 wheel kept here (make vllm-contract RELEASE=0.33.0 downloads it, 336 MB)")
def test_vllm_0_33_0s_own_wheel_runs_both_studies(monkeypatch, capsys, tmp_path):
    wheel = next(w for w in KEPT if "-0.33.0-" in w.name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert vllm_contract.main(["--source", str(wheel)]) == 0
    out = capsys.readouterr().out
    assert "BREAK" not in out and out.count("): runs on vLLM 0.33.0") == 2, out
    assert "vllm.patch=fix-53520-protect-prompt-hidden-states: applies to vLLM 0.33.0" in out
    assert "51 sizes, max 512 (FULL_AND_PIECEWISE); oneknob predicts the same" in out


def test_a_variable_an_env_knob_sets_is_asked_of_the_releases_own_validate_environ(like_034, tmp_path, monkeypatch):
    """Not only runner's variable: every VLLM_* a job's knobs set goes to the kept release's validate_environ before
    anything is built, and a refusal is said under the knob that set it with oneknob's fix. (vLLM 0.34.0 refuses
    variables it removed, envs.removed_environment_variables; the release's answer is stood in for here, the real
    0.34.0 wheel's is asked below.)"""
    (tmp_path / "wheels").mkdir()
    shutil.copy2(like_034, tmp_path / "wheels" / WHEEL_NAME)
    monkeypatch.setenv("ONEKNOB_BUILDS", str(tmp_path))
    asked = []

    def own(source, questions):
        asked.extend(questions["environ"])
        return {"environ": ["VLLM_GONE has been removed. Use VLLM_NEW." if "VLLM_GONE" in q else "ok"
                            for q in questions["environ"]]}

    monkeypatch.setattr(vllm_build_facts, "own", own)
    values = {"vllm.version": "0.34.0", "vllm.patch": None, "vllm.commit": None, "runner": None,
              "env.VLLM_LOGGING_LEVEL": "DEBUG", "env.VLLM_GONE": "1"}
    facts = vllm_build_facts.build_facts(values, "v2", "cuda", "0.32.0", False)
    said = vllm_build_facts.refusal(values, facts) or ""
    assert {"VLLM_GONE": "1"} in asked and {"VLLM_LOGGING_LEVEL": "DEBUG"} in asked
    assert said.startswith("env.VLLM_GONE=1: vLLM 0.34.0 refuses it: VLLM_GONE has been removed. Use VLLM_NEW. (its "
                           f"own validate_environ, run on {WHEEL_NAME}, before anything starts)"), said
    assert "Fix: env.VLLM_GONE=null leaves VLLM_GONE unset" in said
    assert vllm_build_facts.refusal(dict(values, **{"env.VLLM_GONE": None}), facts) is None


@pytest.mark.skipif(not any("-0.34.0-" in w.name for w in KEPT),
                    reason="no vLLM 0.34.0 wheel kept here (make vllm-contract RELEASE=0.34.0 downloads it, 239 MB)")
def test_vllm_0_34_0_refuses_a_variable_it_removed_before_anything_is_built(tmp_path, monkeypatch):
    wheel = next(w for w in KEPT if "-0.34.0-" in w.name)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / wheel.name).symlink_to(wheel)
    monkeypatch.setenv("ONEKNOB_BUILDS", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    values = {"vllm.version": "0.34.0", "vllm.patch": None, "vllm.commit": None, "runner": None,
              "env.VLLM_MARLIN_INPUT_DTYPE": "int8"}
    said = vllm_build_facts.refusal(values, vllm_build_facts.build_facts(values, "v2", "cuda", "0.32.0", False)) or ""
    assert said.startswith("env.VLLM_MARLIN_INPUT_DTYPE=int8: vLLM 0.34.0 refuses it: VLLM_MARLIN_INPUT_DTYPE has been "
                           "removed."), said
