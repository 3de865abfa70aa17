"""What a study says on the terminal and how it exits: the one refusal path, the exit codes, the dry run's
plan, each job's last line, the CPU caveat. Used by a sweep (study.sweep) and a single run (oneknob.cli).

Exit codes, for single runs and sweeps alike:
    0   done
    1   a job failed (its run is FAILED with the error; the sweep went on)
    2   refused before anything started: oneknob's checks and Hydra's own compose errors; nothing recorded
    3   every job finished, but MLflow lacks part of it (python -m oneknob sync uploads it)
    130 interrupted (Ctrl-C); rerun the same command to resume
    143 terminated (SIGTERM, as Slurm and `timeout` send; 129 for SIGHUP; the submitit preemption signal is
        handled the same way in a job process): runs KILLED, workers ended, rerun to resume
"""


from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from hydra.errors import HydraException
from rich.markup import escape
from rich.table import Table

from oneknob.errors import Refused
from oneknob.console import make_console

EXIT_FAILED, EXIT_REFUSED, EXIT_TRACKING_INCOMPLETE, EXIT_INTERRUPTED = 1, 2, 3, 130
console = make_console()
_started = False  # set when a task or a sweep starts: a Hydra error before that is a compose error


def started() -> None:
    global _started
    _started = True


def has_started() -> bool:
    return _started


_sweep_pid: int | None = None  # the process that runs a sweep (its jobs may run in processes of their own)


def sweep_started() -> None:
    global _sweep_pid
    _sweep_pid = os.getpid()


def is_sweep_process() -> bool:
    return _sweep_pid == os.getpid()


def _hydra_message(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return f"{exc}" + (f" ({cause})" if cause and str(cause) not in str(exc) else "")


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """The one refusal path: a clear message, nothing started, nothing recorded, exit code 2."""
    try:
        yield
    except Refused as exc:
        refuse(str(exc))
    except HydraException as exc:  # composing a job's config inside the sweeper: Hydra's message, kept
        refuse(_hydra_message(exc))


def refuse(message: str) -> None:
    console.print(f"[red]refused:[/] {escape(message)}")
    console.print("nothing was started and no run was recorded")
    sys.exit(EXIT_REFUSED)


class Terminated(KeyboardInterrupt):
    """SIGTERM, SIGHUP or a scheduler's preemption signal: ended like Ctrl-C (runs KILLED, workers ended)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_terminated: int | None = None  # the signal that ended this process, once one did
_lost = False  # the last interrupt was raised where Python swallows exceptions: deliver it again


def _on_signal(signum: int, frame) -> None:
    global _terminated, _lost
    if _terminated is not None and not _lost:
        return  # the first one started the cleanup; let it run to its end
    _terminated, _lost = signum, False
    raise Terminated(signum)


def _redeliver_lost_interrupts(unraisable) -> None:
    """sys.unraisablehook. A signal's exception is raised wherever the main thread is, and Python swallows one
    raised in a finalizer or a weakref callback (the garbage collector runs them anywhere: SQLAlchemy's, MLflow's),
    printing "Exception ignored in ...": the sweep then ran on to its end as if no Ctrl-C or SIGTERM had come (1 of
    25 synthetic sweeps interrupted at random moments here). The same signal is sent again 50 ms later, from a
    thread: sent here, its handler would raise inside this hook, where the exception is lost for good; by then the
    finalizer has returned, and one that is still running swallows it again and comes back here."""
    global _lost
    import threading

    exc = unraisable.exc_value
    if not isinstance(exc, KeyboardInterrupt):
        _previous_unraisablehook(unraisable)
        return
    _lost = True
    again = threading.Timer(0.05, os.kill, (os.getpid(), exc.signum if isinstance(exc, Terminated) else signal.SIGINT))
    again.name, again.daemon = "oneknob-interrupt-again", True
    again.start()


_previous_unraisablehook = sys.__unraisablehook__  # the hook handle_termination() found (Python's own until then)


def handle_termination() -> None:
    """SIGTERM and SIGHUP end this process the way Ctrl-C does; in a submitit job (hydra/launcher=submitit_*)
    its preemption signal too ($SUBMITIT_PREEMPT_SIGNAL, USR2 by default), over submitit's own handlers. An
    interrupt that Python swallowed (a finalizer's) is delivered again."""
    global _previous_unraisablehook
    signals = [signal.SIGTERM, signal.SIGHUP]
    if "submitit" in sys.modules:
        preempt = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
        signals += [preempt] if preempt is not None else []
    for sig in signals:
        with contextlib.suppress(ValueError):  # not the main thread: the caller's handlers stay
            signal.signal(sig, _on_signal)
    if sys.unraisablehook is not _redeliver_lost_interrupts:
        _previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _redeliver_lost_interrupts


def why_interrupted(exc: BaseException | None = None) -> str:
    if isinstance(exc, Terminated):
        return exc.args[0]
    return signal.Signals(_terminated).name if _terminated is not None else "Ctrl-C"


EXIT_WITHIN_S = 30.0  # after an interrupt's cleanup, the longest the process's own exit may take


def interrupted() -> None:
    how = why_interrupted()
    console.print(f"[red]interrupted ({how}): finished points are kept; rerun the same command to resume[/]")
    code = 128 + _terminated if _terminated is not None else EXIT_INTERRUPTED
    _exit_within(EXIT_WITHIN_S, code)
    sys.exit(code)


def _exit_within(seconds: float, code: int) -> None:
    """End the process `seconds` from now if its exit has not: by then the job's cleanup is done (journal, result,
    MLflow, the worker stopped), and only the interpreter's own exit is left (joining threads, at-exit waits). A
    command hung there after a signal three times in the suite; these stacks named the thread in the third (the
    cache's writer, record/served.py Writer). Every thread's stack goes to stderr first, to say where."""
    import threading
    import traceback

    def expire() -> None:
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        stacks = [f"thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
                  for ident, frame in sys._current_frames().items()]
        with contextlib.suppress(Exception):  # whatever stderr is now, the process ends
            sys.stderr.write(f"oneknob: still exiting {seconds:.0f} s after the interrupt; every thread's stack "
                             "follows, then the process ends\n" + "".join(stacks))
            sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(seconds, expire)
    timer.name, timer.daemon = "oneknob-exit-watchdog", True
    timer.start()


def exit_code(outcomes: list[dict], tracking_ok: bool = True) -> int:
    if any(o["status"] in ("failed", "killed") for o in outcomes):
        return EXIT_FAILED
    if not tracking_ok or any(o.get("tracking") for o in outcomes):
        return EXIT_TRACKING_INCOMPLETE
    return 0


# What the dry run shows of the engine's own config construction (vLLM's flattened resolved config), when it has one.
ENGINE_RESOLVED = (("capture", "compilation_config.max_cudagraph_capture_size"),
                   ("mode", "compilation_config.cudagraph_mode"),
                   ("K", "speculative_config.num_speculative_tokens"),
                   ("max_num_seqs", "scheduler_config.max_num_seqs"),
                   ("batched tokens", "scheduler_config.max_num_batched_tokens"))


def print_plan(plans: list, out_dir: Path, resolved: list[dict] | None = None) -> Path:
    """The dry run: every job with its knobs and predicted resolved config, printed and in plan.json; beside
    it, where the engine has one, what its own config construction resolved here (`resolved`, per plan)."""
    from oneknob.record import store

    resolved = resolved or [{} for _ in plans]
    engine_said = any(resolved)
    first = plans[0]
    here = first.defaults.get("device", first.platform)
    table = Table(title=f"plan: {len(plans)} job(s) on engine={first.engine}, {here} "
                        f"(dry run: no engine is started)")
    for column in ("job", "knobs (the baseline's, then what differs)", "predicted capture", "mode", "K",
                   "max_num_seqs"):
        table.add_column(column)
    if engine_said:
        table.add_column(f"{first.engine}'s own resolution here: " + ", ".join(name for name, _ in ENGINE_RESOLVED))
    for plan, own in zip(plans, resolved):
        predicted, base = plan.predicted, plans[0].knobs
        shown = {k: v for k, v in plan.knobs.items() if plan is plans[0] or v != base.get(k)}
        row = [escape(plan.name), escape(" ".join(f"{k}={json.dumps(v)}" for k, v in shown.items())),
               "not predicted" if predicted.get("not_predicted") else str(predicted["max_capture_size"]),
               predicted["cudagraph_mode"], str(predicted["spec_k"]),
               str(predicted["max_num_seqs"])]
        if engine_said:
            row.append(" ".join(str(own.get(key, "-")) for _, key in ENGINE_RESOLVED))
        table.add_row(*row)
    console.print(table)
    if not first.runs_here:
        console.print(f"{first.engine}'s own resolution is not shown: the plan is for {here}, not this machine")
    # the build and runner each job runs (vllm_release for vLLM): each sentence once, "every job" when all share it
    notes = [(p.name, n) for p in plans for n in (p.predicted.get("build_note"), p.predicted.get("not_predicted")) if n]
    said: set = set()
    for name, note in notes:
        if note not in said:
            said.add(note)
            every = len(plans) > 1 and sum(n == note for _, n in notes) == len(plans)
            console.print(f"{'every job' if every else escape(name)}: {escape(note)}")
    if engine_said and first.worker["options"].get("emulate_cuda_graphs") and first.platform == "cpu":
        console.print("the prediction is what the worker runs (CUDA graphs emulated on CPU); vLLM's own "
                      "resolution is its CPU build's, which captures no graphs")
    axis = first.axis
    grid = (f"lengths {list(first.lengths)}" if axis.name == "length" else
            f"axis={axis.name}: {axis.unit} {list(axis.values)} (prompt of {axis.probe_length} tokens"
            + (f", {axis.neighbour_length} per neighbour)" if axis.neighbour_length else
               f", {axis.repeats} calls per point)" if axis.repeats else ")"))
    console.print(f"{grid} x {first.samples} sample(s); reference "
                  f"{json.dumps(first.reference_knobs)}")
    path = Path(out_dir) / "plan.json"
    store.write_json_atomic(path, {"engine": first.engine, "platform": first.platform, "defaults": first.defaults,
                                   "lengths": list(first.lengths), "samples": first.samples,
                                   "reference": first.reference_knobs,
                                   "jobs": [{"name": p.name, "knob": p.knob, "requested": p.knobs,
                                             "lengths": list(p.lengths), "predicted": p.predicted}
                                            | ({"engine_resolved": own} if own else {})
                                            for p, own in zip(plans, resolved)]})
    console.print(f"plan: {path}")
    return path


def shown(path: str | Path) -> str:
    """A path as a user in this directory would type it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


SHOWN_WARNINGS = "engine_warnings.shown"  # in the sweep directory: the keys of the warnings its jobs printed


def unshown_warnings(sweep_dir: str | None, warnings: list[str]) -> list[str]:
    """Those of a job's engine warnings this sweep's terminal has not shown yet, noted as shown now: each distinct
    warning (engine_log.key) is printed once per sweep, whichever job (in this process or in one of its own,
    under a parallel launcher) has it first. All of them for a job outside a sweep, or when the note fails."""
    from oneknob.run.engine_log import key

    if not sweep_dir or not warnings:
        return warnings
    try:
        with open(Path(sweep_dir) / SHOWN_WARNINGS, "a+") as notes:
            fcntl.flock(notes, fcntl.LOCK_EX)  # jobs of a parallel launcher end at the same time
            notes.seek(0)
            seen = set(notes.read().splitlines())
            new = [w for w in warnings if key(w) not in seen]
            notes.write("".join(f"{key(w)}\n" for w in new))
    except OSError:
        return warnings
    return new


def shown_warnings(sweep_dir: str | Path) -> set[str]:
    """The keys of the engine warnings this sweep's jobs printed."""
    try:
        return set((Path(sweep_dir) / SHOWN_WARNINGS).read_text().splitlines())
    except OSError:
        return set()


def simulation_line(engine: str) -> str | None:
    """The synthetic engine's SIMULATION line, said as a run starts and again as it ends."""
    from oneknob.explain.report_header import SIMULATION_LINE

    return SIMULATION_LINE if engine == "synthetic" else None


def where_line(outcome: dict) -> str:
    """A job's last line: where its files are and which MLflow run holds it."""
    return escape(f"  {outcome['name']}: dir {shown(outcome['job_dir'])}, MLflow run {outcome.get('run_id') or '-'}")


def cpu_caveat(plan, varied: str | None = None) -> str | None:
    """One line where vLLM runs on CPU without graphs and the study varies a CUDA-graph knob: a CUDA-graph bug
    cannot show there. Nothing where no graph knob is involved (another bug's study on CPU is not about graphs)."""
    if plan.platform != "cpu" or plan.defaults.get("emulate_cuda_graphs") or not str(varied or "").startswith(
            "cudagraph."):
        return None
    return ("[yellow]note:[/] vLLM runs on CPU here, without CUDA graphs (cudagraph_mode NONE): a bug that needs "
            "them cannot show, and cudagraph.* knobs change nothing; engine.emulate_cuda_graphs=true emulates "
            "their output pool (the seed's study sets it)")
