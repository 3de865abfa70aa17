"""The first job's worker, started while the engine's config check runs, and checking in its place.

A command whose configuration the engine has not checked on this machine would import vLLM twice before the
first request: in the check's process, then in the job's worker. `Prepared` is handed to
`plan.jobs.provision(meanwhile=...)`: as the check is due it starts the job's worker (`Worker.prepare`: the
worker imports its engine and starts none), and offers vllm_validate a checker that runs the check of the
worker's own build in forks of that worker (one `import vllm` for both): its own knob environment, and the
others (a reference's runner variable) where vLLM's import read none of what they change. The engine
starts only when the job asks for it, after every configuration was accepted.

The worker then goes to its job: the one-job command passes `worker` to its Job; a sweep whose launcher runs jobs
in its own process `offer()`s it, and `take()` hands it to the job whose worker log it writes. Whatever is not
taken is ended by `discard()` (a refusal, a job that needed no engine): it started nothing and recorded
nothing, and its log and the folders made for it go when this process made them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oneknob.run.executor import Worker, WorkerError, worker_for

_offered: dict[Path, Worker] = {}  # worker log -> a prepared worker a job of this process may take


def allowed(plan) -> bool:
    """Whether the job's worker may wait beside what runs before it: not where the device is exclusive (a GPU)
    and a reference's engine runs first and alone."""
    return plan.reference_knobs is None or not plan.exclusive_device


class Prepared:
    def __init__(self, plan, job_dir: Path, log=print):
        self.plan, self.log_path, self.say = plan, Path(job_dir) / "worker.log", log
        self.worker: Worker | None = None
        self.made: list[Path] = []  # the log and the folders this process made for it, deepest first

    def __call__(self):
        """provision's `meanwhile`: start the worker (once); vllm_validate's checker."""
        self.start()
        return self.checker

    def start(self) -> None:
        """Start the worker importing its engine, once: as the engine's check is due (provision's `meanwhile`), or
        once every configuration is accepted where no check was due (a configuration checked on this machine
        before: a one-job command), so that the import overlaps the job's setup (the store, its files) instead of
        following it."""
        if self.worker is None:
            self.made = [p for p in (self.log_path, *self.log_path.parents) if not p.exists()]
            self.worker = worker_for(self.plan, self.plan.knobs, self.log_path)
            self.worker.prepare()

    def checker(self, python: str, env: dict[str, str], knob_envs: list[dict[str, str]]):
        """The check in this worker where it runs `python` with `env` (one build: a patched copy runs the release's
        interpreter with its overlay on PYTHONPATH) and one of `knob_envs` (the others are checked in forks of it with
        their own variables, those vLLM's import did not read); else None."""
        from oneknob.config import knobs
        from oneknob.engines.base import engine_class

        worker = self.worker
        if worker is None or worker.python != python or worker.env != env \
                or not hasattr(engine_class(worker.spec["engine"]), "check"):
            return None  # another build, or an engine that checks nothing itself
        own = knobs.engine_args(worker.spec["knobs"], worker.spec.get("settings")).env
        if own not in knob_envs:
            return None  # none is its own: a process for them imports vLLM whatever this worker does

        def serve(spec: dict, env: dict[str, str]) -> dict | None:
            from oneknob.engines.vllm.validate import TIMEOUT_S

            spec = dict(spec, unset=sorted({*knobs.owned_env(), *own}))  # what the knobs set, the worker's included
            try:
                return worker.check(spec, env, TIMEOUT_S)
            except WorkerError as exc:  # it could not import its engine: the check says why, in a process alone
                self.say(f"the job's worker failed before its engine started ({str(exc).splitlines()[0]}); the "
                         "engine's check runs in a process of its own")
                self.discard()
                return None
        return serve

    def hand_over(self) -> Worker | None:
        """The worker, now the caller's (its job's session starts or ends it)."""
        worker, self.worker = self.worker, None
        return worker

    def offer(self) -> None:
        """For the job of this process that writes this worker's log (`take`)."""
        if self.worker is not None:
            _offered[self.log_path.resolve()] = self.worker

    def discard(self) -> None:
        """End the worker unless a job took it (a refusal, a job that needed no engine)."""
        worker, self.worker = self.worker, None
        if worker is not None and _offered.get(self.log_path.resolve()) is worker:
            del _offered[self.log_path.resolve()]
        if worker is not None and not worker.started:  # started no process yet where its host imports (hosting)
            worker.stop(grace_s=0)
            for made in self.made:  # a refusal leaves nothing behind: the log, then the folders made for it
                try:
                    made.unlink() if made == self.log_path else made.rmdir()
                except OSError:  # written to since (another process's file): kept
                    break


def take(job_dir: Path, knobs: dict[str, Any]) -> Worker | None:
    """The worker prepared for the job in `job_dir` with these knobs, if this process holds one."""
    key = (Path(job_dir) / "worker.log").resolve()
    worker = _offered.get(key)
    if worker is None or worker.spec["knobs"] != knobs:
        return None
    return _offered.pop(key)
