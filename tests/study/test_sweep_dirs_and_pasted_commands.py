"""A sweep directory holds one sweep, every command oneknob prints works when pasted in another directory (it
names the store it needs), and a sweep whose files cannot be written (a full disk, tests/enospc.py) fails, saying
so once, without a traceback. Whole sweeps on the synthetic engine through the CLI, into a store of their own.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal

import pytest
from enospc import full_disk_env
from helpers import mlflow_runs, run_cli, run_python, start_cli, stop_group, wait_for
from test_trail import ONE, _uploaders

pytestmark = pytest.mark.slow  # whole sweeps

SWEEP = ("cudagraph.capture=256,512", "lengths=[200,300]", "samples=1", "search.suspects=false")


def _store(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/store/mlflow.db"  # not the default (./mlruns): a pasted command must name it


def _paste(line: str, cwd, *extra: str, timeout: float = 300):
    """A printed `python ...` command run as a user pastes it, in another directory."""
    argv = shlex.split(line)
    assert argv[0] == "python", line
    cwd.mkdir(parents=True, exist_ok=True)
    return run_python([*argv[1:], *extra], cwd, timeout=timeout)


def _printed(out: str, before: str) -> str:
    """The command printed after `before`: commands print whole on one line (only prose wraps), and end there, at
    a two-space aside or at ', then' (a second command)."""
    found = re.search(rf"{re.escape(before)}\s*(python [^\n]+)", out)
    assert found, out
    return re.split(r"  \(|, then ", found[1])[0].rstrip(").,; ")


def test_a_sweep_directory_is_one_sweeps_and_a_finished_sweeps_files_are_never_replaced(tmp_path):
    """Two sweeps in one hydra.sweep.dir read each other's plans/<n>.json: one ran and reported the other's
    variant, and both exited 0; run one after the other, the second replaced the first's report silently."""
    mine = (*SWEEP, "engine.fault.delay_s=0.2", f"hydra.sweep.dir={tmp_path}/s")
    first = start_cli(tmp_path, *mine, multirun=True)
    try:
        record = wait_for(lambda: (tmp_path / "s" / "sweep.json").is_file() and json.loads(
            (tmp_path / "s" / "sweep.json").read_text()), timeout=120, what="the first sweep's claim")
        other = ("sched.max_num_seqs=64,128", "lengths=[200,300]", "samples=1", f"hydra.sweep.dir={tmp_path}/s")
        rc, out = run_cli(tmp_path / "b", *other, multirun=True)
        assert rc == 2 and "Traceback" not in out, out
        assert f"in use by sweep {record['sweep_id']}, pid {first.pid}" in out.replace("\n", " "), out
        assert first.wait(timeout=240) == 0, (tmp_path / "cli.log").read_text()
    finally:
        stop_group(first, signal.SIGKILL)
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert [r["name"] for r in summary["runs"]] == ["baseline", "cudagraph.capture=512"]  # its own jobs only
    rc, out = run_cli(tmp_path / "b", *other, multirun=True)  # the first one is done: its files stay its own
    assert rc == 2 and f"it holds sweep {record['sweep_id']}" in out.replace("\n", " "), out
    assert json.loads((tmp_path / "s" / "summary.json").read_text())["sweep_id"] == summary["sweep_id"]
    rc, out = run_cli(tmp_path, *mine, multirun=True)  # the same command resumes it
    assert rc == 0 and f"resuming sweep {record['sweep_id']}" in out.replace("\n", " "), out
    # default directories are new ones, to the microsecond: two sweeps started at once never share one
    both = [start_cli(tmp_path / "two", *SWEEP, "dry_run=true", multirun=True, log_name=f"{i}.log") for i in (0, 1)]
    assert [p.wait(timeout=120) for p in both] == [0, 0]
    plans = {re.findall(r"^plan: (.+plan\.json)$", (tmp_path / "two" / f"{i}.log").read_text(), re.M)[-1]
             for i in (0, 1)}
    assert len(plans) == 2, plans


def test_every_printed_command_works_when_pasted_in_another_directory(tmp_path):
    """"comparison failed ...; rebuild it with: python -m oneknob compare --sweep ID" and the disk-full message's
    compare line dropped the sweep's tracking.uri, so pasting them found no store; and a sweep whose report.md
    could not be written exited 0."""
    store = _store(tmp_path)
    rc, out = run_cli(tmp_path / "run", *SWEEP, "engine.fault.crash_at_length=300", f"tracking.uri={store}",
                      "hydra.sweep.dir=s", multirun=True, env=full_disk_env(f"{tmp_path}/run/s/report.md*"))
    assert rc == 1 and "Traceback" not in out, out  # the variant crashed: retry; the report could not be written
    rebuild, retry = _printed(out, "rebuild it with:"), _printed(out, "retry:")
    assert f"--tracking-uri {store}" in rebuild and f"tracking.uri={store}" in retry, (rebuild, retry)
    [parent] = mlflow_runs(store, role="sweep")
    assert parent.info.status == "FAILED"
    done = _paste(rebuild, tmp_path / "elsewhere")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "run" / "s" / "report.md").is_file()
    done = _paste(retry, tmp_path / "elsewhere", "dry_run=true")
    assert done.returncode == 0 and "plan: 2 job(s)" in done.stdout + done.stderr, done.stdout + done.stderr

    # every job ran, the disk filled as a follow-up's plan was written: the sweep failed, the compare line works
    rc, out = run_cli(tmp_path / "full", *SWEEP, f"tracking.uri={store}", "hydra.sweep.dir=s", "explain.followups=1",
                      multirun=True, env=full_disk_env(f"{tmp_path}/full/s/plans/2.json"))
    assert rc == 1 and "Traceback" not in out, out
    assert "disk full: cannot write the plan of job 2" in out and "finished points are kept" in out, out
    done = _paste(_printed(out, "compare them with"), tmp_path / "elsewhere")
    assert done.returncode == 0 and "cudagraph.capture=512" in done.stdout, done.stdout + done.stderr
    # a disk full from the start: the sweep's own files, refused or failed once, never a Hydra traceback
    rc, out = run_cli(tmp_path / "start", *SWEEP, "hydra.sweep.dir=s", multirun=True,
                      env=full_disk_env(f"{tmp_path}/start/s/sweep.json*"))
    assert rc == 2 and "Traceback" not in out and "hydra.sweep.dir=" in out and "disk full" in out, out
    rc, out = run_cli(tmp_path / "journal", *SWEEP, "hydra.sweep.dir=s", multirun=True,
                      env=full_disk_env(f"{tmp_path}/journal/s/journal.jsonl"))
    assert rc == 1 and "Traceback" not in out and out.count("disk full: cannot write the journal") == 1, out
    assert "no job had started" in out and not list((tmp_path / "journal" / "s").glob("[0-9]")), out

    # a one-job run whose uploader died: its sync line names the store (one of its own: the uploader's command
    # names its entry, which lies beside the store, so only this run's uploader is killed)
    store = f"sqlite:///{tmp_path}/one-store/mlflow.db"
    proc = start_cli(tmp_path / "one", *ONE, "reference=null", "engine.fault.delay_s=0.3", "hydra.run.dir=one",
                     f"tracking.uri={store}")
    for pid in wait_for(lambda: _uploaders(tmp_path / "one-store"), timeout=60, what="the job's uploader"):
        os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=120) == 3
    log = (tmp_path / "one" / "cli.log").read_text()
    sync = _printed(log, "MLflow lacks part of it:")
    assert f"--tracking-uri {store}" in sync, sync
    done = _paste(sync, tmp_path / "elsewhere")
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = re.search(r"MLflow run ([0-9a-f]{32})", log)[1]
    assert [r.info.status for r in mlflow_runs(store) if r.info.run_id == run_id] == ["FINISHED"]
    rc, out = run_cli(tmp_path / "one", *ONE, "reference=null", "hydra.run.dir=two", f"tracking.uri={store}")
    assert rc == 0 and f"MLflow (mlflow ui --backend-store-uri {store}, then open): http" in out, out
