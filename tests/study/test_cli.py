"""End to end through the real Hydra CLI, synthetic engine, real MLflow store in tmp."""

import json
from pathlib import Path

import pytest
from helpers import metric_steps, mlflow_runs, run_cli, worker_records

LENGTHS = "lengths=[128,256,384,512,640,768,1024]"


def cli(tmp_path, *overrides, multirun=True):
    return run_cli(tmp_path, *overrides, multirun=multirun, timeout=300)


def test_one_knob_sweep_lands_in_mlflow_under_one_parent(tmp_path):
    rc, out = cli(tmp_path, "cudagraph.capture=256,512", "spec.k=3", LENGTHS)
    assert rc == 0, out
    parents, jobs = mlflow_runs(tmp_path, role="sweep"), mlflow_runs(tmp_path, role="job")
    assert len(parents) == 1 and len(jobs) == 2
    assert {r.data.tags["mlflow.parentRunId"] for r in jobs} == {parents[0].info.run_id}
    by_value = {r.data.params["knob.cudagraph.capture"]: r for r in jobs}
    assert set(by_value) == {"256", "512"}
    # null (the composed value) is not in the list, so its first value is the baseline
    assert by_value["256"].data.tags["oneknob.knob"] == "baseline"
    assert by_value["512"].data.tags["oneknob.knob"] == "cudagraph.capture"
    assert by_value["256"].info.start_time < by_value["512"].info.start_time  # the baseline runs first
    for value, run in by_value.items():
        assert run.info.status == "FINISHED"
        assert run.data.params["knob.spec.k"] == "3"
        assert run.data.params["resolved.max_capture_size"] == value
        assert run.data.params["resolved.platform"] == "synthetic"
        steps = metric_steps(tmp_path, run.info.run_id)
        grid = [128, 256, 384, 512, 640, 768, 1024]
        assert set(grid) <= set(steps) and len(steps) == len(set(steps))
        assert all(128 <= s <= 1024 for s in steps)
    assert by_value["256"].data.metrics["boundary_last_polluted"] == 256
    assert by_value["256"].data.metrics["boundary_first_clean"] == 257
    assert by_value["512"].data.metrics["boundary_last_polluted"] == 512
    assert by_value["512"].data.metrics["boundary_first_clean"] == 513
    for value, run in by_value.items():  # the first transition, for every shape; the full list as a tag
        metrics, edge = run.data.metrics, int(value)
        assert (metrics["boundary_lo"], metrics["boundary_hi"], metrics["boundary_direction"],
                metrics["boundary_resolved"], metrics["transitions"]) == (edge, edge + 1, 1, 1, 1)
        assert json.loads(run.data.tags["oneknob.transitions"]) == [
            {"lo": edge, "hi": edge + 1, "direction": "polluted->clean", "resolved": True, "polluted_samples": 2,
             "samples": 2}]


def _summary(tmp_path) -> dict:
    (path,) = Path(tmp_path).glob("multirun/*/summary.json")
    return json.loads(path.read_text())


def test_a_command_line_list_is_a_baseline_plus_variants_with_the_single_variable_check(tmp_path):
    """spec.k=0,3: K=3 (the composed value) is the baseline; K=0 alone would move the capture size
    512 -> 256, so it runs pinned to 512, and the report says so."""
    rc, out = cli(tmp_path, "spec.k=0,3", "lengths=[256,512,513,1024]")
    assert rc == 0, out
    summary = _summary(tmp_path)
    runs = {r["name"]: r for r in summary["runs"]}
    assert list(runs) == ["baseline", "spec.k=0"]
    assert runs["baseline"]["requested"]["spec.k"] == 3
    assert runs["spec.k=0"]["pinned"] == {"cudagraph.capture": 512}
    assert runs["spec.k=0"]["resolved"]["max_capture_size"] == 512
    report = (Path(summary["sweep_dir"]) / "report.md").read_text()
    assert "pinned cudagraph.capture=512" in report and "max_capture_size 512 -> 256" in report


def test_the_list_value_equal_to_the_composed_one_is_the_baseline_and_nothing_else_runs(tmp_path):
    rc, out = cli(tmp_path, "cudagraph.capture=384,256", "lengths=[256,384,512]", "search.bisect=false")
    assert rc == 0, out  # the composed value (null) is not in the list: its first value is the baseline
    rc, out = cli(tmp_path, "spec.k=1,3", "cudagraph.capture=512", "lengths=[256,384,512]", "search.bisect=false")
    assert rc == 0, out  # the composed value (K=3) is in the list: it is the baseline, whatever its place
    jobs = sorted(mlflow_runs(tmp_path, role="job"), key=lambda r: r.info.start_time)
    assert [(r.info.run_name, r.data.params["knob.cudagraph.capture"], r.data.params["knob.spec.k"]) for r in jobs] \
        == [("baseline", "384", "3"), ("cudagraph.capture=256", "256", "3"), ("baseline", "512", "3"),
            ("spec.k=1", "512", "1")]


def test_a_knob_given_twice_is_refused(tmp_path):
    rc, out = cli(tmp_path, "cudagraph.capture=384,256", "cudagraph.capture=256", "lengths=[256,512]")
    assert rc == 2, out
    assert "cudagraph.capture is given 2 times" in out, out
    assert mlflow_runs(tmp_path) == []


def test_a_multirun_not_planned_by_oneknob_is_refused(tmp_path):
    rc, out = cli(tmp_path, "hydra/sweeper=basic", "cudagraph.capture=256,512", "spec.k=1,3", LENGTHS)
    assert rc == 2, out
    assert "hydra/sweeper=basic: this multirun was not planned by oneknob's sweeper" in out, out
    assert "Traceback" not in out
    assert mlflow_runs(tmp_path) == [] and worker_records(tmp_path) == []


@pytest.mark.parametrize("multirun,override", [(True, "+cudagraph.captur=256,512"), (False, "+cudagraph.foo=1")])
def test_additions_under_a_knob_group_are_refused_naming_the_closest_knob(tmp_path, multirun, override):
    rc, out = cli(tmp_path, override, LENGTHS, multirun=multirun)
    assert rc == 2, out
    assert "did you mean cudagraph.capture?" in out or "cudagraph.foo is not a knob" in out, out
    assert mlflow_runs(tmp_path) == [] and worker_records(tmp_path) == []


def test_sweep_over_two_knobs_is_refused_before_anything_runs(tmp_path):
    rc, out = cli(tmp_path, "cudagraph.capture=256,512", "spec.k=1,3", LENGTHS)
    assert rc == 2, out
    assert "cudagraph.capture over 256,512" in out and "spec.k over 1,3" in out
    assert "'+ablation.cudagraph.capture=[256,512]' '+ablation.spec.k=[1,3]'" in out
    assert mlflow_runs(tmp_path) == []
    assert worker_records(tmp_path) == []


@pytest.mark.parametrize("override", ["+cudagraph.capture=256", "++spec.k=1", "~runner"])
def test_plus_and_tilde_on_knobs_are_refused(tmp_path, override):
    for multirun in (True, False):
        rc, out = cli(tmp_path, override, LENGTHS, multirun=multirun)
        assert rc == 2, out
        assert "is refused: knobs always exist" in out, out
    assert worker_records(tmp_path) == []


def test_non_knob_sweeps_are_free(tmp_path):
    rc, out = cli(tmp_path, "samples=1,2", "lengths=[256,512]", "search.bisect=false", "search.suspects=false")
    assert rc == 0, out
    jobs = sorted(mlflow_runs(tmp_path, role="job"), key=lambda r: r.info.start_time)
    assert [(r.info.run_name, r.data.params["samples"]) for r in jobs] == [("baseline", "1"), ("samples=2", "2")]
    assert all(r.info.status == "FINISHED" and metric_steps(tmp_path, r.info.run_id) == [256, 512] for r in jobs)


@pytest.mark.parametrize("overrides,boundary", [
    ((), (512, 513)),
    (("cudagraph.capture=256",), (256, 257)),
    (("cudagraph.enforce_eager=true",), None),
    (("spec.k=0",), None),
])
def test_boundary_per_config(tmp_path, overrides, boundary):
    rc, out = cli(tmp_path, *overrides, LENGTHS, multirun=False)
    assert rc == 0, out
    (job,) = mlflow_runs(tmp_path, role="job")
    metrics = job.data.metrics
    if boundary is None:
        assert "boundary_last_polluted" not in metrics and "boundary_lo" not in metrics
        assert metrics["transitions"] == 0 and metrics["search_budget_hit"] == 0
        assert "all clean over 128..1024" in out.replace("\n", " ")
    else:
        assert (metrics["boundary_last_polluted"], metrics["boundary_first_clean"]) == boundary
        # grid + ceil(log2(gap)) probes: 7 grid points + 7 bisection steps at most
        assert metrics["probes"] <= 7 + 7


def test_reference_is_measured_once_and_reused(tmp_path):
    rc, out = cli(tmp_path, "cudagraph.capture=256,512", LENGTHS)
    assert rc == 0, out
    rc, out = cli(tmp_path, "spec.k=0,1", LENGTHS, "cache=false")
    assert rc == 0, out
    assert len(worker_records(tmp_path, role="reference")) == 1
    references = mlflow_runs(tmp_path, role="reference")
    assert len(references) == 1
    jobs = mlflow_runs(tmp_path, role="job")
    assert {r.data.params["reference.run_id"] for r in jobs} == {references[0].info.run_id}


def test_a_sweep_dir_with_odd_characters_is_quoted_where_oneknob_passes_it_on(tmp_path):
    odd = tmp_path / "x-ü $(id) it's"
    rc, out = cli(tmp_path, f"hydra.sweep.dir='{str(odd)}'".replace("'s", "\\'s"), "cudagraph.capture=128,256",
                  "lengths=[128,256]", "samples=1")
    assert rc == 0, out
    assert (odd / "summary.json").is_file() and not (tmp_path / "uid=0(root)").exists()
    assert "Traceback" not in out
