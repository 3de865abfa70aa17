"""The decode oracles (greedy, decode): every oracle is a verdict, and corruption in generated tokens is found
exactly and measured in nats.

Unit tests of the teacher-forced comparison (no engine), then the CLI on the synthetic engine with its decode-only
faults (prompt logprobs untouched): from a token position (`engine.fault.decode_from_position`), as a drift that
flips no token (`engine.fault.decode_shift`), and as a variant's bug that the baseline lacks. The real engine's
case is tests/vllm/test_decode_vllm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import mlflow_client, mlflow_runs, run_cli, worker_records

from oneknob.config.schema import VerdictConfig
from oneknob.verdict import decode, search

# A decode bug from token position 300 on: a continuation of N = 16 after a prompt of L tokens covers L..L+15,
# so every prompt of L >= 285 is polluted and the edge is exactly 284|285, whatever the grid.
FROM_300 = ("engine.fault.target=generation", "engine.fault.edge=null", "engine.fault.decode_from_position=300")
GRID = ("lengths=[128,256,384,512]", "samples=1", "search.suspects=false")


def test_teacher_forced_comparison_counts_choices_after_the_same_prefix_and_deltas_in_nats():
    verdict = VerdictConfig()
    same = decode.compare([5, 6, 7, 8], [-0.5, -1.0, -0.2, -0.1], [-0.5, -1.0, -0.2, -0.1], [5, 6, 7, 8], verdict)
    assert (same["greedy_match"], same["greedy_first_divergence"], same["greedy_polluted"]) == (1.0, -1, False)
    assert (same["decode_delta"], same["decode_max_delta"], same["decode_polluted"]) == (0.0, 0.0, False)
    # one flipped choice at offset 2: greedy sees it; the reference scores the engine's token (meaningful after it)
    flipped = decode.compare([5, 6, 9, 8], [-0.5, -1.0, -0.2, -0.1], [-0.5, -1.0, -3.2, -0.1], [5, 6, 7, 8], verdict)
    assert (flipped["greedy_match"], flipped["greedy_first_divergence"], flipped["greedy_polluted"]) == (0.75, 2, True)
    assert flipped["decode_first_deviation"] == 2 and flipped["decode_max_delta"] == pytest.approx(3.0)
    assert flipped["decode_polluted"] and flipped["decode_nll_ref"] > flipped["decode_nll"]
    # a drift that flips nothing: greedy clean, decode polluted by the mean alone
    drift = decode.compare([5, 6], [-0.7, -1.2], [-0.5, -1.0], [5, 6], verdict)
    assert not drift["greedy_polluted"] and drift["decode_polluted"] and drift["decode_max_delta"] < 0.5
    assert drift["decode_delta"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="non-finite"):
        decode.compare([5], [float("nan")], [-0.5], [5], verdict)
    assert decode.position(285, 15) == 300 and decode.position(285, -1) is None


def test_every_oracle_is_narrowed_on_shared_probes_and_the_budget_is_shared():
    """nll flips at 512|513, greedy at 300|301: each oracle's bisection, one probe serving both."""
    def verdicts_at(L):
        return {"nll": "polluted" if L <= 512 else "clean", "greedy": "polluted" if L > 300 else "clean"}

    grid = [128, 384, 1024]
    by_oracle: dict[str, dict[int, str]] = {"nll": {}, "greedy": {}}
    while todo := search.wanted_each(grid, by_oracle, max_probes=64):
        for L in todo:
            for name, v in verdicts_at(L).items():
                by_oracle[name][L] = v
    combined, each = search.results(grid, by_oracle, max_probes=64)
    assert [t.text for t in each["nll"].transitions] == ["512|513"]
    assert [t.text for t in each["greedy"].transitions] == ["300|301"]
    # polluted where any oracle is: everywhere, so the combined verdict alone would never narrow either flip
    assert combined.transitions == [] and "nll: polluted->clean at 512|513" in search.headline(combined, each)
    assert combined.probes == len(by_oracle["nll"]) == len(by_oracle["greedy"])
    # a budget too small for both: it stops, and the headline says so
    small: dict[str, dict[int, str]] = {"nll": {}, "greedy": {}}
    while todo := search.wanted_each(grid, small, max_probes=5):
        for L in todo:
            for name, v in verdicts_at(L).items():
                small[name][L] = v
    combined, each = search.results(grid, small, max_probes=5)
    assert combined.probes == 5 and "search.max_probes=5 spent" in search.headline(combined, each)


def _result(tmp_path) -> dict:
    (result,) = Path(tmp_path, "outputs").glob("*/result.json")
    return json.loads(result.read_text())


def test_a_decode_only_fault_from_a_position_gives_exact_greedy_and_decode_edges(tmp_path):
    rc, out = run_cli(tmp_path, "oracles=[nll,greedy,decode]", *GRID, *FROM_300)
    assert rc == 0, out
    found = _result(tmp_path)
    assert found["oracles"]["nll"]["transitions"] == []  # prompt logprobs untouched
    for name in ("greedy", "decode"):
        (edge,) = found["oracles"][name]["transitions"]
        assert (edge["lo"], edge["hi"], edge["direction"]) == (284, 285, "clean->polluted")
        assert edge["covers"] == [285, 300] and edge["first_position"] == 300  # the bug's position, exactly
    assert [(t["lo"], t["hi"]) for t in found["transitions"]] == [(284, 285)]  # the run is not "all clean"
    assert not found["describe"].startswith("all clean")  # it names each oracle instead
    assert "greedy/decode: clean->polluted at 284|285" in out and "nll: all clean" in out
    (job,) = mlflow_runs(tmp_path, experiment="oneknob-synthetic", role="job")
    assert job.data.metrics["transitions_greedy"] == 1 and job.data.metrics["transitions_nll"] == 0
    assert json.loads(job.data.tags["oneknob.transitions.decode"])[0]["first_position"] == 300
    history = {m.step: m.value for m in mlflow_client(tmp_path).get_metric_history(job.info.run_id,
                                                                                   "decode_max_delta")}
    assert history[284] < 0.1 < history[285]


def test_a_drift_that_flips_no_token_is_seen_by_decode_alone(tmp_path):
    rc, out = run_cli(tmp_path, "oracles=[nll,greedy,decode]", *GRID, *FROM_300, "engine.fault.decode_shift=0.8")
    assert rc == 0, out
    found = _result(tmp_path)["oracles"]
    assert found["greedy"]["transitions"] == [] and found["nll"]["transitions"] == []
    assert [(t["lo"], t["hi"]) for t in found["decode"]["transitions"]] == [(284, 285)]


@pytest.mark.parametrize("order", ["[greedy,nll]", "[nll,greedy]"])
def test_the_order_of_the_oracles_changes_nothing_but_the_listing(tmp_path, order):
    rc, out = run_cli(tmp_path / order, f"oracles={order}", *GRID, *FROM_300)
    assert rc == 0, out
    found = _result(tmp_path / order)
    assert {n: r["transitions"] for n, r in found["oracles"].items()} == {
        "nll": [], "greedy": [{"lo": 284, "hi": 285, "direction": "clean->polluted", "resolved": True,
                               "polluted_samples": 1, "samples": 1, "covers": [285, 300], "first_position": 300}]}
    assert [(t["lo"], t["hi"]) for t in found["transitions"]] == [(284, 285)]
    assert found["verdicts"]["384"] == "polluted" and found["verdicts"]["256"] == "clean"


def test_a_variants_decode_bug_appears_versus_a_clean_baseline_in_summary_and_report(tmp_path):
    """The baseline runs Model Runner V1, the variant V2, whose decode the fault corrupts from position 300 on
    (`polluting_runners=[v2]`); neither touches prompt logprobs."""
    rc, out = run_cli(tmp_path, "runner=v1,v2", "engine.fault.polluting_runners=[v2]", "oracles=[greedy,nll,decode]",
                      *GRID, *FROM_300, multirun=True)
    assert rc == 0, out
    (summary_path,) = Path(tmp_path, "multirun").glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    base, variant = summary["runs"]
    assert base["knob"] is None and base["shape"] == "all clean"
    assert variant["transitions"] and variant["shape"] != "all clean"
    assert variant["versus_baseline"]["relation"] == "appeared"
    assert variant["oracle_results"]["greedy"]["versus_baseline"]["relation"] == "appeared"
    assert variant["oracle_results"]["nll"]["versus_baseline"]["relation"] == "unchanged"
    assert variant["headline"].startswith("greedy/decode: clean->polluted at 284|285")
    report = (summary_path.parent / "report.md").read_text()
    assert "greedy/decode: clean->polluted at 284|285" in report
    assert "first diverges at position 300" in report
    assert 'runner="v2" appeared: 284|285, where the baseline has none' in report  # the combined verdict's words
    assert "greedy/decode: 284\\|285 c->p; nll: none (all clean) | appeared" in report  # which oracles saw it
    assert "| greedy match | first divergent position |" in report


def test_two_engines_never_run_at_once_where_the_device_is_exclusive(tmp_path):
    """On a GPU (faked: ONEKNOB_EXCLUSIVE_DEVICE=1) the job's engine stops before the reference scores its
    continuations and the reference stops after each round; on CPU (the default here) they run side by side.
    Read from workers.jsonl's start and stop events."""
    def most_alive(root) -> int:
        events = sorted([(r["time"], 1) for r in worker_records(root, "start")]
                        + [(r["time"], -1) for r in worker_records(root, "stop")])
        alive = peak = 0
        for _, step in events:
            alive += step
            peak = max(peak, alive)
        return peak

    run = ("oracles=[nll,decode]", *GRID, *FROM_300)
    rc, out = run_cli(tmp_path / "gpu", *run, env={"ONEKNOB_EXCLUSIVE_DEVICE": "1"})
    assert rc == 0, out
    assert most_alive(tmp_path / "gpu") == 1
    assert [(t["lo"], t["hi"]) for t in _result(tmp_path / "gpu")["oracles"]["decode"]["transitions"]] == [(284, 285)]
    rc, out = run_cli(tmp_path / "cpu", *run)
    assert rc == 0, out
    assert most_alive(tmp_path / "cpu") == 2
    # a per-length reference (issue 40: reference_per_length=true) keeps the rule too
    rc, out = run_cli(tmp_path / "per-length", "reference_per_length=true", *GRID,
                      env={"ONEKNOB_EXCLUSIVE_DEVICE": "1"})
    assert rc == 0, out
    assert most_alive(tmp_path / "per-length") == 1


def test_a_variants_edge_is_explained_against_the_models_config_and_the_baseline(tmp_path):
    """Issue 39: the baseline is clean, the variant flips at q+1|q+2 with q a field of the model's config; the
    sentence ties the edge to q in Result and summary.json, and says q did not move with the knob."""
    rc, out = run_cli(tmp_path, "runner=v1,v2", "engine.fault.polluting_runners=[v2]", "engine.fault.edge=null",
                      "engine.fault.islands=[[302,100000]]", "+engine.fault.model_config={max_position_embeddings:300}",
                      *GRID, multirun=True)
    assert rc == 0, out
    (summary_path,) = Path(tmp_path, "multirun").glob("*/summary.json")
    base, variant = json.loads(summary_path.read_text())["runs"]
    assert base["explained"] == []
    (edge,) = variant["explained"]
    assert edge["transition"] == "301|302"
    assert [(s["relation"], s["matches"][0]["quantity"], s["matches"][0]["offset"]) for s in edge["sides"]] == [
        ("last_clean", "model.max_position_embeddings", 1), ("first_polluted", "model.max_position_embeddings", 2)]
    report = (summary_path.parent / "report.md").read_text()
    result = report.split("## What each knob did", 1)[1].split("## Coincidences", 1)[0]
    assert "last clean 301 = model.max_position_embeddings (300) + 1" in result
    assert "(an edge the baseline lacks; unmoved: model.max_position_embeddings (300))" in result
