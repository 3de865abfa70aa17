"""oneknob against a real MLflow tracking server on 127.0.0.1, checked through the server's REST API.

What a teammate opening the shared server sees: every job run nested under its
sweep's parent (tag mlflow.parentRunId), and nll, nll_ref and polluted logged
with the prompt length as the step. The comparison CLI reads the same server.
"""

import json

import pytest
from helpers import mlflow_runs, python_module, run_cli
from mlflow_server import experiment, mlflow_server  # noqa: F401  (fixtures)

GRID = [200, 300, 600]
pytestmark = pytest.mark.slow  # a real mlflow server: 10-20 s to start, once per session


def test_sweep_nests_under_parent_and_logs_lengths_as_steps(tmp_path, mlflow_server, experiment):  # noqa: F811
    rc, out = run_cli(tmp_path, f"lengths=[{','.join(map(str, GRID))}]",
                      "samples=1", "cudagraph.capture=256,512", f"tracking.uri={mlflow_server.uri}",
                      f"tracking.experiment={experiment}", multirun=True)
    assert rc == 0, out
    assert mlflow_runs(tmp_path, experiment) == [], "wrote to the local store, not the server"

    runs = mlflow_server.runs(experiment)
    parents = [r for r in runs if r["tags"].get("oneknob.role") == "sweep"]
    jobs = [r for r in runs if r["tags"].get("oneknob.role") == "job"]
    assert len(parents) == 1, [r["name"] for r in runs]
    parent = parents[0]
    assert parent["status"] == "FINISHED"
    assert len(jobs) == 2
    assert {r["tags"].get("mlflow.parentRunId") for r in jobs} == {parent["id"]}
    assert {r["tags"]["oneknob.sweep_id"] for r in jobs} == {parent["tags"]["oneknob.sweep_id"]}

    for job in jobs:
        capture = int(job["params"]["knob.cudagraph.capture"])
        assert job["status"] == "FINISHED"
        histories = {key: mlflow_server.history(job["id"], key) for key in ("nll", "nll_ref", "polluted")}
        steps = [step for step, _ in histories["nll"]]
        assert set(GRID) <= set(steps), steps  # the grid, then the bisection's lengths
        assert len(steps) == len(set(steps)) and min(steps) >= min(GRID) and max(steps) <= max(GRID)
        for key in ("nll_ref", "polluted"):
            assert [step for step, _ in histories[key]] == steps, key
        polluted = dict(histories["polluted"])
        assert polluted == {length: float(length <= capture) for length in steps}
        assert {capture, capture + 1} <= set(steps)  # bisected down to adjacent lengths
        nll, nll_ref = dict(histories["nll"]), dict(histories["nll_ref"])
        assert all(nll[length] > nll_ref[length] + 1 for length in steps if polluted[length])
        assert all(abs(nll[length] - nll_ref[length]) < 1e-9 for length in steps if not polluted[length])
        assert job["metrics"]["boundary_last_polluted"] == capture

    # the comparison, from the server alone, in a directory that has no local store
    out_dir = tmp_path / "compare"
    rc, out = python_module(tmp_path / "multirun", "oneknob", "compare", "--tracking-uri", mlflow_server.uri,
                            "--experiment", experiment, "--sweep", parent["tags"]["oneknob.sweep_id"],
                            "--out", str(out_dir))
    assert rc == 0, out
    summary = json.loads((out_dir / "summary.json").read_text())
    assert sorted(r["run_id"] for r in summary["runs"]) == sorted(j["id"] for j in jobs)
    assert summary["parent_run_id"] == parent["id"]


def test_single_run_then_sync_against_the_server(tmp_path, mlflow_server, experiment):  # noqa: F811
    rc, out = run_cli(tmp_path, "lengths=[200,300]", "samples=1",
                      f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={experiment}")
    assert rc == 0, out
    before = mlflow_server.runs(experiment)
    jobs = [r for r in before if r["tags"].get("oneknob.role") == "job"]
    assert len(jobs) == 1 and jobs[0]["status"] == "FINISHED" and "mlflow.parentRunId" not in jobs[0]["tags"]
    assert {200, 300} <= {step for step, _ in mlflow_server.history(jobs[0]["id"], "nll")}
    # nothing is missing on the server, so sync uploads nothing and duplicates nothing
    rc, out = python_module(tmp_path, "oneknob", "sync", "--tracking-uri", mlflow_server.uri, "outputs")
    assert rc == 0, out
    after = mlflow_server.runs(experiment)
    assert sorted(r["id"] for r in after) == sorted(r["id"] for r in before)
