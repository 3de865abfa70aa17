"""The sweeper's composition memo (hydra_plugins/oneknob_sweepers/compose.py) against Hydra's own composition."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from oneknob.config.schema import REPO_ROOT

CHAINS = [  # override lists as planning and the launcher compose them: a prefix, then one value more
    [],
    ["engine=synthetic"],
    ["engine=synthetic", "samples=1"],
    ["engine=synthetic", "samples=1", "cudagraph.capture=256"],
    ["engine=synthetic", "samples=1", "cudagraph.capture=256", "sweep.plan='/tmp/x/plans/1.json'"],
    ["experiment=mtp_prompt_logprobs", "engine=synthetic", "spec.k=0"],
    ["engine=synthetic", "lengths=[128,256]", "++engine_args.enable_prefix_caching=false"],
    ["engine=synthetic", "cudagraph.capture=256", "engine=vllm"],  # a group after a value: Hydra in full
    ["engine=synthetic", "seed=0", "model=tiny"],
]


@pytest.fixture(scope="module")
def hydra_loader(tmp_path_factory):
    import oneknob.config.schema  # noqa: F401  (registers the structured config)
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", [f"hydra.sweep.dir={tmp_path_factory.mktemp('s')}"],
                                           run_mode=RunMode.MULTIRUN)
        yield loader, master


def test_every_composition_is_hydras_own(hydra_loader):
    from hydra_plugins.oneknob_sweepers.compose import ComposeOnce

    loader, master = hydra_loader
    memo = ComposeOnce(loader)
    for overrides in CHAINS:
        ours = memo.load_sweep_config(master, overrides)
        theirs = loader.load_sweep_config(master, overrides)
        assert OmegaConf.to_container(ours) == OmegaConf.to_container(theirs), overrides
        assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(theirs), overrides
        ours.samples = 99  # a caller's change (the launcher sets hydra.job.*) never reaches the memo
        assert memo.load_sweep_config(master, overrides).samples != 99
    # Hydra composed in full only the chains' roots and the lists ending in a config group
    assert memo.full == 5, memo.full


def test_a_refused_override_is_refused_as_hydra_refuses_it(hydra_loader):
    from hydra.errors import ConfigCompositionException

    from hydra_plugins.oneknob_sweepers.compose import ComposeOnce

    loader, master = hydra_loader
    for bad in (["engine=synthetic", "cudagraph.captur=256"], ["engine=synthetic", "samples=many"]):
        with pytest.raises(ConfigCompositionException) as theirs:
            loader.load_sweep_config(master, bad)
        with pytest.raises(ConfigCompositionException) as ours:
            ComposeOnce(loader).load_sweep_config(master, bad)
        assert str(ours.value) == str(theirs.value) and str(ours.value.__cause__) == str(theirs.value.__cause__)
