"""Shared test helpers: run oneknob's CLI as a subprocess and read MLflow back.

    rc, out = run_cli(tmp_path, "cudagraph.capture=256,512", multirun=True)
    runs = mlflow_runs(tmp_path)                 # every run in the store (any experiment)

Every call runs in its own working directory (tmp_path), so outputs, the
SQLite store (tmp_path/mlruns) and the point cache (tmp_path/.cache) are the
test's own. $MLFLOW_TRACKING_URI is removed unless `env` sets it.

oneknob makes each new store itself, as a copy of the empty one it keeps in
~/.cache/oneknob (oneknob.record.empty_store); `seed_store` makes one before a
test reads or breaks it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import forkserver

from oneknob.config.schema import REPO_ROOT
from oneknob.record import trail
from oneknob.verdict.search import DOWN, UP

RUN_PY = REPO_ROOT / "run.py"


# vLLM's engine core in the process that drives it (vLLM's own switch; with it, and only with it, vLLM's CPU build
# runs its single worker in that process too): one process instead of three, ~13 s of each engine start here.
# `vllm serve` keeps its engine core apart (its API server always does) and runs the worker there: two processes
# instead of three. For the tests whose point is not vLLM's processes; those that count, signal or read them (the
# plugin's, the signals', the timeout's, axis=batch's paused scheduler offline) keep vLLM's default.
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def own_user_cache(folder) -> dict[str, str]:
    """The environment of a command with a machine cache of its own (oneknob's ~/.cache/oneknob: vLLM's checks
    per configuration, the empty MLflow store), for a test that counts what is made there; vLLM's own cache (its
    model-class inspection, ~25 s cold) stays the machine's."""
    from oneknob.provision.builds import vllm_cache_root

    return {"XDG_CACHE_HOME": str(Path(folder) / "xdg"), "VLLM_CACHE_ROOT": str(vllm_cache_root(os.environ))}


# A sweep's follow-up runs (explain.followups, 3 by default) add jobs and engine starts after the configured
# ones; the tests of other behaviours count those as a sweep without follow-ups makes them, so their sweeps ask
# for none. tests/explain/test_followups.py (and any test naming explain.followups) runs them.
NO_FOLLOWUPS = "explain.followups=0"


def without_followups(overrides) -> list[str]:
    """The overrides of a multirun, with explain.followups=0 unless they set it."""
    return [*overrides] + ([] if any(o.lstrip("+").startswith("explain.followups") for o in overrides)
                           else [NO_FOLLOWUPS])


def cli_command(*overrides: str, multirun: bool = False, engine: str | None = "synthetic") -> list[str]:
    return [sys.executable, str(RUN_PY), *(["-m"] if multirun else []),
            *([f"engine={engine}"] if engine else []), *(without_followups(overrides) if multirun else overrides)]


def cli_env(env: dict | None = None) -> dict:
    """This process's environment for a command, without $MLFLOW_TRACKING_URI, with `env` over it (a None value
    unsets the variable)."""
    merged = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    merged.update({"PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    merged.update(env or {})
    return {k: v for k, v in merged.items() if v is not None}


_TEMPLATE: Path | None = None


def empty_store() -> Path:
    """An empty MLflow SQLite store (schema only), made once per process."""
    global _TEMPLATE
    if _TEMPLATE is None:
        from mlflow.tracking import MlflowClient

        path = Path(tempfile.mkdtemp(prefix="oneknob-test-store-")) / "mlflow.db"
        MlflowClient(f"sqlite:///{path}").search_experiments()
        _TEMPLATE = path
    return _TEMPLATE


def seed_store(tmp_path) -> None:
    db = Path(tmp_path) / "mlruns" / "mlflow.db"
    if not db.exists():
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(empty_store(), db)


def run_cli(tmp_path, *overrides: str, multirun: bool = False, env: dict | None = None, timeout: float = 180,
            engine: str | None = "synthetic") -> tuple[int, str]:
    """Run `python run.py [-m] engine=ENGINE OVERRIDES...` in tmp_path (made if missing); (exit code, output)."""
    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    return _python(cli_command(*overrides, multirun=multirun, engine=engine)[1:], tmp_path, env, timeout)


def start_cli(tmp_path, *overrides: str, multirun: bool = False, env: dict | None = None,
              engine: str | None = "synthetic", log_name: str = "cli.log") -> subprocess.Popen:
    """The CLI in the background, in its own process group, output to tmp_path/log_name (made if missing)."""
    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    log = open(Path(tmp_path) / log_name, "w")
    proc = subprocess.Popen(cli_command(*overrides, multirun=multirun, engine=engine), cwd=tmp_path,
                            stdout=log, stderr=subprocess.STDOUT, env=cli_env(env), start_new_session=True)
    log.close()
    return proc


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def python_module(tmp_path, module: str, *args: str, env: dict | None = None, timeout: float = 120):
    return _python(["-m", module, *args], tmp_path, env, timeout)


_FORK = forkserver.Client()
# ONEKNOB_TEST_FORK=0: every command as a real `python` subprocess (the fork server's equivalence check)
FORK = os.environ.get("ONEKNOB_TEST_FORK", "1") != "0"


def run_python(argv: list[str], cwd, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python ARGV...` in cwd (helpers.cli_env(env) its environment), as subprocess.run(capture_output=True,
    text=True) returns it. Through the fork server (tests/forkserver.py: the same command, without the
    interpreter's start and oneknob's imports) unless the command's environment changes what the interpreter
    reads at start-up."""
    env = cli_env(env)
    if FORK and _FORK.forkable(env):
        code, out, err = _FORK.run(argv, cwd, env, timeout)
        return subprocess.CompletedProcess([sys.executable, *argv], code, out, err)
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _python(argv: list[str], cwd, env: dict, timeout: float) -> tuple[int, str]:
    done = run_python(argv, cwd, timeout, env)
    return done.returncode, done.stdout + done.stderr


def wait_for(predicate, timeout: float = 60, every: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def tracking_uri(tmp_path_or_uri) -> str:
    text = str(tmp_path_or_uri)
    if "://" in text:
        return text
    return f"sqlite:///{Path(text).resolve()}/mlruns/mlflow.db"


def mlflow_client(tmp_path_or_uri):
    """A client of the store, once the uploads of one-job runs to it are in (oneknob.record.trail)."""
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(tmp_path_or_uri)
    trail.wait(uri)
    return MlflowClient(uri)


def mlflow_runs(tmp_path_or_uri, experiment: str | None = None, role: str | None = None) -> list:
    """All runs of an experiment, or of every experiment (synthetic runs go to oneknob-synthetic, vLLM's to
    oneknob), optionally of one oneknob.role: job, sweep, reference; [] if no store."""
    uri = tracking_uri(tmp_path_or_uri)
    trail.wait(uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        return []
    client = mlflow_client(uri)
    if experiment is None:
        ids = [e.experiment_id for e in client.search_experiments(max_results=1000)]
    else:
        found = client.get_experiment_by_name(experiment)
        ids = [found.experiment_id] if found is not None else []
    if not ids:
        return []
    runs = client.search_runs(ids, max_results=10_000)
    return [r for r in runs if role is None or r.data.tags.get("oneknob.role") == role]


def metric_steps(tmp_path_or_uri, run_id: str, key: str = "nll") -> list[int]:
    return sorted(m.step for m in mlflow_client(tmp_path_or_uri).get_metric_history(run_id, key))


def worker_records(tmp_path, event: str = "start", role: str | None = None) -> list[dict]:
    path = Path(tmp_path) / ".cache/oneknob/workers.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r["event"] == event and (role is None or r["role"] == role)]


def engine_spans(tmp_path) -> dict[str, list[tuple[float, float]]]:
    """Each engine's [start, stop] by device (oneknob.run.devices), from workers.jsonl: a start and its stop share
    a pid; every engine started must have stopped."""
    starts = {r["pid"]: r for r in worker_records(tmp_path, "start")}
    found: dict[str, list[tuple[float, float]]] = {}
    for stop in worker_records(tmp_path, "stop"):
        start = starts.pop(stop["pid"])
        found.setdefault(start["device"], []).append((start["time"], stop["time"]))
    assert not starts, f"engines never stopped: {starts}"
    return found


def overlapping(spans: dict[str, list[tuple[float, float]]]) -> list:
    """Two engines on one device at once: (device, one span, the next), none where the placement held."""
    return [(device, a, b) for device, found in spans.items() for a, b in zip(sorted(found), sorted(found)[1:])
            if b[0] < a[1]]


def most_at_once(spans: dict[str, list[tuple[float, float]]]) -> int:
    """The most engines running at one time, on any devices."""
    edges = sorted([(s, 1) for found in spans.values() for s, _ in found]
                   + [(e, -1) for found in spans.values() for _, e in found])
    most = held = 0
    for _, step in edges:
        held += step
        most = max(most, held)
    return most


def cache_points(tmp_path) -> dict[str, list[tuple[int, int]]]:
    """(sample, length) of every record in each cached config's points.jsonl, duplicates kept."""
    root = Path(tmp_path) / ".cache/oneknob/points"
    return {d.name: [(r["sample"], r["length"]) for r in map(json.loads, (d / "points.jsonl").read_text().splitlines())]
            for d in sorted(root.glob("*")) if (d / "points.jsonl").exists()}


def journal_records(path, kind: str | None = None) -> list[dict]:
    from oneknob.record.store import read_jsonl

    return [r for r in read_jsonl(Path(path)) if kind is None or r.get("kind") == kind]


def job_journals(tmp_path) -> list[Path]:
    """Journals of jobs (sweeps' own journals left out), oldest sweep first."""
    return sorted(p for p in Path(tmp_path).glob("multirun/*/*/journal.jsonl")) + sorted(
        Path(tmp_path).glob("outputs/*/journal.jsonl"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_plan(tmp_path, *overrides: str, engine: str = "synthetic"):
    """One job's plan, composed from the real configs as run.py does, with paths.root=tmp_path (the store and
    the cache there), for `oneknob.study.job.run_job(plan, job_dir)` in process."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import oneknob.config.schema  # noqa: F401  (registers the structured schema)
    from oneknob.config.schema import REPO_ROOT
    from oneknob.plan.jobs import plan_job

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
            return plan_job(compose("config", overrides=[f"paths.root={tmp_path}", f"engine={engine}", *overrides]))
    finally:
        GlobalHydra.instance().clear()


def down(lo: int, hi: int | None = None) -> dict:
    """A polluted->clean transition record (hi defaults to lo + 1: resolved)."""
    hi = lo + 1 if hi is None else hi
    return {"lo": lo, "hi": hi, "direction": DOWN, "resolved": hi == lo + 1}


def up(lo: int, hi: int | None = None) -> dict:
    """A clean->polluted transition record."""
    hi = lo + 1 if hi is None else hi
    return {"lo": lo, "hi": hi, "direction": UP, "resolved": hi == lo + 1}


def process_tree(pid: int) -> dict[int, tuple[str, str]]:
    """{PID: (start ticks, command line)} of every process below `pid` (sample it repeatedly: it changes). A
    zombie has no command line: left out, so a sample taken as a process ends keeps the name it ran under."""
    from oneknob.run.procs import descendants

    found = {}
    for child, ticks in descendants(pid).items():
        try:
            command = open(f"/proc/{child}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if command:
            found[child] = (ticks, command)
    return found


def process_gone(pid: int, ticks: str) -> bool:
    """Whether the process seen as (pid, start ticks) has ended: gone, a zombie, or its PID reused."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[19] != ticks or fields[0] in "ZX"


@contextmanager
def composing(tmp_path, engine: str):
    """compose(overrides) of the real configs for `engine`, with the paths and the sweep dir in tmp_path (a
    fixture's body: `with composing(tmp_path, "synthetic") as compose_: yield compose_`)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    fixed = [f"paths.root={tmp_path}", f"hydra.sweep.dir={tmp_path}/sweep", f"engine={engine}"]
    try:
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
            yield lambda overrides=(): compose("config", overrides=[*fixed, *overrides], return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
