"""oneknob's sweeper: a thin adapter from Hydra's multirun to oneknob.study.sweep.

`hydra/sweeper=oneknob` is the default for -m; `hydra/sweeper=ablation` is the
same sweeper under the name the study files and README use. Every multirun is a
baseline plus variants (oneknob.plan.jobs.plan_sweep): a knob list on the command
line and an `ablation:` block are two ways to write the same plan.
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext

from hydra_plugins.oneknob_sweepers.compose import ComposeOnce


@dataclass
class OneknobSweeperConf:
    _target_: str = "hydra_plugins.oneknob_sweepers.sweepers.OneknobSweeper"


for _name in ("oneknob", "ablation"):
    ConfigStore.instance().store(group="hydra/sweeper", name=_name, node=OneknobSweeperConf, provider="oneknob")


class OneknobSweeper(Sweeper):
    def setup(self, *, hydra_context, task_function, config) -> None:
        HydraConfig.instance().set_config(config)  # so ${hydra:...} resolves while planning
        self.config = config
        # planning and the launcher compose each job through one memo (compose.py): once, not twice or more
        self.hydra_context = HydraContext(config_loader=ComposeOnce(hydra_context.config_loader),
                                          callbacks=hydra_context.callbacks)
        self.in_process = False  # set by sweep(): the launcher runs jobs in this process
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=self.hydra_context, task_function=task_function, config=config)

    def _compose(self, overrides: list[str]):
        return self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))

    def _launch(self, batches: list[list[str]], first_index: int):
        if not self.in_process:  # each job in a process of its own: launches from threads run side by side
            return self.launcher.launch(batches, initial_job_idx=first_index)
        from oneknob.study.side_by_side import hydra_section

        with hydra_section():  # Hydra's job setup is process-wide; the job's task leaves it while it runs
            return self.launcher.launch(batches, initial_job_idx=first_index)

    def sweep(self, arguments: list[str]) -> Any:
        from oneknob.study import sweep

        from hydra._internal.core_plugins.basic_launcher import BasicLauncher

        # Hydra's basic launcher runs each job in this process: a worker started here can serve the first one
        self.in_process = type(self.launcher) is BasicLauncher
        # a cluster's scheduler places each job's devices itself (hydra/launcher=slurm_gpu); oneknob places the rest
        cluster = "slurm" in type(self.launcher).__name__.lower()
        return sweep.run(self.config, arguments, self._compose, self._launch, in_process=self.in_process,
                         cluster=cluster)
