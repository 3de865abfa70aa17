"""The second axis (issue 25): what shares the step (axis=batch) and whether repeats agree (axis=repeat).

Through the real Hydra CLI on the synthetic engine, whose fault is judged on the tokens a step schedules (probe +
neighbours) and which turns nondeterministic above a concurrency; plus the pure pieces (scheduling, the
co-scheduling label, agreement) in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import mlflow_client, mlflow_runs, run_cli, tracking_uri

from oneknob.engines.synthetic import SyntheticEngine
from oneknob.plan.axis import Axis
from oneknob.verdict import agreement

DOWN, UP = "polluted->clean", "clean->polluted"
BATCH = ["axis=batch", "batch.probe_length=200", "samples=1"]


def sweep(tmp_path, *overrides: str, rc: int = 0) -> dict:
    code, out = run_cli(tmp_path, *overrides, multirun=True)
    assert code == rc, out
    path = sorted(Path(tmp_path).glob("multirun/*/summary.json"))[-1]
    summary = json.loads(path.read_text())
    return {"out": " ".join(out.split()), "runs": {r["name"]: r for r in summary["runs"]},
            "report": (path.parent / "report.md").read_text()}


def pairs(run: dict) -> list[tuple]:
    return [(t["lo"], t["hi"], t["direction"], t["resolved"]) for t in run["transitions"]]


def test_batch_neighbour_lengths_find_the_edge_in_tokens_per_step_and_it_moves_with_the_capture_size(tmp_path):
    found = sweep(tmp_path, *BATCH, "batch.neighbour_lengths=[0,100,200,300,400,800]", "cudagraph.capture=null,256")
    base, small = found["runs"]["baseline"], found["runs"]["cudagraph.capture=256"]
    assert base["axis"] == small["axis"] == "batch"
    assert pairs(base) == [(312, 313, DOWN, True)]  # 200 + 312 = 512 = the resolved max capture size
    assert pairs(small) == [(56, 57, DOWN, True)]  # 200 + 56 = 256
    report = found["report"]
    assert ("baseline: 312|313 neighbour tokens is 512|513 tokens per step (probe 200 + neighbours); the edge tracks "
            "tokens per step: last polluted 512 = resolved max capture size") in report
    assert "cudagraph.capture=256: 56|57 neighbour tokens is 256|257 tokens per step" in report
    assert "| neighbour tokens (batch) | mean NLL | NLL ref | delta | verdict | tokens per step | schedule |" in report
    assert "| **313** | " in report and "| 513 | co-scheduled |" in report
    # MLflow: the metric step is the axis value; the run says which axis
    (job,) = [r for r in mlflow_runs(tmp_path, role="job") if r.info.run_name == "baseline"]
    assert job.data.tags["oneknob.axis"] == "batch"
    client = mlflow_client(tracking_uri(tmp_path))
    steps = {m.step: m.value for m in client.get_metric_history(job.info.run_id, "step_tokens")}
    assert steps[0] == 200 and steps[312] == 512 and steps[313] == 513
    assert {m.step for m in client.get_metric_history(job.info.run_id, "nll")} >= {0, 100, 312, 313, 800}


def test_batch_neighbour_counts_bisect_and_a_step_over_budget_is_labelled_not_hidden(tmp_path):
    # 64-token neighbours: 4 of them make 456 tokens per step (polluted), 5 make 520 (clean)
    found = sweep(tmp_path / "count", *BATCH, "batch.neighbours=[0,1,2,4,8]", "batch.neighbour_length=64",
                  "cudagraph.capture=null,256")
    assert pairs(found["runs"]["baseline"]) == [(4, 5, DOWN, True)]
    assert "| neighbours (batch) |" in found["report"]
    # a budget of 512 tokens per step: a 400-token neighbour no longer fits the probe's step whole
    tight = sweep(tmp_path / "tight", *BATCH, "batch.neighbour_lengths=[100,400]", "engine.max_num_batched_tokens=512",
                  "search.suspects=false", "cudagraph.capture=null,256")
    base = tight["runs"]["baseline"]
    assert base["schedule_labels"]["400"] == "the probe's step held 512 tokens, not the 600 of probe + neighbours"
    assert "not co-scheduled (judged, but the step was not what the point claims): 400 (the probe's step held 512" \
        in tight["report"]


def test_repeat_finds_the_concurrency_above_which_repeats_differ(tmp_path):
    found = sweep(tmp_path, "axis=repeat", "repeat.concurrency=[1,2,4,8]", "repeat.n=3",
                  "engine.fault.nondeterministic_above=4", "engine.fault.pollute=false", "samples=1",
                  "cudagraph.capture=null,256")
    base = found["runs"]["baseline"]
    assert base["axis"] == "repeat"
    assert pairs(base) == [(4, 5, UP, True)]  # bisected 4..8 in concurrency units
    assert "| concurrency (repeat) |" in found["report"] and " | identical |" in found["report"]
    assert "| **5** |" in found["report"] and "differs (max " in found["report"]
    # deterministic engine: identical at every concurrency, no transition
    calm = sweep(tmp_path / "calm", "axis=repeat", "repeat.concurrency=[1,8]", "engine.fault.pollute=false",
                 "samples=1", "cudagraph.capture=null,256")
    assert pairs(calm["runs"]["baseline"]) == []
    assert "differs (max" not in calm["report"]


def test_a_batch_point_never_answers_for_a_length_point(tmp_path):
    sweep(tmp_path, "lengths=[300]", "samples=1", "search.suspects=false", "cudagraph.capture=null,256")
    found = sweep(tmp_path, "axis=batch", "batch.probe_length=100", "batch.neighbour_lengths=[300]", "samples=1",
                  "search.suspects=false", "cudagraph.capture=null,256")
    assert "0 cached / 1 measured" in found["out"]


def test_scheduling_and_labels():
    engine = SyntheticEngine()
    engine.resolved = {"max_num_batched_tokens": 512, "max_num_seqs": 2}
    steps = engine.schedule([200, 400, 10])
    assert steps[0] == {"total": 512, "scheduled": [[0, 200], [1, 312]]}  # chunked; max_num_seqs=2 leaves #2 out
    said = agreement.co_scheduling(steps, prompts=3, expected=610)
    assert said["schedule"] == "1 of 2 neighbour(s) not in the probe's step" and said["probe_steps"] == [512]
    assert agreement.co_scheduling([{"total": 300, "scheduled": [[0, 200], [1, 100]]}], 2, 300)["schedule"] == \
        agreement.CO_SCHEDULED
    assert agreement.agreement([-1.0, -2.0], [-1.0, -2.0], 0.1) == (agreement.IDENTICAL, 0.0)
    assert agreement.agreement([-1.0, -2.0], [-1.0, -2.05], 0.1)[0] == agreement.WITHIN
    assert agreement.agreement([-1.0, -2.0], [-1.0, -2.5], 0.1) == (agreement.DIFFERS, 0.5)
    axis = Axis("batch", (0, 1, 2), "neighbours", 200, neighbour_length=64)
    assert axis.step_tokens(2) == 328 and axis.value_at_step_tokens(328) == 2 and axis.value_at_step_tokens(300) is None
    assert Axis().key() == {}  # the length axis keeps the cache it had
