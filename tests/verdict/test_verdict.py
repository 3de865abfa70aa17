"""The verdict per prompt and per length, in process: README's rule and its wording, exactly.

"A sample is polluted when |NLL - NLL_ref| > verdict.tol_nll (0.1 nats) and > verdict.rtol_nll (5 %) of
NLL_ref; a length is polluted when any sample is, and the report says "polluted in 1 of 3 samples" when
they disagree. An edge that exists only because of one tolerance is labelled so. reference=null judges by
verdict.max_nll alone." Expected values are worked out by hand from those sentences, not from verdict.py.
"""

from __future__ import annotations

import math

import pytest

from oneknob.config.schema import VerdictConfig
from oneknob.verdict.judge import (CLEAN, POLLUTED, Point, disagreeing, fails, judge, mean, mean_nll, samples_text,
                             tolerance_edge, tolerance_text, verdict_of)

DEFAULT = VerdictConfig()  # tol_nll 0.1, rtol_nll 0.05, tol_token 0.1, max_nll 8.0


def flat(value: float, length: int = 10) -> list[float]:
    """Logprobs of a prompt of `length` tokens whose every scored position has NLL `value`."""
    return [-value] * (length - 1)


def test_the_defaults_are_the_documented_ones():
    assert (DEFAULT.tol_nll, DEFAULT.rtol_nll, DEFAULT.tol_token, DEFAULT.max_nll) == (0.1, 0.05, 0.1, 8.0)
    assert (POLLUTED, CLEAN) == ("polluted", "clean")


def test_mean_nll_is_over_the_scored_positions():
    assert mean_nll([-1.0, -2.0, -3.0]) == 2.0
    assert mean_nll([-0.5]) == 0.5
    assert mean([1.0, 2.0, 6.0]) == 3.0


@pytest.mark.parametrize("delta,nll_ref,polluted", [
    (0.2, 10.0, False),  # over tol_nll, under 5 % of 10 (0.5): clean
    (0.08, 1.0, False),  # over 5 % of 1 (0.05), under tol_nll: clean
    (0.2, 1.0, True),  # over both
    (-0.2, 1.0, True),  # either sign
    (0.6, 10.0, True),  # over both, the relative limit the larger
    (-0.6, 10.0, True),
])
def test_polluted_needs_both_tolerances(delta, nll_ref, polluted):
    point = judge(10, 0, flat(nll_ref + delta), 0.0, flat(nll_ref), DEFAULT)
    assert point.polluted is polluted
    assert point.delta_nll == pytest.approx(delta) and point.nll_ref == pytest.approx(nll_ref)


def test_each_tolerance_is_strict_and_its_own():
    # 0.25 against NLL_ref 5: exactly 5 % of 5, over tol_nll -> not over the relative limit
    verdict = VerdictConfig(tol_nll=0.1, rtol_nll=0.05)
    assert fails(0.25, 5.0, verdict) == {"tol_nll": True, "rtol_nll": False}
    assert fails(0.1, 1.0, verdict) == {"tol_nll": False, "rtol_nll": True}  # exactly tol_nll is not over it
    assert fails(-0.3, -5.0, verdict) == {"tol_nll": True, "rtol_nll": True}  # magnitudes on both sides
    assert fails(0.0, 0.0, verdict) == {"tol_nll": False, "rtol_nll": False}
    # the two tolerances come from the config, not from constants
    assert fails(0.15, 1.0, VerdictConfig(tol_nll=0.2, rtol_nll=0.05)) == {"tol_nll": False, "rtol_nll": True}
    assert fails(0.15, 1.0, VerdictConfig(tol_nll=0.1, rtol_nll=0.2)) == {"tol_nll": True, "rtol_nll": False}


def test_a_point_records_the_comparison_per_position():
    reference = [-1.0, -1.0, -1.0, -1.0]  # a prompt of 5 tokens: 4 scored positions
    logprobs = [-1.0, -1.05, -1.5, -3.0]  # deltas 0, 0.05, 0.5, 2.0
    point = judge(5, 2, logprobs, 1.5, reference, DEFAULT, cached=True)
    assert (point.length, point.sample, point.scored, point.seconds, point.cached) == (5, 2, 4, 1.5, True)
    assert point.nll == pytest.approx((1 + 1.05 + 1.5 + 3) / 4) and point.nll_ref == 1.0
    assert point.delta_nll == pytest.approx(point.nll - 1.0)
    assert point.max_abs_delta == pytest.approx(2.0)
    assert point.share_deviating == 0.5  # 0.5 and 2.0 exceed tol_token 0.1; 0.05 does not
    assert point.first_deviation == 3  # 1-based position of the first one
    assert point.polluted is True


def test_the_reference_is_sliced_to_the_prompts_prefix():
    reference = flat(1.0, 20) + [-50.0] * 5  # causal: a longer reference serves every shorter prefix
    point = judge(20, 0, flat(1.0, 20), 0.0, reference, DEFAULT)
    assert point.nll_ref == 1.0 and point.delta_nll == 0.0 and not point.polluted
    assert (point.max_abs_delta, point.share_deviating, point.first_deviation) == (0.0, 0.0, None)


def test_positions_at_exactly_tol_token_do_not_deviate():
    point = judge(3, 0, [-1.0, -1.25], 0.0, [-1.0, -1.0], VerdictConfig(tol_token=0.25))
    assert point.share_deviating == 0.0 and point.first_deviation is None
    point = judge(3, 0, [-1.5, -1.0], 0.0, [-1.0, -1.0], VerdictConfig(tol_token=0.25))
    assert point.share_deviating == 0.5 and point.first_deviation == 1


@pytest.mark.parametrize("nll,polluted", [(7.9, False), (8.0, False), (8.1, True), (15.0, True)])
def test_absolute_mode_judges_by_max_nll_alone(nll, polluted):
    point = judge(10, 0, flat(nll), 0.0, None, DEFAULT)
    assert point.polluted is polluted and point.nll == pytest.approx(nll)
    assert (point.nll_ref, point.delta_nll, point.max_abs_delta, point.share_deviating) == (None,) * 4
    assert point.first_deviation is None and point.scored == 9


def test_absolute_mode_reads_max_nll_from_the_config():
    assert judge(10, 0, flat(3.0), 0.0, None, VerdictConfig(max_nll=2.5)).polluted is True
    assert judge(10, 0, flat(3.0), 0.0, None, VerdictConfig(max_nll=3.5)).polluted is False
    assert judge(10, 0, flat(3.0), 0.0, None, DEFAULT, cached=True).cached is True


def test_an_engine_answer_of_the_wrong_size_or_not_finite_is_refused():
    with pytest.raises(ValueError) as wrong:
        judge(10, 0, flat(1.0, 9), 0.0, None, DEFAULT)
    assert str(wrong.value) == "engine returned 8 logprobs for a prompt of 10 tokens (expected 9)"
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError) as nonfinite:
            judge(3, 1, [-1.0, bad], 0.0, None, DEFAULT)
        assert str(nonfinite.value) == "engine returned a non-finite logprob for length 3, sample 1"


def _point(polluted: bool, length: int = 10, sample: int = 0) -> Point:
    return Point(length, sample, 1.0, 9, 0.0, polluted=polluted)


def test_a_length_is_polluted_when_any_sample_is():
    assert verdict_of([_point(False), _point(False), _point(True)]) == "polluted"
    assert verdict_of([_point(True), _point(False)]) == "polluted"
    assert verdict_of([_point(True)]) == "polluted"
    assert verdict_of([_point(False), _point(False)]) == "clean"
    assert disagreeing([_point(False), _point(True)]) is True
    assert disagreeing([_point(True), _point(True)]) is False
    assert disagreeing([_point(False)]) is False
    assert samples_text(1, 3) == "polluted in 1 of 3 samples"


def _judged(delta: float, nll_ref: float, length: int = 10, sample: int = 0) -> Point:
    return judge(length, sample, flat(nll_ref + delta, length), 0.0, flat(nll_ref, length), DEFAULT)


def test_a_clean_length_over_the_absolute_tolerance_is_an_edge_of_the_relative_one():
    near = _judged(0.15, 4.0, length=183, sample=1)  # 0.15 > tol_nll, <= 5 % of 4 (0.2)
    assert not near.polluted
    edge = tolerance_edge([_judged(0.0, 4.0), near], DEFAULT)
    assert edge == {"only": "rtol_nll", "length": 183, "sample": 1, "delta_nll": 0.15, "limit": 0.2,
                    "tol_nll": 0.1, "rtol_nll": 0.05}
    assert tolerance_text(edge) == (
        "an edge of the relative tolerance alone: at 183, |delta NLL| 0.1500 > verdict.tol_nll=0.1 but <= "
        "verdict.rtol_nll=0.05 x NLL_ref (0.2000); under the absolute tolerance alone 183 would be polluted too")


def test_a_clean_length_over_the_relative_tolerance_is_an_edge_of_the_absolute_one():
    near = _judged(-0.08, 1.0, length=300)  # 0.08 > 5 % of 1, <= tol_nll 0.1
    assert not near.polluted
    edge = tolerance_edge([near], DEFAULT)
    assert edge == {"only": "tol_nll", "length": 300, "sample": 0, "delta_nll": -0.08, "limit": 0.1,
                    "tol_nll": 0.1, "rtol_nll": 0.05}
    assert tolerance_text(edge) == (
        "an edge of the absolute tolerance alone: at 300, |delta NLL| 0.0800 > verdict.rtol_nll=0.05 x NLL_ref "
        "but <= verdict.tol_nll=0.1; under the relative tolerance alone 300 would be polluted too")


def test_the_relative_edge_is_named_first_and_plain_clean_points_are_no_edge():
    relative, absolute = _judged(0.15, 4.0, length=20), _judged(0.08, 1.0, length=30)
    assert tolerance_edge([absolute, relative], DEFAULT)["only"] == "rtol_nll"
    assert tolerance_edge([_judged(0.01, 4.0), _judged(0.0, 1.0)], DEFAULT) is None
    assert tolerance_edge([], DEFAULT) is None
    # absolute mode has no delta: never an edge
    assert tolerance_edge([judge(10, 0, flat(1.0), 0.0, None, DEFAULT)], DEFAULT) is None


def test_a_point_is_not_cached_unless_said_and_absolute_mode_keeps_the_prompts_identity():
    assert judge(10, 0, flat(1.0), 0.0, flat(1.0), DEFAULT).cached is False
    assert judge(10, 0, flat(1.0), 0.0, None, DEFAULT).cached is False
    point = judge(12, 3, flat(1.0, 12), 2.5, None, DEFAULT)
    assert (point.length, point.sample, point.seconds, point.scored) == (12, 3, 2.5, 11)


def test_a_tolerance_edge_is_rounded_to_six_decimals():
    reference = flat(10 / 3)  # NLL_ref 3.333..., so 5 % of it is 0.1666...
    point = judge(10, 0, flat(10 / 3 + 0.1234567), 0.0, reference, DEFAULT)
    edge = tolerance_edge([point], DEFAULT)
    assert (edge["delta_nll"], edge["limit"]) == (0.123457, 0.166667)


# -- the top-k oracle beside nll: polluted when any oracle the study asked for says so ---------------------

REF_TOPK = [[(1, -0.1), (2, -2.5)], [(3, -0.2), (4, -1.8)]]  # a 3-token prompt: 2 scored positions


def test_the_topk_oracle_pollutes_only_when_asked_for():
    disjoint = [[(7, -0.1), (8, -2.5)], [(9, -0.2), (6, -1.8)]]
    asked = judge(3, 0, flat(1.0, 3), 0.0, flat(1.0, 3), DEFAULT, oracles=("nll", "topk"), topk=disjoint,
                  reference_topk=REF_TOPK)
    assert (asked.polluted, asked.nll_polluted, asked.topk_polluted) == (True, False, True)
    assert (asked.topk_overlap, asked.topk_kl) == (0.0, 99.0)  # no shared token: as far apart as it gets
    not_asked = judge(3, 0, flat(1.0, 3), 0.0, flat(1.0, 3), DEFAULT, oracles=("nll",), topk=disjoint,
                      reference_topk=REF_TOPK)
    assert (not_asked.polluted, not_asked.topk_polluted) == (False, True)
    only_topk = judge(3, 0, flat(5.0, 3), 0.0, flat(1.0, 3), DEFAULT, oracles=("topk",), topk=REF_TOPK,
                      reference_topk=REF_TOPK)
    assert (only_topk.polluted, only_topk.nll_polluted, only_topk.topk_polluted) == (False, True, False)
    assert (only_topk.topk_overlap, only_topk.topk_kl) == (1.0, 0.0)


def test_the_topk_oracle_compares_the_prompts_prefix_with_the_configs_k():
    longer = [*REF_TOPK, [(5, -0.1), (6, -2.0)]]  # the reference is measured once, at the longest length
    half = [[(1, -0.1), (2, -2.5)], [(9, -0.2), (6, -1.8)]]  # the second position shares nothing
    point = judge(3, 0, flat(1.0, 3), 0.0, flat(1.0, 3), DEFAULT, oracles=("topk",), topk=half,
                  reference_topk=longer)
    assert point.topk_overlap == 0.5 and point.topk_polluted is True
    first_only = [[(1, -0.1), (5, -2.5)], [(3, -0.2), (6, -1.8)]]  # the second-best ids differ
    k1 = judge(3, 0, flat(1.0, 3), 0.0, flat(1.0, 3), VerdictConfig(topk=1), oracles=("topk",), topk=first_only,
               reference_topk=REF_TOPK)
    assert k1.topk_overlap == 1.0 and k1.topk_polluted is False
    # without both tables there is no top-k verdict
    for topk, reference in ((None, REF_TOPK), (REF_TOPK, None)):
        point = judge(3, 0, flat(1.0, 3), 0.0, flat(1.0, 3), DEFAULT, oracles=("nll", "topk"), topk=topk,
                      reference_topk=reference)
        assert (point.topk_overlap, point.topk_kl, point.topk_polluted, point.nll_polluted) == (None, None, None,
                                                                                                 False)
