"""oneknob's sweepers: one knob at a time, checked before any engine starts.

hydra/sweeper=oneknob (the default for -m): Hydra's basic expansion of the
command line, behind the single-variable guard: at most one knob varies.
hydra/sweeper=ablation: the baseline (the composed config) first, then one job
per (knob, value) of the config's `ablation:` block that differs from it.

Both compose and check every job's config before launching anything, create
the sweep's parent MLflow run and hand its id to the jobs as overrides (so
jobs in other processes or hosts nest under it), keep going when a job fails,
write the comparison at the end, and exit non-zero listing failed jobs with
the command that retries just them.
"""



import json
import shlex
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf


@dataclass
class OneknobSweeperConf:
    _target_: str = "hydra_plugins.oneknob_sweepers.sweepers.OneknobSweeper"
    max_batch_size: int | None = None


@dataclass
class AblationSweeperConf:
    _target_: str = "hydra_plugins.oneknob_sweepers.sweepers.AblationSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="oneknob", node=OneknobSweeperConf, provider="oneknob")
ConfigStore.instance().store(group="hydra/sweeper", name="ablation", node=AblationSweeperConf, provider="oneknob")


def override_value(value: Any) -> str:
    """A Python value as a Hydra override value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class PlannedJob:
    knob: str | None  # the varied knob; None for the baseline
    overrides: tuple[str, ...]  # the job's own overrides (without the sweep.* ones)
    knobs: dict


class _OneknobSweeperBase(Sweeper):
    def setup(self, *, hydra_context, task_function, config) -> None:
        HydraConfig.instance().set_config(config)  # so ${hydra:...} resolves while planning
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        """Refuse bad sweeps with one clear message and exit 2, before any engine starts."""
        from oneknob.app import EXIT_REFUSED, REFUSALS
        from oneknob.job import console

        try:
            return self._sweep(arguments)
        except REFUSALS as exc:
            console.print(f"[red]refused:[/] {exc}")
            console.print("nothing was started and no run was recorded")
            sys.exit(EXIT_REFUSED)

    # -- shared ------------------------------------------------------------
    def _compose(self, overrides: list[str]):
        return self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))

    def _preflight(self, jobs: list[PlannedJob]) -> tuple[list[PlannedJob], list, list[str]]:
        """Compose and check every job before any engine starts.

        A variant this machine's engine cannot run (UnavailableHere) is dropped with a note;
        any other problem refuses the whole sweep.
        """
        from oneknob.plan import UnavailableHere, plan_job

        kept, plans, skipped = [], [], []
        for job in jobs:
            cfg = self._compose(list(job.overrides))
            try:
                plan = plan_job(cfg)
            except UnavailableHere as exc:
                if job.knob is None:
                    raise
                skipped.append(f"{job.knob}={override_value(job.knobs[job.knob])} not run here: {exc}")
                continue
            kept.append(job)
            plans.append(plan)
        return kept, plans, skipped

    def _run(self, jobs: list[PlannedJob], *, baseline_first: bool) -> list:
        from oneknob.app import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TRACKING_INCOMPLETE, print_plan
        from oneknob.job import console
        from oneknob.tracking import JournaledTracker, reap_stale_runs

        jobs, plans, skipped = self._preflight(jobs)
        for note in skipped:
            console.print(f"[yellow]skipped[/] {note}")
        if self.config.dry_run:
            print_plan(self.config, [(job.knob, job.knobs) for job in jobs])
            return []
        sweep_dir = Path(self.config.hydra.sweep.dir).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        sweep_id = uuid.uuid4().hex[:12]
        # Journal first here too: the parent's status reaches MLflow through sync after an outage.
        tracker = JournaledTracker(sweep_dir / "journal.jsonl", plans[0].tracking_uri,
                                   plans[0].cfg.tracking.experiment, console=console)
        reap_stale_runs(tracker, console)
        varied = sorted({job.knob for job in jobs if job.knob})
        parent = tracker.start_run(f"sweep {', '.join(varied) or 'baseline'}",
                                   {"oneknob.role": "sweep", "oneknob.sweep_id": sweep_id,
                                    "oneknob.knobs": ",".join(varied), "oneknob.sweep_dir": str(sweep_dir),
                                    "oneknob.command": self._command()}
                                   | ({"oneknob.skipped": json.dumps(skipped)} if skipped else {}))
        tracker.log_params(parent, {f"baseline.{k}": v for k, v in jobs[0].knobs.items()
                                    if jobs[0].knob is None} | {"jobs": len(jobs)})
        console.print(f"[bold]sweep {sweep_id}[/]: {len(jobs)} job(s), parent run {parent}, dir {sweep_dir}")
        batches = [[*job.overrides, f"sweep.id={sweep_id}", f"sweep.parent_run_id={parent}",
                    f"sweep.knob={override_value(job.knob)}", f"sweep.dir={sweep_dir}"] for job in jobs]
        returns, status = [], "FINISHED"
        try:
            if baseline_first:
                returns += list(self.launcher.launch(batches[:1], initial_job_idx=0))
                if len(batches) > 1:
                    returns += list(self.launcher.launch(batches[1:], initial_job_idx=1))
            else:
                returns += list(self.launcher.launch(batches, initial_job_idx=0))
        except KeyboardInterrupt:
            tracker.finish(parent, "KILLED")
            console.print("[red]interrupted: finished points are kept; rerun the same command to resume[/]")
            raise SystemExit(EXIT_INTERRUPTED) from None
        except Exception as exc:  # the launcher itself: sbatch refused, a job process killed by the scheduler
            tracker.finish(parent, "FAILED")
            console.print(f"[red]the launcher failed ({type(exc).__name__}); sweep {sweep_id} marked FAILED.[/] "
                          "Jobs that ended are in MLflow and their points in the cache; compare them with: "
                          f"python -m oneknob.compare --sweep {sweep_id}, or rerun the same command to resume")
            raise
        outcomes = [self._outcome(job, ret) for job, ret in zip(jobs, returns)]
        failed = [(job, o) for job, o in zip(jobs, outcomes) if o["status"] in ("failed", "killed")]
        untracked = [o for o in outcomes if o.get("tracking")]
        if untracked or not tracker.ok:
            console.print(f"[yellow]comparison skipped: MLflow lacks part of this sweep; upload it with "
                          f"python -m oneknob.sync {sweep_dir}, then python -m oneknob.compare --sweep {sweep_id}[/]")
        else:
            self._compare(sweep_id, sweep_dir, tracker, parent, outcomes)
        if failed:
            status = "FAILED"
        tracker.finish(parent, status)
        if failed:
            console.print(f"[red]{len(failed)} of {len(jobs)} job(s) failed:[/]")
            for job, outcome in failed:
                knob = f"{job.knob}={override_value(job.knobs[job.knob])}" if job.knob else "baseline"
                console.print(f"  {knob}: {outcome.get('error', '')}")
                console.print(f"    retry: {self._retry_command(job, sweep_dir)}")
            sys.exit(EXIT_FAILED)
        if untracked or not tracker.ok:
            console.print(f"[yellow]all {len(jobs)} job(s) finished, but MLflow lacks part of the sweep: "
                          f"python -m oneknob.sync {sweep_dir} (exit code {EXIT_TRACKING_INCOMPLETE})[/]")
            sys.exit(EXIT_TRACKING_INCOMPLETE)
        return [returns]

    def _retry_command(self, job: PlannedJob, sweep_dir: Path) -> str:
        """One job alone, as the sweep ran it: named after its knob, checked against the sweep's baseline."""
        script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else "run.py"
        overrides = [*job.overrides, f"sweep.knob={override_value(job.knob)}", f"sweep.dir={sweep_dir}"]
        return f"python {shlex.quote(script)} " + " ".join(shlex.quote(o) for o in overrides)

    def _outcome(self, job: PlannedJob, ret) -> dict:
        if ret.status == JobStatus.COMPLETED:
            return ret.return_value
        error = ret._return_value
        return {"status": "failed", "knob": job.knob, "knobs": job.knobs,
                "error": f"{type(error).__name__}: {error}".splitlines()[0]}

    def _compare(self, sweep_id, sweep_dir, tracker, parent, outcomes) -> None:
        from oneknob import compare

        compare.after_sweep(sweep_id=sweep_id, sweep_dir=sweep_dir, tracker=tracker, parent_run_id=parent,
                            outcomes=outcomes, config=self.config)

    def _command(self) -> str:
        task = list(self.config.hydra.overrides.task)
        sweeper = self.config.hydra.runtime.choices.get("hydra/sweeper")
        prefix = [] if sweeper in (None, "oneknob") else [f"hydra/sweeper={sweeper}"]
        return "python run.py -m " + " ".join(shlex.quote(o) for o in prefix + task)


class OneknobSweeper(_OneknobSweeperBase):
    """Hydra's cartesian expansion, refused when it varies more than one knob."""

    def __init__(self, max_batch_size: int | None = None):
        self.max_batch_size = max_batch_size

    def _sweep(self, arguments: list[str]) -> Any:
        from oneknob import guard, knobs

        shape = guard.check_sweep(arguments)
        expanded = [list(batch_job) for batch in BasicSweeper.split_arguments(
            guard.parse(arguments), self.max_batch_size) for batch_job in batch]
        jobs = []
        for overrides in expanded:
            cfg = self._compose(overrides)
            jobs.append(PlannedJob(shape.knob, tuple(overrides), knobs.from_config(cfg)))
        return self._run(jobs, baseline_first=False)


class AblationSweeper(_OneknobSweeperBase):
    """Baseline plus one job per (knob, value) of the `ablation:` block."""

    def __init__(self):
        pass

    def _sweep(self, arguments: list[str]) -> Any:
        from oneknob import guard, knobs

        shape = guard.check_sweep(arguments)
        if shape.varied:
            knob = shape.knob
            raise guard.GuardError(
                f"{knob}={','.join(shape.varied[knob])}: with hydra/sweeper=ablation the values to try go "
                f"in the ablation block, not in a comma list: '+ablation.{knob}=[{','.join(shape.varied[knob])}]'")
        fixed = [o for o in arguments if not o.lstrip("+~").startswith("hydra/sweeper")]
        block = OmegaConf.to_container(self.config.ablation, resolve=True) or {}
        if not block:
            raise guard.GuardError(
                "ablation={}: the ablation sweeper needs knobs to vary; add an ablation block to the "
                "experiment (ablation: {cudagraph: {capture: [256]}}) or pass '+ablation.cudagraph.capture=[256]'")
        try:
            variants = knobs.flatten(block)
        except knobs.KnobError as exc:
            raise guard.GuardError(f"ablation: {exc}") from None
        baseline = knobs.from_config(self.config)
        jobs = [PlannedJob(None, tuple(fixed), baseline)]
        for key, values in variants.items():
            values = values if isinstance(values, list) else [values]
            for value in values:
                try:
                    knobs.check(key, value)
                except knobs.KnobError as exc:
                    raise guard.GuardError(f"ablation: {exc}") from None
                if value == baseline[key]:
                    continue  # the baseline already measures it
                jobs.append(PlannedJob(key, (*fixed, f"{key}={override_value(value)}"),
                                       baseline | {key: value}))
        for job in jobs:  # never launch a job that differs from the baseline in two knobs
            assert sum(job.knobs[k] != baseline[k] for k in baseline) <= 1, job
        return self._run(jobs, baseline_first=True)



