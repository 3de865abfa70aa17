"""A sweep's lifecycle: plan every job, refuse before anything starts, run the jobs side by side, compare.

    plan_sweep (every job composed and checked; refusals exit 2, nothing recorded), the devices placed
      -> dry run: the plan, printed and in plan.json (where each engine goes); or:
      -> the parent MLflow run -> each job's plan file -> the reference ahead, then every job as soon as a device
         set is free (oneknob.study.side_by_side; under Slurm the baseline, then the variants, placed by Slurm)
      -> the comparison (summary.json, report.md, plots) -> the parent's status -> the exit code

The Hydra plugin (hydra_plugins/oneknob_sweepers) is a thin adapter that hands `run` the command-line
arguments, a way to compose a job's config and a way to launch jobs. Jobs nest under the parent run
wherever the launcher runs them (its id is in each job's plan); a failing job fails alone.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NoReturn

from rich.markup import escape

from oneknob import files
from oneknob.config import commands, secrets
from oneknob.explain import compare
from oneknob.study import bisect, flag_reduction, followups, side_by_side, sweep_dir, terminal
from oneknob.plan import jobs as plan
from oneknob.plan import single_variable as sv
from oneknob.study.terminal import console
from oneknob.plan.jobs import PlannedJob, SweepContext, SweepPlan
from oneknob.record.journaled import JournaledTracker
from oneknob.record.tracking import reap_stale_runs


def _outcome(job: PlannedJob, ret) -> dict:
    from hydra.core.utils import JobStatus

    if ret.status == JobStatus.COMPLETED:
        return ret.return_value
    error = ret._return_value
    return {"status": "failed", "name": job.plan.name, "knob": job.plan.knob,
            "error": f"{type(error).__name__}: {error}".splitlines()[0]}


def _provision(plans: list) -> None:
    """A probe the bisection asks for mid-sweep: its build, and the engine's own check, before it launches."""
    plan.provision(plans, console.print)


def _command(arguments: list[str]) -> str:
    script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else "run.py"
    masked = secrets.mask_arguments(arguments)  # recorded and printed: a from_command line's secrets masked
    return f"python {shlex.quote(script)} -m " + " ".join(shlex.quote(a) for a in sv.as_typed(masked))


def _prepared(config, sweep: SweepPlan, in_process: bool, placement=None):
    """The baseline job's worker, started as the engine's check of the sweep is due (oneknob.run.prepared), where
    the launcher runs the jobs in this process and the baseline is launched first into hydra.sweep.dir/0; where
    the device is exclusive (a GPU) and a reference's engine runs first, none. None otherwise. Where no check is
    due it is not started ahead (unlike a one-job command's): a sweep rerun whose points are all cached would
    import vLLM in a host for nothing, and a sweep's setup is small against its jobs."""
    from omegaconf import OmegaConf

    from oneknob.run.prepared import Prepared, allowed

    base = sweep.baseline
    searched = sweep.bisection is not None or (sweep.reduction is not None and sweep.reduction.drop == "minimal")
    try:
        subdir = OmegaConf.to_container(config.hydra.sweep, resolve=False).get("subdir")
    except Exception:  # a config without Hydra's node (planned in a test): no job directory to predict
        subdir = None
    if not in_process or sweep.dry_run or searched or subdir != "${hydra.job.num}" or not allowed(base):
        return None
    if placement is not None and len(placement.sets) > 1:  # which set the baseline gets is known at its launch
        return None
    devices = placement.sets[0] if placement is not None and placement.placed else None
    return Prepared(replace(base, devices=devices), sweep.dir / "0", console.print)


def run(config, arguments: list[str], compose: Callable, launch: Callable, in_process: bool = False,
        cluster: bool = False) -> list:
    """Plan, run and compare one sweep; exits with the terminal's codes when something failed or was refused.
    `in_process`: the launcher runs the jobs in this process (the baseline's worker may be started early, and
    the workers of one build and environment are forked from one process that imported the engine:
    hosts.hosting). `cluster`: the launcher's scheduler places the jobs' devices (Slurm): the baseline, then the
    variants, as it places them; else oneknob places them (`devices`) and runs the jobs side by side."""
    from oneknob.run.hosts import hosting

    with hosting(in_process):
        try:
            return _run(config, arguments, compose, launch, in_process, cluster)
        finally:
            sweep_dir.release_all()


def _run(config, arguments: list[str], compose: Callable, launch: Callable, in_process: bool,
         cluster: bool = False) -> list:
    terminal.started()
    terminal.sweep_started()
    with terminal.refusals():
        planner = flag_reduction.plan if flag_reduction.asked(config) else \
            bisect.plan if bisect.asked(config) else plan.plan_sweep
        sweep = planner(config, arguments, compose)
        plan.check_output_dir("hydra.sweep.dir", sweep.dir)
        allowed = followups.budget(config)
        placement = None if cluster else side_by_side.placement(config, [job.plan for job in sweep.jobs])
        sweep_id, command = uuid.uuid4().hex[:12], _command(arguments)
        resumed = sweep_dir.claim(sweep.dir, sweep_id, command, record=not sweep.dry_run)  # the last check
    if resumed:
        console.say(f"[yellow]note:[/] {escape(resumed)}")
    for note in [*sweep.notes, *(sweep.reduction.line.notes if sweep.reduction is not None else []),
                 *(placement.notes if placement is not None else [])]:
        console.say(f"[yellow]note:[/] {escape(note)}")
    if placement is not None and not placement.placed and not in_process:
        placement = None  # local processes on the host's one device (CPU cores): all at once, as they share it
    if caveat := terminal.cpu_caveat(sweep.baseline, sweep.varied):
        console.print(caveat)
    plans = [job.plan for job in sweep.jobs]
    prepared = _prepared(config, sweep, in_process, placement)
    try:
        # the builds, and the engine's own check of every configuration it can ask here
        pasted = sweep.reduction.line if sweep.reduction is not None else None
        with terminal.refusals(), flag_reduction.from_line(pasted):
            resolved = plan.provision(plans, console.print, meanwhile=prepared) \
                if not sweep.dry_run or sweep.baseline.runs_here else None
    except BaseException:
        if prepared is not None:
            prepared.discard()
        raise
    if prepared is not None:
        prepared.offer()  # the baseline's job takes it (job.run_job), or the end of its launch ends it
    if sweep.dry_run:
        sweep.dir.mkdir(parents=True, exist_ok=True)
        terminal.print_plan(plans, sweep.dir, resolved)
        if placement is not None:
            side_by_side.show_plan(placement, plans, sweep.dir)
        if sweep.bisection is not None:
            for line in bisect.describe_plan(sweep.bisection):
                console.print(line)
        if sweep.reduction is not None:
            for line in flag_reduction.describe_plan(sweep.reduction):
                console.print(escape(line))
        if allowed and not followups.skipped(sweep):
            console.say(f"then up to {allowed} follow-up run(s) (explain.followups={allowed}): each moves one "
                          "candidate quantity of an edge no run of the sweep has explained, to see if the edge follows")
        return []
    sweep.dir.mkdir(parents=True, exist_ok=True)
    base = sweep.baseline
    # Journal first here too: the parent's status reaches MLflow through sync after an outage.
    with terminal.refusals():
        tracker = JournaledTracker(sweep.dir / "journal.jsonl", base.tracking_uri, base.experiment, console=console,
                                   tags=base.tags)
    reap_stale_runs(tracker, console)
    parent = tracker.start_run(f"sweep {sweep.varied or 'baseline'}",
                               {"oneknob.role": "sweep", "oneknob.sweep_id": sweep_id,
                                "oneknob.knobs": sweep.varied or "", "oneknob.sweep_dir": str(sweep.dir),
                                "oneknob.command": command}
                               | ({"oneknob.skipped": json.dumps(sweep.notes)} if sweep.notes else {}))
    tracker.log_params(parent, {f"baseline.{k}": v for k, v in base.knobs.items()} | {"jobs": len(sweep.jobs)})
    console.say(f"[bold]sweep {sweep_id}[/]: {len(sweep.jobs)} job(s) into MLflow experiment "
                  f"{escape(base.experiment)}, dir {escape(terminal.shown(sweep.dir))}")
    if tracker.disk_problem:  # the sweep's journal cannot take its run (said): no job to lose
        _unwritten(tracker, parent, sweep_id, None, ran=False)
    if simulation := terminal.simulation_line(base.engine):
        console.say(f"[bold yellow]{escape(simulation)}[/]")
    if placement is not None and placement.placed:
        console.say(f"devices: {escape(placement.text())}")
    context = SweepContext(sweep_id, parent, str(sweep.dir), 0, side_by_side=placement is not None,
                           baseline_predicted=base.predicted if placement is not None else None,
                           pid=os.getpid(), host=socket.gethostname())

    def batch(job: PlannedJob, index: int, devices=None) -> list[str]:  # the job's plan file, and what Hydra
        against = job.plan.sweep.against if job.plan.sweep else None  # composes it from; a follow-up: the run
        own = replace(context, index=index, against=against,   # it tests, written whole before it is launched
                      baseline_predicted=None if against else context.baseline_predicted)
        job_plan = replace(job.plan, sweep=own, devices=devices)
        path = sweep.dir / "plans" / f"{index}.json"
        try:
            path.parent.mkdir(exist_ok=True)
            with files.named(path):
                path.write_text(job_plan.to_json())
        except OSError as exc:  # a full disk before the job starts
            _unwritten(tracker, parent, sweep_id, files.write_problem(exc, path, f"the plan of job {index}"),
                       ran=bool(launched))
        return [*job.overrides, f"sweep.plan={plan.override_value(str(path))}"]

    launched: list[int] = []  # the indices launched so far (a plan that cannot be written: did any job run?)
    given_launch = launch

    def launch(batches_, index):
        launched.append(index)
        return given_launch(batches_, index)

    searched = sweep.bisection is not None or (sweep.reduction is not None and sweep.reduction.drop == "minimal")
    unplaced = not searched and placement is None  # Slurm's placement, or local processes on the host's one device
    batches = [batch(job, index) for index, job in enumerate(sweep.jobs)] if unplaced else []

    launch_one = lambda job, index: list(launch([batch(job, index)], index))[0]  # noqa: E731
    scheduler = None
    if placement is not None:  # every job as soon as a device set is free (oneknob.study.side_by_side)
        def ended(index: int) -> None:
            if index == 0 and prepared is not None:
                prepared.discard()  # the baseline's, if it did not take it

        scheduler = side_by_side.SideBySide(
            sweep.dir, placement, lambda job, index, devices: list(launch([batch(job, index, devices)], index))[0],
            _outcome, ended)
        launch_one = scheduler.one
    try:
        if scheduler is not None:
            scheduler.measure_references([job.plan for job in sweep.jobs], context)
        if sweep.bisection is not None:  # only the jobs the search asks for, each round's side by side
            returns = bisect.drive(sweep, launch_one, compose, _provision, _outcome, console.say,
                                   launch_all=scheduler.run if scheduler is not None else None)
            tracker.set_tags(parent, followups.tag(followups.none_run(sweep, allowed)))
        elif searched:  # from_command.drop=minimal: ddmin's probes, one at a time
            returns = flag_reduction.drive(sweep, launch_one, _provision, _outcome, console.say)
            tracker.set_tags(parent, followups.tag(followups.none_run(sweep, allowed)))
        else:
            if scheduler is not None:  # variants beside the baseline: what they need of it, they wait for
                returns = scheduler.run([(job, index) for index, job in enumerate(sweep.jobs)],
                                        stops=lambda outcome: outcome.get("stops_sweep"))
                stopped = scheduler.stopped
            else:
                try:
                    returns = list(launch(batches[:1], 0))  # the baseline first: the variants are diffed against it
                finally:
                    if prepared is not None:
                        prepared.discard()
                stopped = _outcome(sweep.jobs[0], returns[0]).get("stops_sweep")  # a reference failing its check
                if len(batches) > 1 and not stopped:
                    returns += list(launch(batches[1:], 1))
            # the separating runs, until each edge is explained or the budget spent; one at a time, each on the
            # first free set (the next test is chosen from the runs so far, so that it is the same on any placement)
            if not stopped and tracker.ok:
                done = {job.plan.name: _outcome(job, ret) for job, ret in zip(sweep.jobs, returns)}
                extra, extra_returns, record = followups.drive(
                    sweep, allowed, lambda said: compare.summarize_sweep(tracker.client, tracker.experiment_id,
                                                                         sweep_id, said),
                    launch_one, compose, _provision, _outcome, lambda line: console.say(escape(line)), done)
                sweep.jobs.extend(extra)
                returns += extra_returns
                tracker.set_tags(parent, followups.tag(record))
    except KeyboardInterrupt:
        tracker.finish(parent, "KILLED")
        terminal.interrupted()
    except Exception as exc:  # the launcher itself: sbatch refused, a job process killed by the scheduler
        tracker.finish(parent, "FAILED")
        console.print(f"[red]the launcher failed ({type(exc).__name__}); sweep {sweep_id} marked FAILED.[/] "
                      "Jobs that ended are in MLflow and their points in the cache; compare them with: "
                      f"{escape(commands.compare(sweep_id, tracker.uri))}, or rerun the same command to resume")
        raise
    finally:
        if scheduler is not None:
            scheduler.finish()
            if prepared is not None:
                prepared.discard()
    outcomes = [_outcome(job, ret) for job, ret in zip(sweep.jobs, returns)]
    if sweep.bisection is not None:
        found = bisect.answer(sweep)
        tracker.set_tags(parent, {"oneknob.bisect": json.dumps(found)})
        for line in bisect.sentences(found):
            console.say(escape(line))
        if found["stopped"] and all(o["status"] not in ("failed", "killed") for o in outcomes):
            # a probe the search needed could not be planned: the answer is incomplete, and the exit code says so
            outcomes.append({"status": "failed", "name": f"bisect {found['knob']}", "knob": found["knob"],
                             "error": found["stopped"]})
    outcomes += [{"status": "failed", "name": job.plan.name, "knob": job.plan.knob,
                  "error": "not run: the baseline stopped the sweep, as every job would fail the way it did"}
                 for job in sweep.jobs[len(returns):]]
    closing = None
    if sweep.reduction is not None:
        if not searched:
            flag_reduction.record(sweep.reduction, sweep.jobs[:len(returns)], outcomes)
        found = flag_reduction.answer(sweep)
        tracker.set_tags(parent, {"oneknob.from_command": json.dumps(found)})
        if found["stopped"] and all(o["status"] not in ("failed", "killed") for o in outcomes):
            outcomes.append({"status": "failed", "name": "from_command", "knob": None, "error": found["stopped"]})

        def closing(summary: dict | None) -> list[str]:  # the terminal's last lines: the answer, the minimal line
            from oneknob.explain import from_command_text

            said = (summary or {}).get("from_command") or found
            return from_command_text.closing(said)
    return _finish(sweep, sweep_id, command, tracker, parent, outcomes, returns, closing)


def _unwritten(tracker, parent: str, sweep_id: str, problem: str | None, ran: bool) -> NoReturn:
    """A file the sweep needs could not be written (a full disk): said once, the sweep marked FAILED, exit 1 with
    no traceback; what ended is kept (`ran`: some job was launched, so there may be something to compare)."""
    tracker.finish(parent, "FAILED")
    if problem:
        console.print(f"[red]{escape(problem)}[/]")
    console.print(f"sweep {sweep_id} marked FAILED; " + (
        "jobs that ended are in MLflow and their points in the cache: compare them with "
        f"{escape(commands.compare(sweep_id, tracker.uri))}" if ran else
        "no job had started; free space and rerun the same command"))
    sys.exit(terminal.EXIT_FAILED)


def _finish(sweep: SweepPlan, sweep_id: str, command: str, tracker, parent: str, outcomes: list[dict],
            returns: list, closing: Callable | None = None) -> list[Any]:
    code, summary = terminal.exit_code(outcomes, tracker.ok), None
    if code == terminal.EXIT_TRACKING_INCOMPLETE:
        console.print(f"[yellow]comparison skipped: MLflow lacks part of this sweep; upload it with "
                      f"{escape(commands.sync(sweep.dir, tracking_uri=tracker.uri))}, then "
                      f"{escape(commands.compare(sweep_id, tracker.uri))}[/]")
    else:
        summary = compare.after_sweep(sweep_id=sweep_id, sweep_dir=sweep.dir, tracker=tracker, parent_run_id=parent,
                                      outcomes=outcomes, shown_warnings=terminal.shown_warnings(sweep.dir))
    unreported = summary is None and code != terminal.EXIT_TRACKING_INCOMPLETE  # said by after_sweep
    unjournaled = tracker.disk_problem  # said as it happened; MLflow has it all, the journal-first record not
    tracker.finish(parent, "FAILED" if code == terminal.EXIT_FAILED or unreported or unjournaled else "FINISHED")
    if code == terminal.EXIT_FAILED:
        failed = [o for o in outcomes if o["status"] in ("failed", "killed")]
        console.print(f"[red]{len(failed)} of {len(outcomes)} job(s) failed:[/]")
        for outcome in failed:
            console.print(f"  {escape(outcome['name'])}: {escape(outcome.get('error', ''))}")
        console.print(f"retry: {escape(command)}  (finished jobs come from the cache: only the failed ones measure)")
    elif code == terminal.EXIT_TRACKING_INCOMPLETE:
        console.print(f"[yellow]all {len(outcomes)} job(s) finished, but MLflow lacks part of the sweep: "
                      f"{escape(commands.sync(sweep.dir, tracking_uri=tracker.uri))} (exit code {code})[/]")
    for line in closing(summary) if closing else []:
        console.print(escape(line), soft_wrap=True)
    if unreported and not code:  # every job finished, but the report a sweep exists to write is missing
        console.print(f"[red]sweep {sweep_id} failed: its report could not be written (said above); the jobs' "
                      "results are in MLflow, and the command above rebuilds it[/]")
        code = terminal.EXIT_FAILED
    if unjournaled and not code:
        console.print(f"[red]sweep {sweep_id} failed: {escape(unjournaled)}[/]")
        code = terminal.EXIT_FAILED
    if code:
        sys.exit(code)
    return [returns]
