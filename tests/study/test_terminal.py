"""A new user's first hour: `make demo`'s command in a fresh directory (a fresh MLflow store), and what it
leaves: its terminal output, report.md, the MLflow experiment and descriptions; a single run's last lines;
`--help`."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import RUN_PY, mlflow_client, mlflow_runs, python_module, run_cli, run_python

from oneknob import cli
from oneknob.explain import mlflow_ui
from oneknob.explain import publish
from oneknob.explain import report_md
from oneknob.explain.report_header import SIMULATION_LINE
from oneknob.config.schema import REPO_ROOT


def demo_command() -> list[str]:
    """The recipe of the Makefile's demo target, with this interpreter: the test runs what `make demo` runs."""
    lines = (REPO_ROOT / "Makefile").read_text().splitlines()
    recipe = lines[lines.index("demo: setup") + 1].strip()
    assert recipe.startswith("$(BIN)/python run.py "), recipe
    return [sys.executable, str(RUN_PY), *shlex.split(recipe)[2:]]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("demo")  # no template store: the user's first run creates it
    done = run_python(demo_command()[1:], workdir, timeout=600, env={"COLUMNS": None})  # as in a pipe: 120 wide
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sweep_dir,) = (workdir / "multirun").iterdir()
    client = mlflow_client(workdir)
    (parent,) = mlflow_runs(workdir, role="sweep")
    jobs = sorted(mlflow_runs(workdir, role="job"), key=lambda r: r.info.start_time)
    return SimpleNamespace(dir=workdir, out=done.stdout + done.stderr, lines=(done.stdout + done.stderr).splitlines(),
                           sweep_dir=sweep_dir, report=(sweep_dir / "report.md").read_text(), client=client,
                           parent=parent, jobs=jobs)


def test_the_demo_prints_no_hydra_launch_lines_no_internal_overrides_and_no_mlflow_setup(demo):
    for text in ("sweep.parent_run_id=", "sweep.plan=", "[HYDRA]", "Launching", "#1 :",
                 "Creating initial MLflow database tables", "Updating database tables", "INFO"):
        assert text not in demo.out, text
    assert len(demo.jobs) == 7 and len(demo.lines) <= 80, len(demo.lines)  # 120 columns wide at most


def test_every_job_ends_naming_its_dir_and_its_mlflow_run(demo):
    relative = demo.sweep_dir.relative_to(demo.dir)
    for index, job in enumerate(demo.jobs):
        line = f"  {job.info.run_name}: dir {relative}/{index}, MLflow run {job.info.run_id}"
        assert line in demo.lines, line
        done = next(i for i, text in enumerate(demo.lines) if text.startswith(f"{job.info.run_name}: "))
        after = demo.lines.index(line, done)  # the job's last line, after its result (wrapped: indented lines)
        assert all(text.startswith("  ") and not text.startswith("  " + job.info.run_name)
                   for text in demo.lines[done + 1:after])


def test_the_demo_ends_with_its_report_its_mlflow_page_and_says_simulation_first_and_last(demo):
    relative = demo.sweep_dir.relative_to(demo.dir)
    assert demo.sweep_dir.name.endswith("_oneknob-synthetic")  # named after its experiment
    page = mlflow_ui.run_url(mlflow_ui.LOCAL_UI, None, demo.parent.info.run_id)
    assert demo.lines[-3:] == [f"report: {relative}/report.md", f"MLflow (make ui, then open): {page}",
                               SIMULATION_LINE]
    assert len(demo.lines[-2]) < 200  # the parent run's page: its description links the runs' nll overlaid
    first_job = next(i for i, text in enumerate(demo.lines) if text.startswith("  baseline:"))
    assert SIMULATION_LINE in demo.lines[:first_job]  # a pasted log shows it whichever end is cut


def test_the_demo_terminal_fits_120_columns_but_paths_and_says_each_note_once(demo):
    long = [line for line in demo.lines if len(line) > 120]
    assert all(any("/" in word and len(word) > 20 for word in line.split()) for line in long), long  # paths only
    table = demo.lines[demo.lines.index(next(x for x in demo.lines if x.startswith("sweep ") and "boundary per run"
                                             in x)):][:10]
    assert all(len(line) <= 120 for line in table) and sum(line.startswith("baseline ") for line in table) == 1
    flat = " ".join(" ".join(demo.lines).split())
    skipped = 'vllm.patch="fix-53520-protect-prompt-hidden-states" not run here'
    assert flat.count(skipped) == 1  # printed as the sweep starts, not again at its end
    notes = [line for line in demo.lines if line.startswith("note:")]
    assert len(notes) == len(set(notes))
    assert "The baseline is polluted at 128..512 tokens and clean at 513..1024: the boundary is 512|513." in flat


def test_the_demo_report_opens_with_the_boundary_and_the_knob_that_moved_it_and_fits_a_screen(demo):
    title = demo.report.splitlines()[0]
    first = next(p for p in demo.report.split("\n\n")[1:] if not p.startswith(">"))  # under the banner
    assert title.startswith("# 512|513 ") and "cudagraph.capture=256 moves it to 256|257" in title
    assert first.startswith("The baseline is polluted at 128..512 tokens and clean at 513..1024: the boundary is "
                            "512|513. cudagraph.capture=256 moved it to 256|257;")
    assert "resolved max capture size" in first
    assert len(report_md.open_lines(demo.report)) <= 80, len(report_md.open_lines(demo.report))
    assert "spec.k=0 (pinned cudagraph.capture=512) cleared it; spec.k=1 left it at 512|513" in demo.report
    assert "no claim" not in demo.report and "all measured runs together" not in demo.report


def test_report_holds_the_simulation_banner_and_the_per_length_tables_from_mlflow(demo):
    assert demo.report.split("\n")[2] == report_md.SIMULATION
    for job in demo.jobs:
        history = {m.step: m.value for m in demo.client.get_metric_history(job.info.run_id, "nll")}
        section = demo.report.split(f"\n### {job.info.run_name}: ")[1].split("\n### ")[0]
        rows = [line for line in section.splitlines() if line.startswith("| ")]
        assert rows[0] == "| prompt tokens | mean NLL | NLL ref | delta | verdict |"
        assert [int(row.split("|")[1].strip(" *")) for row in rows[1:]] == sorted(history)  # grid and bisection
        assert [row.split("|")[2].strip() for row in rows[1:]] == [f"{history[L]:.3f}" for L in sorted(history)]


def test_mlflow_lands_on_the_runs_and_the_parent_describes_the_sweep(demo):
    experiment = demo.client.get_experiment(demo.parent.info.experiment_id)
    assert experiment.name == "oneknob-synthetic" and demo.client.get_experiment_by_name("oneknob") is None
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    note = demo.parent.data.tags[publish.NOTE]
    summary_section = publish.unfolded(demo.report.split(f"\n{report_md.PER_LENGTH}\n")[0])
    unlinked = re.sub(r"\[([0-9a-f]{32})\]\(#/experiments/\d+/runs/\1\?workflowType=machine_learning\)", r"`\1`", note)
    unlinked = re.sub(r", \[nll against prompt length, the runs overlaid\]\(#/metric/[^)]*\)", "", unlinked)
    unlinked = re.sub(r"\]\(get-artifact\?path=([\w.]+)&run_uuid=[0-9a-f]{32}\)", r"](\1)", unlinked)
    assert unlinked.startswith(summary_section + f"\n{report_md.PER_LENGTH}\n")
    for job in demo.jobs:
        own = demo.report.split(f"\n### {job.info.run_name}: ")[1].split("\n### ")[0]
        table = [line for line in own.splitlines() if line.startswith("|")]
        assert len(table) > 2 and "\n".join(table) in job.data.tags[publish.NOTE]


def test_every_run_carries_the_commit_and_the_reference_nests_under_the_sweep_that_measured_it(demo):
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    (reference,) = mlflow_runs(demo.dir, role="reference")
    for run in [demo.parent, reference, *demo.jobs]:
        assert run.data.tags["mlflow.source.git.commit"] == head.strip()
    assert reference.data.tags["mlflow.parentRunId"] == demo.parent.info.run_id
    assert {job.data.params["reference.run_id"] for job in demo.jobs} == {reference.info.run_id}


def test_the_report_is_rerendered_from_mlflow_alone(demo, tmp_path):
    sweep_id = demo.parent.data.tags["oneknob.sweep_id"]
    store = f"sqlite:///{demo.dir}/mlruns/mlflow.db"
    rc, out = python_module(tmp_path, "oneknob", "report", "--sweep", sweep_id, "--tracking-uri", store)
    assert rc == 0 and out == demo.report, out[-2000:]


def test_a_single_run_ends_with_its_dir_its_run_and_its_page(tmp_path):
    """In a new store the page is addressed by the run alone (its uploader makes the experiment after the
    command printed it, oneknob.record.trail; MLflow's /runs/<id> route finds it); later runs name both."""
    for experiment_known in (False, True):
        rc, out = run_cli(tmp_path, "lengths=[256,513]", "samples=1", "cache=false")
        assert rc == 0, out
        job = max(mlflow_runs(tmp_path, role="job"), key=lambda r: r.info.start_time)
        job_dir = max((tmp_path / "outputs").iterdir())
        assert job_dir.name.endswith("_oneknob-synthetic")
        page = mlflow_ui.run_url(mlflow_ui.LOCAL_UI, job.info.experiment_id if experiment_known else None,
                                 job.info.run_id)
        assert out.splitlines()[-3:] == [f"  baseline: dir outputs/{job_dir.name}, MLflow run {job.info.run_id}",
                                         f"MLflow (make ui, then open): {page}", SIMULATION_LINE]
        time.sleep(1)  # output directories are named to the second


def test_the_cpu_caveat_is_said_only_where_graphs_can_neither_run_nor_be_emulated():
    plain = SimpleNamespace(platform="cpu", defaults={"emulate_cuda_graphs": False})
    # issue 22: only where a graph knob is varied; another bug's study on CPU is not about graphs
    assert cli.cpu_caveat(plain) is None and cli.cpu_caveat(plain, "spec.k") is None
    assert cli.cpu_caveat(plain, "cudagraph.capture") == (
        "[yellow]note:[/] vLLM runs on CPU here, without CUDA graphs (cudagraph_mode NONE): a bug that needs them "
        "cannot show, and cudagraph.* knobs change nothing; engine.emulate_cuda_graphs=true emulates their output "
        "pool (the seed's study sets it)")
    assert cli.cpu_caveat(SimpleNamespace(platform="cpu", defaults={"emulate_cuda_graphs": True})) is None
    assert cli.cpu_caveat(SimpleNamespace(platform="cuda", defaults={})) is None
    assert cli.cpu_caveat(SimpleNamespace(platform="synthetic", defaults={})) is None


def _help(tmp_path, *overrides: str) -> str:
    done = run_python([str(RUN_PY), *overrides, "--help"], tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_lists_the_knobs_and_common_keys_and_hides_internal_ones(tmp_path):
    text = _help(tmp_path)
    for line in ("  cudagraph.capture=null ", "  cudagraph.enforce_eager=false ", "  sched.max_num_seqs=128 ",
                 "  spec.k=3 ", "  runner=null ", "  vllm.version=null ", "  vllm.patch=null ", "  engine=vllm ",
                 "  model=tiny ", "  verdict.tol_nll=0.1 ", "  tracking.experiment=oneknob "):
        assert f"\n{line}" in text, line
    for hidden in ("sweep.plan", "paths.", "engine.fault", "Powered by Hydra"):
        assert hidden not in text, hidden
    synthetic = _help(tmp_path, "engine=synthetic", "spec.k=1")
    assert "\n  spec.k=1 " in synthetic and "\n  engine.fault.edge=max_capture_size " in synthetic
    assert "\n  tracking.experiment=oneknob-synthetic\n" in synthetic
    assert not list(Path(tmp_path).iterdir())  # --help starts nothing and writes nothing
