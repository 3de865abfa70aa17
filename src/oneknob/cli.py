"""oneknob's command line: run.py's entry point and the task Hydra runs per job (one job, top to bottom, via
oneknob.study). Refusals and exit codes: oneknob.study.terminal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from oneknob.config import commands
from oneknob.plan import single_variable as sv
from oneknob.study import terminal
from oneknob.study.terminal import (  # noqa: F401 (the terminal's names, for callers of the command line)
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_TRACKING_INCOMPLETE,
    console,
    cpu_caveat,
    exit_code,
    interrupted,
    print_plan,
    refusals,
    refuse,
    shown,
    started,
    where_line,
)


def task(cfg) -> Any:
    """What Hydra runs per job. In a sweep the job runs from the plan file oneknob's sweeper wrote."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from oneknob.plan.jobs import JobPlan, plan_job, provision

    started()
    terminal.handle_termination()  # again in a launcher's job process (submitit sets its own handlers there)
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        if not cfg.sweep.plan:
            sweeper = hydra_cfg.runtime.choices.get("hydra/sweeper")
            refuse(f"hydra/sweeper={sweeper}: this multirun was not planned by oneknob's sweeper, so the "
                   "single-variable rules were not checked; drop hydra/sweeper (oneknob's is the default)")
        from oneknob.study.job import run_job

        try:
            outcome = run_job(JobPlan.from_json(Path(cfg.sweep.plan).read_text()), out_dir)
        except KeyboardInterrupt as exc:
            if terminal.is_sweep_process():  # the basic launcher: the sweep itself was interrupted
                raise
            # a launcher's job process (submitit: SIGTERM, or its preemption signal): this job's run is KILLED
            # and its worker ended; the sweep records the job as failed and goes on, and a rerun resumes it
            raise RuntimeError(f"interrupted ({terminal.why_interrupted(exc)}) in its own process: its run is "
                               "KILLED; rerun the same command to resume it") from None
        console.print(where_line(outcome), soft_wrap=True)  # a path: never broken
        return outcome
    with refusals():
        plan = plan_job(cfg)
    from oneknob.run.prepared import Prepared, allowed

    prepared = Prepared(plan, out_dir, console.print) if not cfg.dry_run and allowed(plan) else None
    try:
        with refusals():  # the engine build and the engine's own check of the configuration
            resolved = provision([plan], console.print, meanwhile=prepared) if not cfg.dry_run or plan.runs_here \
                else None
        if cfg.dry_run:
            print_plan([plan], out_dir, resolved)
            return {"status": "dry_run"}
        if prepared is not None:
            prepared.start()  # no check was due (one cached): the worker imports its engine while the job sets up
        if caveat := cpu_caveat(plan):
            console.print(caveat)
        if simulation := terminal.simulation_line(plan.engine):
            console.say(f"[bold yellow]{escape(simulation)}[/]")
        from oneknob.study.job import Job  # MLflow and the executor: only once the plan holds

        with refusals():  # the tracking store, before anything is recorded
            job = Job(plan, out_dir, prepared and prepared.worker)
        if prepared is not None:
            prepared.hand_over()  # the job's session starts or ends it
    finally:
        if prepared is not None:
            prepared.discard()
    try:
        outcome = job.run()
    except KeyboardInterrupt:
        interrupted()
    console.print(where_line(outcome), soft_wrap=True)
    if job.tracker.ok:
        from oneknob.explain import mlflow_ui

        base = mlflow_ui.ui_base(plan.tracking_uri)
        how = f"{commands.ui(plan.tracking_uri)}, then open" if base == mlflow_ui.LOCAL_UI else "open"
        console.print(f"MLflow ({escape(how)}): "
                      + mlflow_ui.run_url(base, job.tracker.experiment_id, outcome["run_id"]))
    if simulation := terminal.simulation_line(plan.engine):
        console.say(f"[bold yellow]{escape(simulation)}[/]")
    code = exit_code([outcome])
    if code:
        sys.exit(code)
    return outcome


def _check_run_dir(parsed, multirun: bool) -> None:
    """hydra.run.dir given as a plain path: Hydra makes it before oneknob runs, with a traceback if it cannot."""
    from oneknob import files
    from oneknob.errors import ConfigError

    for override in parsed:
        if override.key_or_group != "hydra.run.dir" or multirun or "${" in (text := str(override.value())):
            continue
        try:
            files.check_dir_place(Path(text))
        except OSError as exc:
            raise ConfigError(f"hydra.run.dir={text}: cannot write there ({exc.strerror or exc}); set hydra.run.dir "
                              "to a writable directory with a shorter name") from None


def _check_bisect(parsed, multirun: bool) -> None:
    """bisect=true searches a multirun's values, and vllm.commit=A..B is a range only a bisection searches."""
    from oneknob.errors import ConfigError

    given = {o.key_or_group: o for o in parsed}
    if "bisect" in given:  # not true|false (force_add_families turned those into bisect.enabled)
        raise ConfigError(f"{given['bisect'].input_line}: bisect is true or false, one value per command (a "
                          "bisection searches a sweep's values: python run.py -m 'sched.max_num_seqs=range(1,257)' "
                          "bisect=true); what it compares is bisect.criterion=verdicts|transition|polluted_at:<length>")
    on = "bisect.enabled" in given and given["bisect.enabled"].value() is True
    if on and not multirun:
        raise ConfigError("bisect=true: a bisection searches a sweep's values; add -m (python run.py -m "
                          "'sched.max_num_seqs=range(1,257)' bisect=true)")
    commit = given.get("vllm.commit")
    if commit is not None and not commit.is_sweep_override() and ".." in str(commit.value()) and not on:
        raise ConfigError(f"vllm.commit={commit.value()}: a range of commits is searched, not run; add -m and "
                          "bisect=true (python run.py -m vllm.commit=A..B vllm.source=PATH bisect=true), or give "
                          "one commit")


def _from_command_argv(args) -> None:
    """from_command=<a pasted command line>: Hydra's grammar cannot read one, so it becomes
    from_command.line='<the line>' before Hydra sees it; it searches a multirun (-m)."""
    from oneknob.errors import ConfigError
    from oneknob.plan.from_command import rewrite_argument

    if not args.multirun:
        raise ConfigError("from_command=...: the reporter's line is a study's baseline; add -m (python run.py -m "
                          "from_command=\"vllm serve ...\" [from_command.drop=each|minimal])")
    rewritten = {a: rewrite_argument(a) for a in args.overrides}
    args.overrides = list(rewritten.values())
    sys.argv[1:] = [rewritten.get(a, a) for a in sys.argv[1:]]


def _schema_walk() -> tuple[list[str], set[str]]:
    """Every settable key of the structured config (nested groups flattened, e.g. verdict.tol_nll), and those of
    them that hold free-form mappings (anything may be added under them: engine_args, engine.fault.model_config)."""
    import dataclasses
    import typing

    from oneknob.config.schema import Config

    keys, free = [], set()

    def walk(cls, prefix: str) -> None:
        hints = typing.get_type_hints(cls)  # the schema's annotations are strings (from __future__)
        for f in dataclasses.fields(cls):
            kind = hints.get(f.name, f.type)
            keys.append(prefix + f.name)
            if dataclasses.is_dataclass(kind) and isinstance(kind, type):
                walk(kind, f"{prefix}{f.name}.")
            elif dict in (typing.get_origin(kind), *map(typing.get_origin, typing.get_args(kind))):
                free.add(prefix + f.name)

    walk(Config, "")
    return keys, free


def _schema_keys() -> list[str]:
    return _schema_walk()[0]


def _check_adds(parsed) -> None:
    """`+key` / `++key` under oneknob's schema is refused: the schema is closed, so Hydra would add a key nothing
    reads (`+lenghts=[200]` runs the default grid) or fail on it later with a traceback. Free-form mappings
    (engine_args, env, reference, ablation, engine.fault.model_config) and config groups (`+experiment=...`) are
    Hydra's to add to."""
    import difflib

    from oneknob.errors import ConfigError
    from oneknob.plan.single_variable import OverrideType

    keys, free = _schema_walk()
    groups = _config_groups()
    for override in parsed:
        key = override.key_or_group
        if key == "engine.extra" or key.startswith("engine.extra."):  # Hydra would advise +engine.extra...
            from oneknob.config.knobs import _named_kwargs

            name, value = key.removeprefix("engine.extra").lstrip(".") or "FIELD", _typed_value(override)
            write = f"{_named_kwargs()[name]}={value} (the knob that sets {name})" if name in _named_kwargs() else \
                f"engine_args.{name}={value} (sweepable, checked by vLLM before anything starts)"
            raise ConfigError(f"engine.extra.{name}: engine.extra is gone, every LLM(...) argument is a knob now; "
                              f"write {write}")
        if override.type not in (OverrideType.ADD, OverrideType.FORCE_ADD) or override.package is not None:
            continue
        if key.startswith("hydra") or "/" in key or key in groups or key in free or any(
                key.startswith(f + ".") for f in free):
            continue
        sign = "+" if override.type is OverrideType.ADD else "++"
        value = _typed_value(override)
        if key in keys:
            raise ConfigError(f"{override.input_line}: {key} is a setting; write {key}={value} (without {sign})")
        parent = key.rpartition(".")[0]
        near = difflib.get_close_matches(key, [k for k in keys if k.rpartition(".")[0] == parent] or keys, n=1,
                                         cutoff=0.6)
        hint = f"did you mean {near[0]}? Write {near[0]}={value}" if near else \
            "python run.py --help lists the settings"
        raise ConfigError(f"{override.input_line}: {key} is not a setting, and nothing may be added to oneknob's "
                          f"settings with '{sign}' (nothing would read it); {hint}")


def _config_groups() -> set[str]:
    """conf/'s config groups (engine, model, experiment, hydra) and the optional `local`: Hydra's, not settings."""
    from oneknob.config.schema import REPO_ROOT

    conf = Path(REPO_ROOT) / "conf"
    return {p.name for p in conf.iterdir() if p.is_dir()} | {"local"} if conf.is_dir() else {"local"}


def _typed_value(override) -> str:
    return override.input_line.split("=", 1)[1] if "=" in override.input_line else "VALUE"


def _key_hints(parsed) -> list[str]:
    """'did you mean' for a key of no config group that is close to one (verdict.tol_nl -> verdict.tol_nll)."""
    import difflib

    from oneknob.plan.single_variable import OverrideType

    keys = _schema_keys()
    hints = []
    for override in parsed:
        key = override.key_or_group
        if override.type is OverrideType.CHANGE and not key.startswith("hydra") and key not in keys \
                and key not in _config_groups():
            parent = key.rpartition(".")[0]
            near = difflib.get_close_matches(key, [k for k in keys if k.rpartition(".")[0] == parent] or keys, n=1,
                                             cutoff=0.6)
            if near:
                hints.append(f"{key} is not a setting: did you mean {near[0]}? Write "
                             f"{near[0]}={_typed_value(override)} (not +{key})")
    return hints


def _family_help(family: str, overrides: list[str]) -> None:
    """`run.py --help engine_args [vllm.version=...]`: the knob family's names for that vLLM build (its own
    lists, read once per build in its interpreter and cached under .cache/oneknob)."""
    from oneknob.engines import vllm_validate
    from oneknob.engines.vllm import VllmFacts

    with refusals():
        given = {o.key_or_group: o.value() for o in sv.parse(overrides)}
        build = {key: given.get(key) for key in ("vllm.version", "vllm.patch")}
        cache = given.get("paths.cache") or str(Path.cwd() / ".cache" / "oneknob")
        builds = given.get("paths.builds") or os.environ.get("ONEKNOB_BUILDS") or cache  # as paths.builds resolves
        said = vllm_validate.listing(family, VllmFacts(), build, cache,
                                     log=lambda text: console.print(text, highlight=False), builds_dir=builds)
        print(said)


def main(hydra_main) -> None:
    """run.py: refuse bad knob prefixes before Hydra composes, and Hydra's compose errors with exit 2."""
    from hydra._internal.utils import get_args_parser

    from oneknob.config import helptext

    helptext.register()  # the --help template's knob list
    terminal.handle_termination()  # SIGTERM / SIGHUP: like Ctrl-C
    args, _ = get_args_parser().parse_known_args()
    if args.help and args.overrides and args.overrides[0] in ("engine_args", "env"):
        _family_help(args.overrides[0], args.overrides[1:])
        return
    parsed = []
    with refusals():
        if any(a.partition("=")[0].lstrip("+") == "from_command" for a in args.overrides or []):
            _from_command_argv(args)
        parsed = sv.parse(args.overrides or [])
        sv.check_prefixes(parsed)
        _check_adds(parsed)
        _check_run_dir(parsed, multirun=bool(args.multirun))
        if args.overrides:  # engine_args.X=V / env.VLLM_X=V add keys to empty mappings: Hydra needs ++ for that
            rewritten = dict(zip(args.overrides, sv.force_add_families(args.overrides)))
            sys.argv[1:] = [rewritten.get(a, a) for a in sys.argv[1:]]
        _check_bisect(sv.parse(sv.force_add_families(args.overrides or [])), multirun=bool(args.multirun))
    try:
        hydra_main()
    except KeyboardInterrupt:  # before a job or a sweep caught it (planning, provisioning): nothing to end
        interrupted()
    except SystemExit as exc:
        if exc.code == 1 and not terminal.has_started():  # Hydra printed its own message; it refused the input
            for hint in _key_hints(parsed):  # Hydra suggests +key for a typo, which cannot work either
                console.print(hint)
            console.print("nothing was started and no run was recorded")
            sys.exit(EXIT_REFUSED)
        raise
