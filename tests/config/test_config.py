"""Composition of the real configs: defaults, knob overrides, typos and wrong types."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException

import oneknob.config.schema  # noqa: F401  (registers the structured schema)
from oneknob.config import knobs
from oneknob.config.schema import REPO_ROOT


@pytest.fixture
def compose_cfg(tmp_path):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        yield lambda *overrides: compose("config", overrides=[f"hydra.run.dir={tmp_path}", *overrides])
    GlobalHydra.instance().clear()


def test_defaults_are_the_seed_baseline(compose_cfg):
    """The seed's baseline, but for the runner: null, the build's own default (vLLM 0.34.0 has no V1 and refuses
    runner=v1); the seed's study pins v1 itself (experiments/mtp_prompt_logprobs.yaml)."""
    cfg = compose_cfg()
    assert knobs.from_config(cfg) == {"cudagraph.capture": None, "cudagraph.enforce_eager": False,
                                      "sched.max_num_seqs": 128, "spec.k": 3, "runner": None,
                                      "vllm.version": None, "vllm.patch": None, "vllm.commit": None}
    assert cfg.engine.name == "vllm" and cfg.model.name == "tiny-mtp"
    assert cfg.reference == {"cudagraph": {"enforce_eager": True}, "spec": {"k": 0}}


@pytest.mark.parametrize("override,key,expected", [
    ("cudagraph.capture=256", "cudagraph.capture", 256),
    ("cudagraph.enforce_eager=true", "cudagraph.enforce_eager", True),
    ("sched.max_num_seqs=64", "sched.max_num_seqs", 64),
    ("sched.max_num_seqs=null", "sched.max_num_seqs", None),
    ("spec.k=0", "spec.k", 0),
    ("runner=v2", "runner", "v2"),
    ("runner=null", "runner", None),
])
def test_each_knob_override(compose_cfg, override, key, expected):
    assert knobs.from_config(compose_cfg(override))[key] == expected


def test_engine_group_options(compose_cfg):
    assert compose_cfg("engine=synthetic").engine.fault.pollute is True
    assert compose_cfg("engine=vllm").engine.name == "vllm"


def test_typo_fails_at_compose_time_naming_the_key(compose_cfg):
    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg("cudagraph.captur=256")
    assert "captur" in str(err.value) + str(err.value.__cause__)


def test_wrong_type_fails_at_compose_time_naming_the_key(compose_cfg):
    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg("spec.k=three")
    assert "spec.k" in str(err.value) + str(err.value.__cause__)


def test_seed_study_experiment_composes(compose_cfg):
    cfg = compose_cfg("experiment=mtp_prompt_logprobs")
    assert cfg.spec.k == 3 and cfg.sched.max_num_seqs == 128 and cfg.runner == "v1"
    assert {256, 257, 512, 513} <= set(cfg.lengths)
    assert knobs.flatten(dict(cfg.ablation))
