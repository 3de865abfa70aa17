"""A malformed engine answer is a measurement: read and checked where it leaves the worker (oneknob.engines.answers),
judged polluted with its reason by the oracles that read the malformed part, searched and reported like any other
point; only no answer at all is an engine error. The shapes in process (vLLM's {token id: Logprob} rows as the
offline engine reads them); a sweep on the synthetic engine (engine.fault.malformed) through the CLI; the real vLLM
CPU engine in tests/test_malformed_vllm.py.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from helpers import run_cli

from oneknob.config.schema import VerdictConfig
from oneknob.engines import answers
from oneknob.verdict.judge import judge, malformed_oracles


def _rows(ids: list[int], lp: float = -1.0) -> list:
    """vLLM's prompt_logprobs for a prompt: None, then {token: Logprob} holding each position's own token."""
    return [None] + [{t: SimpleNamespace(logprob=lp, rank=1)} for t in ids[1:]]


def _read(entries, ids, topk: int = 0) -> dict:
    own = lambda row, token: None if row.get(token) is None else row[token].logprob  # noqa: E731 (vllm._own_logprob)
    ranked = lambda row: [(lp.rank, t, lp.logprob) for t, lp in row.items()]  # noqa: E731
    return answers.check(answers.prompt_rows(entries, ids, own, ranked, topk), len(ids), topk=topk)


IDS = list(range(10, 20))  # a 10-token prompt: 9 positions


def test_every_malformed_shape_is_a_reason_never_an_exception():
    """What vLLM answered wrongly in shape or value is said (and padded to the shape asked for), not raised: the
    job's engine error "vLLM returned no logprob for prompt token ... at position 1" was a numerics bug's answer."""
    clean = _read(_rows(IDS), IDS)
    assert "malformed" not in clean and clean["logprobs"] == [-1.0] * 9
    lacking = _rows(IDS)
    for p in (3, 4, 5):
        lacking[p] = {999: SimpleNamespace(logprob=-0.5, rank=1)}  # a row without the prompt's own token
    nan, inf = _rows(IDS), _rows(IDS)
    nan[2][IDS[2]].logprob, inf[7][IDS[7]].logprob = math.nan, -math.inf
    holes = _rows(IDS)
    holes[6] = None
    cases = {  # rows as answered -> the reason recorded
        "lacking": (lacking, "3 of 9 rows lack the prompt's token"),
        "fewer rows": (_rows(IDS)[:6], "6 rows for a 10-token prompt"),
        "a row missing": (holes, "1 of 9 rows are missing"),
        "none at all": (None, "no prompt logprobs at all"),
        "nan": (nan, "1 of 9 logprobs are NaN"),
        "inf": (inf, "1 of 9 logprobs are infinite"),
    }
    for name, (entries, reason) in cases.items():
        answer = _read(entries, IDS)
        assert len(answer["logprobs"]) == 9, name  # the shape asked for: the cache and the judge see one shape
        assert reason in answer["malformed"]["logprobs"], (name, answer["malformed"])
        point = judge(10, 0, answer["logprobs"], 0.1, [-1.0] * 9, VerdictConfig(), oracles=("nll",),
                      malformed=answer["malformed"])
        assert point.polluted and point.malformed["nll"].startswith("malformed: "), name
    # an answer from an engine of another shape, checked the same way (top-k rows short or NaN)
    answer = answers.check({"logprobs": [-1.0] * 9, "topk": [[(1, -0.1), (2, math.nan)]] * 9}, 10, topk=2)
    assert "topk" in answer["malformed"] and "logprobs" not in answer["malformed"]
    assert [len(row) for row in answer["topk"]] == [2] * 9
    # judged per oracle: a malformed top-k leaves the nll oracle's verdict its own
    assert malformed_oracles(answer["malformed"], ("nll", "topk")) == {"topk": "malformed: " +
                                                                      answer["malformed"]["topk"]}


@pytest.mark.slow  # a sweep of two jobs on the synthetic engine
def test_a_sweep_whose_engine_answers_malformed_rows_is_judged_searched_and_reported(tmp_path):
    rc, out = run_cli(tmp_path, "cudagraph.capture=256,512", "engine.fault.malformed=lacking", "lengths=[200,300]",
                      "samples=1", f"hydra.sweep.dir={tmp_path}/s", multirun=True)
    assert rc == 0, out  # judged, not failed: no job failed, no retry line
    assert "retry:" not in out and "failed" not in out, out
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    runs = {r["name"]: r for r in summary["runs"]}
    (edge,) = runs["baseline"]["transitions"]  # searched and bisected over malformed points like any other
    assert (edge["lo"], edge["hi"], edge["direction"]) == (256, 257, "polluted->clean"), edge
    assert runs["cudagraph.capture=512"]["shape"] == "all polluted"
    malformed = summary["malformed"]
    assert malformed["points"] == sum(m["count"] for m in malformed["runs"].values()) > 0, malformed
    report = (tmp_path / "s" / "report.md").read_text()
    assert f"malformed answers: {malformed['points']} point(s), judged polluted" in report
    assert "rows lack the prompt's token" in report
    result = json.loads((tmp_path / "s" / "0" / "result.json").read_text())
    assert result["status"] == "ok" and result["malformed"], result


def test_a_server_answer_of_any_shape_is_read_as_malformed_never_raised():
    """`vllm serve`'s JSON is read by oneknob.engines.vllm.server: a token id that is no number, a rank that is
    text, rows that are a dict or a string, a row whose entry is no object, a logprob that is text. Each was an
    exception (ValueError from int('x'), TypeError from 'a' <= 2, KeyError from a dict's rows): an engine error for
    an engine that answered. Each is now a reason, in the shape asked for."""
    from oneknob.engines.vllm import server as vllm_server

    ids = [5, 6, 7, 8]
    row = lambda t, **extra: {str(t): {"logprob": -1.0, "rank": 1} | extra,  # noqa: E731 (top-2: two entries)
                              "99": {"logprob": -2.0, "rank": 2}}
    good = [None, row(6), row(7), row(8)]
    hostile = {
        "a token id that is no number": [None, row(6), {"7": {"logprob": -1.0, "rank": 1}, "x": {"rank": 2}}, row(8)],
        "a rank that is text": [None, row(6), row(7, rank="first"), row(8)],
        "rows that are a dict": {"1": row(6), "2": row(7), "3": row(8)},
        "rows that are text": "rows",
        "an entry that is no object": [None, row(6), {"7": -1.0}, row(8)],
        "a logprob that is text": [None, row(6), row(7, logprob="low"), row(8)],
        "a row that is a list": [None, row(6), [7, -1.0], row(8)],
    }
    read = lambda entries: answers.check(answers.prompt_rows(  # noqa: E731
        entries, ids, vllm_server._own_logprob, vllm_server._ranked, 2), len(ids), topk=2)
    assert "malformed" not in read(good)
    for name, entries in hostile.items():
        answer = read(entries)
        assert len(answer["logprobs"]) == 3 and len(answer["topk"]) == 3, name
        assert answer.get("malformed"), name
