"""Signals beyond mean NLL: the top-k and greedy oracles, their comparisons, and the split they show.

Unit tests of the comparisons (no engine), the synthetic engine's generation path, and the CLI on the
synthetic engine: a fault that corrupts only prompt logprobs (the seed's bug) is flagged by nll and top-k
and not by greedy generation; one that corrupts only generation, the other way round.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from helpers import metric_steps, mlflow_client, mlflow_runs, run_cli, worker_records

from oneknob.verdict import oracles
from oneknob.config.schema import VerdictConfig
from oneknob.engines.synthetic import SyntheticEngine
from oneknob.verdict.judge import judge


def test_topk_overlap_and_kl_over_the_shared_support():
    ref = [[(1, math.log(0.5)), (2, math.log(0.3)), (3, math.log(0.2))]]
    assert oracles.topk_compare(ref, ref, 3, 0.1) == {"topk_overlap": 1.0, "topk_overlap_min": 1.0,
                                                     "topk_kl": pytest.approx(0.0, abs=1e-12),
                                                     "topk_kl_max": pytest.approx(0.0, abs=1e-12),
                                                     "topk_share_beyond": 0.0}
    ours = [[(1, math.log(0.3)), (2, math.log(0.5)), (9, math.log(0.2))]]
    found = oracles.topk_compare(ours, ref, 3, 0.1)
    assert found["topk_overlap"] == pytest.approx(2 / 3)
    # over {1, 2}, renormalised: reference (5/8, 3/8) against ours (3/8, 5/8)
    expected = 5 / 8 * math.log(5 / 3) + 3 / 8 * math.log(3 / 5)
    assert found["topk_kl"] == pytest.approx(expected) and found["topk_share_beyond"] == 1.0
    disjoint = oracles.topk_compare([[(7, -1.0)]], [[(8, -1.0)]], 1, 0.1)
    assert disjoint["topk_overlap"] == 0.0 and disjoint["topk_kl"] == oracles.NO_SHARED_SUPPORT_KL


def test_greedy_match_and_first_divergence():
    assert oracles.greedy_compare([1, 2, 3, 4], [1, 2, 3, 4]) == {"greedy_match": 1.0, "greedy_first_divergence": -1}
    assert oracles.greedy_compare([1, 2, 9, 4], [1, 2, 3, 4]) == {"greedy_match": 0.75, "greedy_first_divergence": 2}
    assert oracles.greedy_compare([1, 2], [1, 2, 3, 4])["greedy_first_divergence"] == 2  # a short one diverges


def test_thresholds_flag_and_the_point_is_polluted_when_any_asked_oracle_is():
    verdict = VerdictConfig(topk=2)
    ref = [[(1, -0.5), (2, -1.0)]] * 3
    worse = [[(5, -0.5), (6, -1.0)]] * 3
    same_logprobs = [-0.5, -0.5, -0.5]
    point = judge(4, 0, same_logprobs, 0.0, same_logprobs, verdict, oracles=("nll", "topk"), topk=worse,
                  reference_topk=ref)
    assert (point.nll_polluted, point.topk_polluted, point.polluted) == (False, True, True)
    only_nll = judge(4, 0, same_logprobs, 0.0, same_logprobs, verdict, oracles=("nll",), topk=worse,
                     reference_topk=ref)
    assert only_nll.topk_polluted is True and only_nll.polluted is False  # measured, not asked for
    assert oracles.flags({"greedy_match": 0.9375}, VerdictConfig(greedy_min_match=1.0)) == {"greedy": True}
    assert oracles.flags({"greedy_match": 0.9375}, VerdictConfig(greedy_min_match=0.9)) == {"greedy": False}


def test_a_cached_point_covers_only_what_it_holds():
    record = {"logprobs": [-1.0], "topk": [[(1, -1.0), (2, -2.0)]], "greedy": [1, 2, 3]}
    assert oracles.covers(record, 2, 3) and oracles.covers(record, 0, 0)
    assert not oracles.covers(record, 5, 0) and not oracles.covers(record, 0, 16)
    assert not oracles.covers({"logprobs": [-1.0]}, 1, 0)


def _engine(**fault):
    engine = SyntheticEngine()
    engine.start({"knobs": {"spec.k": 3, "runner": "v1", "sched.max_num_seqs": 128}, "settings": {},
                  "options": {"fault": fault, "max_num_batched_tokens": 2048}})
    return engine


@pytest.mark.parametrize("target,prompt_hit,generation_hit", [("prompt", True, False), ("generation", False, True),
                                                               ("both", True, True)])
def test_the_synthetic_fault_corrupts_what_its_target_says(target, prompt_hit, generation_hit):
    ids = list(b"def f(x):\n    return x + 1\n" * 8)  # 224 tokens <= the resolved max capture size 512
    clean = _engine(pollute=False).score(ids, topk=3, greedy=8)
    faulty = _engine(target=target).score(ids, topk=3, greedy=8)
    assert (faulty["logprobs"] != clean["logprobs"]) is prompt_hit
    assert (faulty["topk"] != clean["topk"]) is prompt_hit
    assert (faulty["greedy"] != clean["greedy"]) is generation_hit
    assert len(faulty["greedy"]) == 8 and all(len(row) == 3 for row in faulty["topk"])
    # the plain request gives the same logprobs as the one with the extras
    assert _engine(target=target).score(ids)["logprobs"] == faulty["logprobs"]


# search.suspects=false: the grid's lengths only (the per-length assertions below list them)
ORACLE_RUN = ("oracles=[nll,topk,greedy]", "lengths=[128,256,512,513,1024]", "samples=2", "search.suspects=false")


def _oracles_of(tmp_path) -> dict:
    (result,) = Path(tmp_path, "outputs").glob("*/result.json")
    return json.loads(result.read_text())["oracles"]


def test_a_prompt_only_fault_is_prompt_logprobs_polluted_and_generation_clean(tmp_path):
    rc, out = run_cli(tmp_path, *ORACLE_RUN)
    assert rc == 0, out
    found = _oracles_of(tmp_path)
    assert found["nll"]["flagged"] == found["topk"]["flagged"] == [128, 256, 512]
    assert found["greedy"] == {"flagged": [], "transitions": []}
    assert "oracles: nll polluted at 128, 256, 512" in out and "greedy clean" in out
    (job,) = mlflow_runs(tmp_path, experiment="oneknob-synthetic", role="job")
    client = mlflow_client(tmp_path)
    history = {m.step: m.value for m in client.get_metric_history(job.info.run_id, "greedy_match")}
    assert history == {128: 1.0, 256: 1.0, 512: 1.0, 513: 1.0, 1024: 1.0}
    assert [m.value for m in client.get_metric_history(job.info.run_id, "polluted_topk")] == [1, 1, 1, 0, 0]
    assert metric_steps(tmp_path, job.info.run_id, "topk_overlap") == [128, 256, 512, 513, 1024]
    rows = list(csv.DictReader(open(next(Path(tmp_path, "outputs").glob("*/points.csv")))))
    assert {r["greedy_polluted"] for r in rows} == {"False"} and {r["nll_polluted"] for r in rows} == {"True", "False"}


def test_a_generation_only_fault_is_flagged_by_greedy_alone(tmp_path):
    rc, out = run_cli(tmp_path, *ORACLE_RUN, "engine.fault.target=generation")
    assert rc == 0, out
    found = _oracles_of(tmp_path)
    assert found["nll"]["flagged"] == found["topk"]["flagged"] == []
    assert found["greedy"]["flagged"] == [128, 256, 512]
    assert found["greedy"]["transitions"] == [{"lo": 512, "hi": 513, "direction": "polluted->clean",
                                               "resolved": True}]


def test_greedy_continuations_of_the_predicted_suspects_come_from_the_first_reference_session(tmp_path):
    """The reference's greedy continuations are per length. The grid's and the suspect lengths the resolution
    rules predict (capture size 512: 511) are measured in the reference's one engine session, so the job's
    greedy judgement starts no second reference engine."""
    rc, out = run_cli(tmp_path, "oracles=[nll,topk,greedy]", "lengths=[128,256,512,513,1024]", "samples=1")
    assert rc == 0, out
    (result,) = Path(tmp_path, "outputs").glob("*/result.json")
    assert "511" in json.loads(result.read_text())["suspects"]
    assert len(worker_records(tmp_path, role="reference")) == 1, worker_records(tmp_path)
    assert "greedy continuations of" not in out  # no reference session after the job's
    (job,) = mlflow_runs(tmp_path, experiment="oneknob-synthetic", role="job")
    steps = metric_steps(tmp_path, job.info.run_id, "greedy_match")
    assert {511, 512, 513} <= set(steps)


@pytest.mark.parametrize("overrides,message", [
    (["oracles=[greedy]"], "oracles=['greedy']: the search along prompt length needs prompt logprobs"),
    (["oracles=[nll,bogus]"], "oracles=['nll', 'bogus']: the oracles are nll, topk, greedy; give one or more, "
                              "e.g. oracles=[nll,topk,greedy]"),  # the example survives the console's markup
    (["verdict.topk=0"], "verdict.topk=0: must be in [1, 20]"),
    (["verdict.greedy_tokens=-3"], "verdict.greedy_tokens=-3: must be >= 1"),
    (["verdict.topk_min_overlap=2"], "verdict.topk_min_overlap=2.0: a share, must be in [0, 1]"),
    (["verdict.topk_max_kl=-1"], "verdict.topk_max_kl=-1.0: must be >= 0"),
    (["oracles=[nll,greedy]", "reference=null"], "topk and greedy compare with a reference"),
    (["oracles=[topk]", "reference=null"], "topk and greedy compare with a reference"),
    (["reference_engine=bogus"], "reference_engine=bogus: use vllm"),
    (["reference_engine=transformers"], "reference_engine=transformers: engine=synthetic has no checkpoint"),
])
def test_oracle_settings_that_cannot_work_are_refused(tmp_path, overrides, message):
    rc, out = run_cli(tmp_path, *overrides, "lengths=[128,256]")
    assert rc == 2, out
    assert message in out and "Traceback" not in out


def test_the_one_line_says_which_oracle_flagged_what_and_marks_unresolved_transitions():
    found = {"nll": {"flagged": [], "transitions": []},
             "greedy": {"flagged": [256], "transitions": [
                 {"lo": 256, "hi": 600, "direction": "polluted->clean", "resolved": False}]},
             "topk": {"flagged": [128, 512], "transitions": [
                 {"lo": 512, "hi": 513, "direction": "polluted->clean", "resolved": True}]}}
    assert oracles.describe(found) == ("oracles: nll clean; greedy polluted at 256 (polluted->clean at 256..600); "
                                       "topk polluted at 128, 512 (polluted->clean at 512|513)")
