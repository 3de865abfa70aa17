"""Jobs side by side: each job of a sweep runs as soon as a device set is free (oneknob.run.devices).

    the references first, each measured once per sweep in a thread of this process, on a set of its own
      -> the jobs in order, each launched through Hydra's launcher (`launch(job, index, devices)`) in a thread
         of its own once the set first in line is free; its plan names its devices (JobPlan.devices) and that
         it runs beside others (SweepContext.side_by_side)
      -> each job's end marked (<sweep dir>/ended/<index>), its set freed for the next; placement.json records
         every lease

What a variant needs of the baseline (oneknob.study.published): its resolved config, for the single-variable
diff, and its transitions, added to the variant's grid. Neither needs the baseline's engine to be done: a
variant starts its engine meanwhile (a pin the resolution rules predict for it is started directly), waits for
the resolved config once its own engine is up, and for the transitions once it measured its own grid (Job._ahead:
the same order on every placement). A job judges
nothing before the reference is measured, and starts its engine meanwhile too. So on N sets the references,
the baseline and the first variants start in one round of engine starts, and 8 engines on 4 sets take about
two rounds. The one thing that stops the launches is a job that says every job would fail as it did
(`stops`: a reference failing its own check); the jobs running then end by themselves.

Hydra's basic launcher runs a job in this process, and its setup (HydraConfig, the job's logging) is
process-wide: a launch runs inside `hydra_section()`, one thread at a time, and the job's task leaves it while
the job runs (`outside_hydra()`, oneknob.cli), its Python logging routed to its own run.log by thread. An
interrupt (Ctrl-C, SIGTERM) reaches the main thread, which stops every job thread (oneknob.run.stopping): each
job's run ends KILLED and its worker killed, whatever device it is on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.markup import escape

from oneknob.console import JobProgress
from oneknob.plan.jobs import JobPlan, PlannedJob, SweepContext
from oneknob.record import store
from oneknob.record.journaled import JournaledTracker
from oneknob.run import devices, stopping
from oneknob.study import published, reference
from oneknob.study.job import candidates
from oneknob.study.terminal import console

JOIN_AFTER_INTERRUPT_S = 60.0  # the longest the sweep waits for its job threads to end after an interrupt


# -- Hydra's process-wide setup, one launch at a time ------------------------------------------------------------
_hydra = threading.Lock()
_holding = threading.local()


class _Router(logging.Handler):
    """Records to the file handlers of the job whose thread logged them (each job's run.log)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_thread: dict[int, list[logging.Handler]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        for handler in self.by_thread.get(record.thread, ()):
            if record.levelno >= handler.level:
                handler.handle(record)

    def install(self) -> None:
        root = logging.getLogger()
        if self.by_thread and self not in root.handlers:
            root.addHandler(self)


_router = _Router()


@contextlib.contextmanager
def hydra_section() -> Iterator[None]:
    """A launch by Hydra's basic launcher, while other jobs of the sweep run: one thread at a time."""
    with _hydra:
        _holding.yes = True
        try:
            yield
        finally:
            _holding.yes = False
            _router.install()  # Hydra's logging setup after a job replaced root's handlers


@contextlib.contextmanager
def outside_hydra() -> Iterator[None]:
    """A job's task, launched in hydra_section(): the job runs outside it, so the next launch goes on; the file
    handlers Hydra just made for it (run.log) take its thread's records. Elsewhere nothing changes."""
    if not getattr(_holding, "yes", False):
        yield
        return
    root, thread = logging.getLogger(), threading.get_ident()
    own = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    for handler in own:
        root.removeHandler(handler)
    _router.by_thread[thread] = own
    _router.install()
    _holding.yes = False
    _hydra.release()
    try:
        yield
    finally:
        _hydra.acquire()
        _holding.yes = True
        _router.by_thread.pop(thread, None)
        for handler in own:
            handler.flush()


# -- the references, measured ahead ------------------------------------------------------------------------------
def reference_groups(plans: list[JobPlan]) -> list[tuple[JobPlan, set[int]]]:
    """One reference engine per stored reference the jobs read (its key, longest and shortest length, top-k),
    with every job's check thresholds, so that no job needs a reference engine of its own for its check."""
    groups: dict[tuple, tuple[JobPlan, set[int]]] = {}
    for plan in plans:
        if plan.reference_knobs is None or not plan.runs_here:
            continue
        key = (str(reference.store_dir(plan)), max(plan.lengths), min(plan.lengths), reference.topk_of(plan))
        thresholds = set(candidates(plan, plan.predicted).values()) if plan.search.suspects else set()
        first, known = groups.setdefault(key, (plan, set()))
        known |= thresholds
    return list(groups.values())


@dataclass
class _Launched:
    job: PlannedJob
    index: int
    lease: devices.Lease
    thread: threading.Thread | None = None
    ret: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)  # its launch returned, its set is free


class SideBySide:
    """The sweep's scheduler over the free device sets of `placement`. `launch(job, index, devices)` launches one
    job (Hydra's return); `outcome_of(job, ret)` reads its outcome; `ended(index)` runs as each one ends."""

    def __init__(self, sweep_dir: Path, placement: devices.Placement, launch: Callable[[PlannedJob, int, Any], Any],
                 outcome_of: Callable[[PlannedJob, Any], dict], ended: Callable[[int], None] | None = None):
        self.dir, self.placement = Path(sweep_dir), placement
        self.pool = devices.Pool(placement.sets)
        self.launch, self.outcome_of, self.ended = launch, outcome_of, ended
        self.stopped = False
        self._references: list[threading.Thread] = []
        self._references_done: list[threading.Event] = []
        self._left = 0  # references still measuring
        self._lock = threading.Lock()
        stopping.reset()

    def devices_of(self, lease: devices.Lease) -> tuple[str, ...] | None:
        return lease.devices or None

    # -- the references ----------------------------------------------------------------------------------------
    def measure_references(self, plans: list[JobPlan], context: SweepContext) -> None:
        """Start measuring the references `plans` read, each on a set of its own, before any job is launched;
        <sweep dir>/ended/reference once all are done (the jobs wait for it before they judge)."""
        groups = reference_groups(plans)
        self._left = len(groups)
        if not groups:
            published.mark_ended(self.dir, published.REFERENCE)
        for n, (plan, thresholds) in enumerate(groups):
            lease = self.pool.acquire(f"reference {n}" if len(groups) > 1 else "reference")
            placed = replace(plan, devices=self.devices_of(lease), sweep=replace(context, index=-1))
            done = threading.Event()
            self._references_done.append(done)
            thread = threading.Thread(target=self._reference, args=(placed, thresholds, lease, n, done),
                                      name=f"oneknob reference {n}", daemon=True)
            self._references.append(thread)
            thread.start()

    def _reference(self, plan: JobPlan, thresholds: set[int], lease: devices.Lease, n: int,
                   done: threading.Event) -> None:
        progress = JobProgress(console, "reference")
        tracker = None
        try:
            tracker = JournaledTracker(self.dir / "references" / str(n) / "journal.jsonl", plan.tracking_uri,
                                       plan.experiment, tags=plan.tags, required=False, console=console)
            reference.get_or_measure(plan, tracker, on_wait=progress.reference_wait, console=console,
                                     thresholds=thresholds)
        except reference.ReferenceMismatch:
            pass  # each job's own check says so (and stops the sweep, as it did before)
        except KeyboardInterrupt:
            pass  # the sweep was interrupted: its main thread says so
        except Exception as exc:
            console.print(f"[yellow]the reference could not be measured ahead "
                          f"({escape(type(exc).__name__)}: {escape(str(exc).splitlines()[0] if str(exc) else '')}); "
                          "each job measures it itself[/]")
        finally:
            progress.close()
            if tracker is not None:
                tracker.close()
            self.pool.release(lease)
            with self._lock:
                self._left -= 1
                if self._left == 0:
                    published.mark_ended(self.dir, published.REFERENCE)
            done.set()

    # -- the jobs ----------------------------------------------------------------------------------------------
    def run(self, items: list[tuple[PlannedJob, int]], stops: Callable[[dict], Any] | None = None) -> list:
        """Launch each (job, index) in order, each as soon as a set is free, side by side; Hydra's returns in the
        same order, of those launched: all of them, or the first ones where a job that ended `stops` the sweep."""
        launched: list[_Launched] = []
        try:
            for job, index in items:
                if self.stopped:
                    break
                lease = self.pool.acquire(job.plan.name)
                if self.stopped:
                    self.pool.release(lease)
                    break
                entry = _Launched(job, index, lease)
                entry.thread = threading.Thread(target=self._run_one, args=(entry, stops), daemon=True,
                                                name=f"oneknob job {index}")
                launched.append(entry)
                entry.thread.start()
            for entry in launched:
                while not entry.done.wait(0.2):  # in steps: a signal reaches this (the main) thread between them
                    pass
        except BaseException:
            stopping.stop_all()
            deadline = time.monotonic() + JOIN_AFTER_INTERRUPT_S
            for done in [e.done for e in launched] + self._references_done:
                done.wait(max(0.0, deadline - time.monotonic()))  # an event, not join(): a join a signal
            raise                                                  # interrupted may say a thread ended
        for entry in launched:
            if entry.error is not None:  # the launcher itself failed (or the job was stopped): as a launch raises
                raise entry.error
        return [entry.ret for entry in launched]

    def one(self, job: PlannedJob, index: int) -> Any:
        """One job, on the first free set (a bisection's probe, a follow-up): Hydra's return."""
        return self.run([(job, index)])[0]

    def _run_one(self, entry: _Launched, stops) -> None:
        # the set is free once the job's engines stopped (Job.run says so unless its outcome stops the sweep), else
        # when its launch returns
        devices.when_engines_stop(str(self.dir), entry.index, lambda: self.pool.release(entry.lease))
        try:
            entry.ret = self.launch(entry.job, entry.index, self.devices_of(entry.lease))
        except BaseException as exc:
            entry.error = exc
        finally:
            try:
                if stops is not None and entry.error is None and stops(self.outcome_of(entry.job, entry.ret)):
                    self.stopped = True  # before its set is free: nothing is launched on it
                if self.ended is not None:
                    self.ended(entry.index)
            finally:
                published.mark_ended(self.dir, entry.index)
                devices.engines_stopped(str(self.dir), entry.index)  # if the job did not say so itself
                self.pool.release(entry.lease)
                entry.done.set()

    def finish(self) -> Path:
        """placement.json: the placement and every lease (who held which devices, from when to when)."""
        for done in self._references_done:
            done.wait(5.0)
        path = self.dir / "placement.json"
        store.write_json_atomic(path, {"placement": self.placement.as_dict(),
                                       "most_at_once": self.pool.most_at_once(),
                                       "leases": [{"holder": lease.holder, "devices": list(lease.devices),
                                                   "acquired": lease.acquired, "released": lease.released}
                                                  for lease in self.pool.leases]})
        return path


def planned(placement: devices.Placement, plans: list[JobPlan]) -> list[dict[str, Any]]:
    """Where each engine goes (the dry run): the references first, then the jobs in order, each on the set
    first free, were every engine to take as long as every other (round r: the r-th engine on its set)."""
    groups = reference_groups(plans)
    engines = [f"reference {n}" if len(groups) > 1 else "reference" for n in range(len(groups))]
    engines += [plan.name for plan in plans]
    sets = placement.sets
    return [{"engine": name, "devices": list(sets[i % len(sets)]) or [devices.HOST], "round": i // len(sets) + 1}
            for i, name in enumerate(engines)]


def placement(config, plans: list[JobPlan]) -> devices.Placement:
    """The placement `devices=` asks for, for the sweep's engines (model.tensor_parallel_size devices each);
    refused (ConfigError) where it cannot hold."""
    from omegaconf import OmegaConf

    base, value = plans[0], config.get("devices", "auto")
    per_engine = int(base.worker["model"].get("tensor_parallel_size") or 1)
    value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return devices.resolve(value, platform=base.platform, per_engine=per_engine)


def show_plan(where: devices.Placement, plans: list[JobPlan], sweep_dir: Path) -> None:
    """The dry run's placement: the devices, and where each engine goes (also in plan.json, "devices")."""
    engines = planned(where, plans)
    console.say(f"devices: {escape(where.text())}")
    for engine in engines:
        console.print(f"  round {engine['round']}: {escape(engine['engine'])} on device(s) "
                      f"{','.join(engine['devices'])}")
    rounds = max(e["round"] for e in engines)
    console.say(f"  {len(engines)} engine(s), {rounds} round(s) of engine starts (were every engine as long as "
                  "every other). What waits: a variant, once its engine is up, for the baseline's resolved config "
                  "(the single-variable diff), and after its own grid for the baseline's transitions (it probes "
                  "them too); every job, before it judges, for the reference")
    path = Path(sweep_dir) / "plan.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    store.write_json_atomic(path, data | {"devices": where.as_dict() | {"engines": engines}})


def alone(config, plan: JobPlan) -> JobPlan:
    """A one-job run's plan on the first device set of `devices` (its engines one after another, as before);
    unchanged on a host's one device."""
    where = placement(config, [plan])
    for note in where.notes:
        console.say(f"[yellow]note:[/] {escape(note)}")
    return replace(plan, devices=where.sets[0]) if where.placed else plan
