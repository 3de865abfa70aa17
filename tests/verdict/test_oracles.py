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


def _topk_by_position(topk, reference, k, max_kl):
    """topk_compare's definition, one position at a time (its code before it was vectorised)."""
    overlaps, kls = [], []
    for ours, theirs in zip(topk, reference):
        ours_d, theirs_d = dict((int(t), lp) for t, lp in ours[:k]), dict((int(t), lp) for t, lp in theirs[:k])
        shared = ours_d.keys() & theirs_d.keys()
        overlaps.append(len(shared) / max(len(theirs_d), 1))
        if not shared:
            kls.append(oracles.NO_SHARED_SUPPORT_KL)
            continue
        ref_norm = math.log(math.fsum(math.exp(theirs_d[t]) for t in shared))
        our_norm = math.log(math.fsum(math.exp(ours_d[t]) for t in shared))
        kls.append(max(0.0, math.fsum(math.exp(theirs_d[t] - ref_norm) * ((theirs_d[t] - ref_norm)
                                                                          - (ours_d[t] - our_norm)) for t in shared)))
    return {"topk_overlap": math.fsum(overlaps) / len(overlaps), "topk_overlap_min": min(overlaps),
            "topk_kl": math.fsum(kls) / len(kls), "topk_kl_max": max(kls),
            "topk_share_beyond": sum(kl > max_kl for kl in kls) / len(kls)}


def _approx(values: dict) -> dict:
    return {key: pytest.approx(value, rel=1e-9, abs=1e-12) for key, value in values.items()}


def test_topk_compare_equals_its_per_position_definition_on_random_tables():
    """Rows of k or k + 1 entries (vLLM adds the prompt token when it is not in the top k), tuples or JSON lists,
    some identical, some shorter than k, some sharing nothing; the reference may hold more rows."""
    import random

    rng = random.Random(0)

    def row(k, vocab):
        ids = rng.sample(range(vocab), k + rng.choice([0, 0, 1]))
        logprobs = sorted((math.log(rng.random() + 1e-9) for _ in ids), reverse=True)
        return [(t, lp) if rng.random() < 0.5 else [t, lp] for t, lp in zip(ids, logprobs)]
    for _ in range(200):
        k, n = rng.randint(1, 6), rng.randint(1, 40)
        vocab = rng.choice([k + 1, 2 * k, 50])
        ours = [row(k, vocab) for _ in range(n)]
        ref = [r if rng.random() < 0.3 else row(k, vocab) for r in ours] + [row(k, vocab) for _ in range(2)]
        if rng.random() < 0.2:
            ours[0] = ours[0][:rng.randint(0, k - 1)]
        assert oracles.topk_compare(ours, ref, k, 0.1) == _approx(_topk_by_position(ours, ref, k, 0.1))
        # as a job judges against a reference: its rows read once (as wide as its widest row), a prefix per length
        table = oracles.TopKTable.read(ref, max(map(len, ref)))
        shorter = rng.randint(1, n)
        assert oracles.topk_compare(ours[:shorter], table[:shorter], k, 0.1) == _approx(
            _topk_by_position(ours[:shorter], ref, k, 0.1))


def test_a_workers_rows_are_its_pairs_and_judge_as_their_arrays():
    """The executor's rows of a worker's answer are the (id, logprob) pairs the worker packed, and the oracle reads
    the arrays they hold with the same numbers as the rows themselves."""
    import random

    from oneknob.run.executor import _topk_rows
    from oneknob.run.worker import pack

    rng = random.Random(1)
    k, n = 4, 50
    rows = [[(rng.randrange(30), math.log(rng.random() + 1e-9)) for _ in range(k)] for _ in range(n)]
    ref = [[(rng.randrange(30), math.log(rng.random() + 1e-9)) for _ in range(k)] for _ in range(n + 3)]
    got = _topk_rows({"topk_ids": pack([t for row in rows for t, _ in row], "q"),
                      "topk_logprobs": pack([lp for row in rows for _, lp in row], "d")}, k)
    assert got == rows and got.arrays[0].shape == (n, k)
    assert oracles.topk_compare(got, ref, k, 0.1) == oracles.topk_compare(rows, ref, k, 0.1)
    assert oracles.topk_compare(got, ref, k - 1, 0.1) == oracles.topk_compare(rows, ref, k - 1, 0.1)


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


def test_a_cached_point_covers_only_what_it_holds():
    record = {"logprobs": [-1.0], "topk": [[(1, -1.0), (2, -2.0)]], "greedy": [1, 2, 3],
              "greedy_logprobs": [-0.1, -0.2, -0.3]}
    assert oracles.covers(record, 2, 3) and oracles.covers(record, 0, 0)
    assert not oracles.covers(record, 5, 0) and not oracles.covers(record, 0, 16)
    assert not oracles.covers({**record, "greedy_logprobs": None}, 0, 3)  # cached before the decode oracle
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
    assert (faulty["greedy_logprobs"] != clean["greedy_logprobs"]) is generation_hit
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
    assert found["greedy"]["flagged"] == [] and found["greedy"]["transitions"] == []
    assert "nll/topk: polluted->clean at 512|513" in out and "greedy: all clean over 128..1024" in out
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
    (edge,) = found["greedy"]["transitions"]
    assert (edge["lo"], edge["hi"], edge["direction"], edge["resolved"]) == (512, 513, "polluted->clean", True)
    assert edge["covers"] == [512, 527] and edge["first_position"] == 512  # the whole continuation flips


def test_continuations_a_job_produced_before_cost_no_reference_request(tmp_path):
    """The reference scores each continuation teacher-forced once, stored by its tokens: a rerun (cache=false,
    so the engine measures again and produces the same continuations) makes no reference request and starts
    no reference engine for them."""
    run = ("oracles=[nll,greedy,decode]", "lengths=[128,256,512,513,1024]", "samples=1", "search.suspects=false")
    rc, out = run_cli(tmp_path, *run)
    assert rc == 0, out
    assert "reference request(s) for continuations this job" in out
    starts = len(worker_records(tmp_path, role="reference"))
    rc, out = run_cli(tmp_path, *run, "cache=false")
    assert rc == 0, out
    assert "reference request(s) for continuations" not in out and "scoring" not in out
    assert len(worker_records(tmp_path, role="reference")) == starts
    results = sorted(Path(tmp_path, "outputs").glob("*/result.json"))
    assert json.loads(results[-1].read_text())["continuation_scores"] == 0


@pytest.mark.parametrize("overrides,message", [
    (["oracles=[nll,bogus]"], "oracles=['nll', 'bogus']: the oracles are nll, topk, greedy, decode; give one or "
                              "more, "
                              "e.g. oracles=[nll,topk,greedy]"),  # the example survives the console's markup
    (["verdict.topk=0"], "verdict.topk=0: must be in [1, 20]"),
    (["verdict.greedy_tokens=-3"], "verdict.greedy_tokens=-3: must be >= 1"),
    (["verdict.topk_min_overlap=2"], "verdict.topk_min_overlap=2.0: a share, must be in [0, 1]"),
    (["verdict.topk_max_kl=-1"], "verdict.topk_max_kl=-1.0: must be >= 0"),
    (["oracles=[nll,greedy]", "reference=null"], "topk, greedy and decode compare with a reference"),
    (["oracles=[topk]", "reference=null"], "topk, greedy and decode compare with a reference"),
    (["oracles=[nll,decode]", "reference=null"], "topk, greedy and decode compare with a reference"),
    (["verdict.tol_decode=-1"], "verdict.tol_decode=-1.0: must be >= 0"),
    (["reference_engine=bogus"], "reference_engine=bogus: use vllm"),
    (["reference_engine=transformers"], "reference_engine=transformers: engine=synthetic has no checkpoint"),
])
def test_oracle_settings_that_cannot_work_are_refused(tmp_path, overrides, message):
    rc, out = run_cli(tmp_path, *overrides, "lengths=[128,256]")
    assert rc == 2, out
    assert message in out and "Traceback" not in out
