"""What a boundary tracks, proven by experiment: the follow-up runs and the tested explanations.

The pure parts (the hypotheses "side = X + d", what a run one knob away says of each, the design of the run that
separates them, the targeted probes' verdict) in process, on hand-built runs; then the sweeps a user types, on the
synthetic engine (engine.fault.edge_offset, islands, a decode fault following a model field): every resolved edge
is concluded by a run or says why not. The real-vLLM case (a model field of the project's own longrope model moved
with model.override, vLLM's hf_overrides and the transformers reference alike) is tests/vllm/test_length_model.py; the
seed's study concluding from its own runs is tests/study/test_ablation.py and tests/vllm/test_vllm_cli.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import mlflow_runs, run_cli, worker_records

from oneknob.errors import ConfigError
from oneknob.explain import followup_design as design
from oneknob.explain import tested
from oneknob.explain.hypotheses import Hypothesis, comparable, conclude, evidence, hypotheses
from oneknob.verdict.search import DOWN, UP

SEED = {"max_capture_size": 512, "seqs_x_query_len": 512, "batched_tokens_per_query_len": 512,
        "default_capture_ceiling": 512, "grid_stride_edge": 256}


def edge(lo: int, hi: int | None = None, direction: str = DOWN, **extra) -> dict:
    hi = lo + 1 if hi is None else hi
    return {"lo": lo, "hi": hi, "direction": direction, "resolved": hi == lo + 1, **extra}


def run(name: str, requested: dict, transitions: list[dict], lengths=(128, 1024), **resolved) -> dict:
    base = {"max_capture_size": 512, "capture_sizes": [512], "cudagraph_mode": "FULL_AND_PIECEWISE",
            "max_num_seqs": 128, "max_num_batched_tokens": 2048, "spec_k": 3, "runner": "v1", "platform": "cuda"}
    return {"name": name, "requested": requested, "resolved": base | resolved, "transitions": transitions,
            "check": {}, "points": [{"length": L} for L in lengths], "status": "ok", "axis": "length",
            "knob": next(iter(requested), None) if name != "baseline" else None}


# -- hypotheses -------------------------------------------------------------------------------------------

def test_coinciding_quantities_are_the_candidates_exact_first():
    found = hypotheses(edge(512), SEED | {"model.window": 514})
    assert [h.quantity for h in found] == ["max_capture_size", "seqs_x_query_len", "batched_tokens_per_query_len",
                                           "default_capture_ceiling", "model.window"]
    assert found[0] == Hypothesis("max_capture_size", 512, "last_polluted", 512, 0)
    assert found[-1] == Hypothesis("model.window", 514, "first_clean", 513, -1)


def test_where_nothing_coincides_the_nearest_below_and_above_each_side_at_any_distance():
    found = hypotheses(edge(424), SEED | {"model.attention_chunk_size": 400, "model.y": 900, "knob x": 2000})
    assert [h.quantity for h in found][:2] == ["model.attention_chunk_size", "max_capture_size"]
    assert found[0].offset == 24 and found[0].relation == "last_polluted" and not found[0].coincides
    assert "knob x" not in [h.quantity for h in found]  # a third value above: not among the nearest two
    assert {h.quantity for h in found} >= {"grid_stride_edge", "seqs_x_query_len"}
    assert hypotheses(edge(300, 400), SEED) == []  # unresolved: no side to read


def test_a_decode_edge_names_what_its_first_divergent_position_coincides_with():
    (h, *_) = hypotheses(edge(384, direction=UP, first_position=400), {"model.sliding_window": 400, "x": 900})
    assert (h.quantity, h.relation, h.offset, h.at_position, h.coincides) == (
        "model.sliding_window", "first_polluted", -15, 400, True)


# -- evidence and conclusions ---------------------------------------------------------------------------

CAPTURE = Hypothesis("max_capture_size", 512, "last_polluted", 512, 0)
SEQS = Hypothesis("seqs_x_query_len", 512, "last_polluted", 512, 0)


def test_what_a_run_one_knob_away_says_of_a_hypothesis():
    moved = run("capture=256", {"cudagraph.capture": 256}, [edge(256)])
    word = evidence(CAPTURE, None, DOWN, moved, {"max_capture_size": 256, "seqs_x_query_len": 512})
    assert (word.status, word.value, word.edge) == ("moved", 256, "256|257")
    word = evidence(SEQS, None, DOWN, moved, {"max_capture_size": 256, "seqs_x_query_len": 512})
    assert (word.status, word.kind) == ("ruled_out", "stayed")  # the edge moved while it stayed
    stayed = run("seqs=64", {"sched.max_num_seqs": 64}, [edge(512)])
    word = evidence(SEQS, None, DOWN, stayed, {"seqs_x_query_len": 256})
    assert (word.status, word.kind, word.predicted) == ("ruled_out", "held", 256)
    elsewhere = run("x", {"x": 1}, [edge(300)])
    assert evidence(CAPTURE, None, DOWN, elsewhere, {"max_capture_size": 256}).kind == "other"
    cleared = run("eager", {"cudagraph.enforce_eager": True}, [])
    assert evidence(CAPTURE, None, DOWN, cleared, {"max_capture_size": 256}).status == "unknown"
    unresolved = run("u", {"x": 1}, [edge(200, 300)])
    assert evidence(CAPTURE, None, DOWN, unresolved, {"max_capture_size": 256}).status == "unknown"
    assert evidence(CAPTURE, None, UP, moved, {"max_capture_size": 256}).status == "unknown"  # other direction


def test_tracks_only_when_the_quantity_moved_alone_and_the_edge_followed():
    runs = {"a": evidence(CAPTURE, None, DOWN, run("a", {"c": 1}, [edge(256)]), {"max_capture_size": 256,
                                                                                 "seqs_x_query_len": 512}),
            "b": evidence(SEQS, None, DOWN, run("a", {"c": 1}, [edge(256)]), {"max_capture_size": 256,
                                                                              "seqs_x_query_len": 512})}
    found = conclude([CAPTURE, SEQS], {"max_capture_size": [runs["a"]], "seqs_x_query_len": [runs["b"]]},
                     {"last_polluted": 512, "first_clean": 513})
    assert (found["tracks"], found["offset"], found["ruled_out"], found["evidence"]) == (
        "max_capture_size", 0, ["seqs_x_query_len"], ["a"])
    assert found["power_of_two"] == "coincides"  # the moved edge, 256, is one too
    both = run("k", {"spec.k": 1}, [edge(256)])
    together = conclude([CAPTURE, SEQS], {
        "max_capture_size": [evidence(CAPTURE, None, DOWN, both, {"max_capture_size": 256})],
        "seqs_x_query_len": [evidence(SEQS, None, DOWN, both, {"seqs_x_query_len": 256})]}, {"last_polluted": 512})
    assert together["tracks"] is None and together["together"] == ["max_capture_size", "seqs_x_query_len"]


def test_runs_are_comparable_one_knob_apart_not_counting_pins():
    base = run("baseline", {"spec.k": 3, "cudagraph.capture": None}, [])
    k1 = run("spec.k=1", {"spec.k": 1, "cudagraph.capture": 512}, [])
    k1["check"] = {"pinned": {"cudagraph.capture": 512}}
    two = run("two", {"spec.k": 1, "cudagraph.capture": 256}, [])
    assert comparable(base, k1) and not comparable(base, two) and not comparable(base, base)


# -- the design of a follow-up ----------------------------------------------------------------------------

def trial_of(baseline: dict):
    from oneknob.config import resolution

    def predict(knob_values):
        return resolution.predict({"spec.k": 3, "sched.max_num_seqs": 128, "runner": "v1"} | knob_values,
                                  max_num_batched_tokens=2048)
    return tested.trial_predictor(baseline, predict)


def test_the_follow_up_moves_the_capture_size_to_384_predicting_384_385():
    baseline = run("baseline", {}, [edge(512)])
    trial = trial_of(baseline)
    candidates = hypotheses(edge(512), tested.run_edges.candidates(baseline))
    made = design.design(baseline, candidates[0], candidates[1:], trial, (128, 1024), [{}])
    assert (made.knob, made.value, made.moved_to, made.predicted) == ("cudagraph.capture", 384, 384, (384, 385))
    seqs = next(h for h in candidates if h.quantity == "seqs_x_query_len")
    made = design.design(baseline, seqs, [h for h in candidates if h is not seqs], trial, (128, 1024), [{}])
    assert made.knob == "sched.max_num_seqs" and made.predicted[0] == made.moved_to  # not the capture knob
    ceiling = next(h for h in candidates if h.quantity == "default_capture_ceiling")
    assert design.design(baseline, ceiling, [], trial, (128, 1024), [{}]) == design.NO_KNOB  # a constant
    assert design.design(baseline, candidates[0], [], trial, (700, 1024), [{}]) == design.OUTSIDE
    # a trial equal to a run that exists is not proposed again: the next value off the powers of two is (256 is one)
    again = design.design(baseline, candidates[0], candidates[1:], trial, (128, 1024), [{}, {"cudagraph.capture": 384}])
    assert (again.value, again.predicted) == (640, (640, 641))


def test_a_model_field_is_moved_by_its_own_override_and_keeps_the_offset():
    baseline = run("baseline", {}, [edge(424)], model_quantities={"model.attention_chunk_size": 400})
    (chunk, *others) = hypotheses(edge(424), tested.run_edges.candidates(baseline))
    made = design.design(baseline, chunk, others, trial_of(baseline), (128, 1024), [{}])
    assert (made.knob, made.value, made.predicted) == ("model.override.attention_chunk_size", 300, (324, 325))


def test_the_targeted_probes_settle_a_hypothesis_or_hand_over_to_the_search():
    predicted, old = (384, 385), (512, 513)
    assert design.targeted(predicted, old) == [384, 385, 512, 513]
    P, C = "polluted", "clean"
    assert design.decisive({384: P, 385: C, 512: C, 513: C}, predicted, old, DOWN)  # moved as predicted
    assert design.decisive({384: P, 385: P, 512: P, 513: C}, predicted, old, DOWN)  # stayed
    assert not design.decisive({384: C, 385: C, 512: C, 513: C}, predicted, old, DOWN)  # elsewhere: search
    assert not design.decisive({384: P, 385: C, 512: P, 513: C}, predicted, old, DOWN)  # both: search
    assert design.decisive({384: C, 385: P, 512: P, 513: P}, predicted, old, UP)


def test_oracles_that_conclude_the_same_of_one_edge_are_said_once():
    """nll and topk both find 512|513 tracking the capture size (greedy disagrees elsewhere): the title and the
    paragraph say it once, without an oracle's name; an edge only some oracles share keeps their names."""
    from oneknob.explain import answer

    def concluded(oracle, transition):
        return {"run": "baseline", "oracle": oracle, "transition": transition, "direction": "polluted->clean",
                "tracks": "max_capture_size", "label": "resolved max capture size", "offset": 0, "ruled_out": [],
                "text": f"{oracle}: {transition} tracks the resolved max capture size with offset 0: ..."}

    points = [{"length": n, "polluted": n <= 512, "nll": 1.0} for n in (128, 512, 513, 600)]
    run = {"name": "baseline", "knob": None, "status": "ok", "points": points, "transitions": [
        {"lo": 512, "hi": 513, "direction": "polluted->clean", "resolved": True}]}
    summary = {"runs": [run], "conclusions": [concluded("nll", "512|513"), concluded("topk", "512|513")]}
    assert answer.title(summary) == "512|513 tracks the resolved max capture size"
    assert answer.explanation(summary, run) == ["512|513 tracks the resolved max capture size with offset 0: ..."]
    assert answer.conclusion_lines(summary) == ["baseline: 512|513 tracks the resolved max capture size with "
                                                "offset 0: ..."]
    summary["conclusions"] = [concluded("nll", "424|425"), concluded("topk", "424|425"), concluded("greedy", "512|513")]
    assert answer.title(summary) == ("nll's and topk's 424|425 tracks the resolved max capture size; greedy's 512|513 "
                                     "tracks the resolved max capture size")
    assert answer.explanation(summary, run)[0].startswith("nll, topk: 424|425 tracks")


def test_a_bad_budget_is_refused_naming_the_key():
    from omegaconf import OmegaConf

    from oneknob.study import followups

    assert followups.budget(OmegaConf.create({"explain": {"followups": 2}})) == 2
    for bad in (-1, True, "3"):
        with pytest.raises(ConfigError, match=r"explain.followups=.*an integer >= 0"):
            followups.budget(OmegaConf.create({"explain": {"followups": bad}}))


# -- the sweeps a user types (synthetic engine) -----------------------------------------------------------

EAGER = ("cudagraph.enforce_eager=false,true", "samples=1")


def sweep(tmp_path, *overrides: str, followups: int = 3, env: dict | None = None) -> dict:
    rc, out = run_cli(tmp_path, *EAGER, *overrides, f"explain.followups={followups}", multirun=True, timeout=300,
                      env=env)
    assert rc == 0, out
    (path,) = Path(tmp_path).glob("multirun/*/summary.json")
    summary = json.loads(path.read_text())
    return {"out": " ".join(out.split()), "lines": out.splitlines(), "summary": summary,
            "runs": {r["name"]: r for r in summary["runs"]},
            "report": (path.parent / "report.md").read_text(), "conclusions": summary["conclusions"]}


@pytest.mark.slow
def test_one_follow_up_proves_the_capture_size_and_rules_out_the_rest(tmp_path):
    found = sweep(tmp_path, env={"COLUMNS": None})  # as in a pipe: 120 columns
    said = ("follow-up 1/3: cudagraph.capture=384 relative to the baseline: does 512|513 track the resolved max "
            "capture size? (it predicts 384|385)")
    assert said in found["out"]
    long = [line for line in found["lines"] if len(line) > 120]  # the follow-up lines wrap as all prose does
    assert all(any("/" in word and len(word) > 20 for word in line.split()) for line in long), long  # paths only
    followup = found["runs"]["follow-up cudagraph.capture=384"]
    assert followup["followup"] and followup["followup_of"]["run"] == "baseline" and followup["probes"] == 4
    (conclusion,) = found["conclusions"]
    assert (conclusion["tracks"], conclusion["offset"], conclusion["evidence"]) == (
        "max_capture_size", 0, ["follow-up cudagraph.capture=384"])
    assert {"seqs_x_query_len", "batched_tokens_per_query_len"} <= set(conclusion["ruled_out"])
    assert "512|513 tracks the resolved max capture size with offset 0" in found["report"]
    assert "512|513 tracks the resolved max capture size with offset 0" in found["out"]  # the terminal says it
    (tagged,) = [r for r in mlflow_runs(tmp_path, role="job") if r.data.tags.get("oneknob.followup") == "true"]
    assert json.loads(tagged.data.tags["oneknob.followup_of"])["transition"] == "512|513"
    # a rerun plans the same follow-up, and it comes from the cache
    starts = len(worker_records(tmp_path, role="job"))
    again = sweep(tmp_path / "again", f"paths.cache={tmp_path}/.cache/oneknob",
                  f"paths.mlruns={tmp_path}/mlruns")
    assert "follow-up cudagraph.capture=384: polluted->clean at 384|385" in again["out"]
    assert "4 cached / 0 measured" in again["out"] and len(worker_records(tmp_path, role="job")) == starts


@pytest.mark.slow
def test_an_edge_at_a_model_field_plus_an_offset_tracks_it_in_prefill_and_in_generation(tmp_path):
    chunk = ("engine.fault.edge=model.attention_chunk_size", "engine.fault.edge_offset=24",
             "+engine.fault.model_config={attention_chunk_size:400}", "oracles=[greedy,nll]",
             "engine.fault.target=generation")
    found = sweep(tmp_path, *chunk)
    (conclusion,) = found["conclusions"]
    assert (conclusion["oracle"], conclusion["transition"], conclusion["tracks"], conclusion["offset"]) == (
        "greedy", "424|425", "model.attention_chunk_size", 24)
    assert conclusion["evidence"] == ["follow-up model.override.attention_chunk_size=300"]
    assert "greedy: 424|425 tracks model.attention_chunk_size with offset 24" in found["report"]


@pytest.mark.slow
def test_an_edge_near_a_quantity_that_does_not_follow_it_is_ruled_out_never_claimed(tmp_path):
    found = sweep(tmp_path, "engine.fault.edge=null", "engine.fault.islands=[[1,424]]",
                  "+engine.fault.model_config={attention_chunk_size:400}")
    (conclusion,) = found["conclusions"]
    assert conclusion["tracks"] is None and conclusion["ruled_out"][0] == "model.attention_chunk_size"
    assert len([r for r in found["runs"].values() if r["followup"]]) == 3  # the budget, spent
    assert any(u["why"] == "the follow-up budget is spent (explain.followups=3)" for u in conclusion["untested"])
    assert "tracks model.attention_chunk_size" not in found["report"] + found["out"]
    assert "424|425 does not track model.attention_chunk_size" in found["report"]


@pytest.mark.slow
def test_a_decode_edge_at_a_position_tracks_the_model_field_and_no_follow_up_when_asked_for_none(tmp_path):
    decode = ("engine.fault.edge=null", "engine.fault.decode_from=model.sliding_window",
              "+engine.fault.model_config={sliding_window:400}", "oracles=[greedy,nll]",
              "engine.fault.target=generation")
    found = sweep(tmp_path, *decode)
    (conclusion,) = found["conclusions"]
    assert (conclusion["transition"], conclusion["tracks"], conclusion["offset"]) == (
        "384|385", "model.sliding_window", -15)  # 16 generated tokens: a prompt of 385 reaches position 400
    assert "its first divergent position 400 = 400" in conclusion["text"]
    off = sweep(tmp_path / "off", *decode, followups=0)
    (conclusion,) = off["conclusions"]
    assert conclusion["tracks"] is None and not any(r["followup"] for r in off["runs"].values())
    assert conclusion["untested"][0]["why"] == "follow-ups are off (explain.followups=0)"
    assert "384|385: no run tested it; untested: coincides with model.sliding_window" in off["report"]
