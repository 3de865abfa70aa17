"""Boundary search against verdict functions whose transitions are known."""

from __future__ import annotations

import math

import pytest

from oneknob.verdict.search import DOWN, UP, Transition, find_boundaries, polluted_spans, wanted

SEED_GRID = [200, 256, 300, 384, 480, 512, 513, 600, 768, 900, 1024]


def polluted_up_to(*edges: int):
    """A verdict function that flips at each edge: polluted for L <= edges[0],
    clean up to edges[1], polluted again up to edges[2], ... and counts its calls."""
    calls: list[int] = []

    def verdict_of(length: int) -> str:
        calls.append(length)
        flips = sum(1 for edge in edges if length > edge)
        return "polluted" if flips % 2 == 0 else "clean"

    verdict_of.calls = calls
    return verdict_of


def clean_up_to(edge: int):
    def verdict_of(length: int) -> str:
        return "clean" if length <= edge else "polluted"

    return verdict_of


def probe_bound(grid: list[int], result) -> int:
    """len(grid) + ceil(log2(gap)) for every grid pair that needed bisection."""
    grid = sorted(set(grid))
    bound = len(grid)
    for t in result.transitions:
        lo = max(g for g in grid if g <= t.lo)
        hi = min(g for g in grid if g >= t.hi)
        bound += math.ceil(math.log2(hi - lo)) if hi - lo > 1 else 0
    return bound


@pytest.mark.parametrize("edge", [512, 256, 257, 299, 700, 1000])
def test_single_boundary_found_exactly(edge):
    verdict_of = polluted_up_to(edge)
    result = find_boundaries(SEED_GRID, verdict_of)
    assert result.transitions == [Transition(edge, edge + 1, DOWN)]
    assert result.transitions[0].resolved and result.transitions[0].sign == 1
    assert result.monotone and not result.budget_hit
    assert result.probes == len(verdict_of.calls) == len(set(verdict_of.calls))
    assert result.probes <= probe_bound(SEED_GRID, result)
    assert result.describe() == f"polluted->clean at {edge}|{edge + 1} (last polluted {edge}, first clean {edge + 1})"


def test_seed_boundary_on_adjacent_grid_points_needs_no_bisection():
    verdict_of = polluted_up_to(512)
    result = find_boundaries(SEED_GRID, verdict_of)
    assert result.probes == len(SEED_GRID)
    assert sorted(verdict_of.calls) == SEED_GRID


def test_several_boundaries_are_all_reported():
    verdict_of = polluted_up_to(300, 650, 900)
    result = find_boundaries(SEED_GRID, verdict_of)
    assert result.transitions == [Transition(300, 301, DOWN), Transition(650, 651, UP), Transition(900, 901, DOWN)]
    assert not result.monotone
    assert [t.sign for t in result.transitions] == [1, -1, 1]
    assert result.probes <= probe_bound(SEED_GRID, result)
    assert result.describe() == ("non-monotone: 3 transitions: polluted->clean at 300|301, clean->polluted at "
                                 "650|651, polluted->clean at 900|901")


def test_clean_then_polluted_is_a_transition_too():
    result = find_boundaries(SEED_GRID, clean_up_to(400))
    assert result.transitions == [Transition(400, 401, UP)] and result.transitions[0].sign == -1
    assert result.describe() == "clean->polluted at 400|401 (last clean 400, first polluted 401)"


def test_all_clean():
    result = find_boundaries(SEED_GRID, clean_up_to(10_000))
    assert result.transitions == [] and result.monotone and set(result.verdicts.values()) == {"clean"}
    assert result.probes == len(SEED_GRID)
    assert result.describe() == "all clean over 200..1024 (11 measured lengths)"


def test_all_polluted():
    result = find_boundaries(SEED_GRID, polluted_up_to(10_000))
    assert set(result.verdicts.values()) == {"polluted"}
    assert result.describe() == "all polluted over 200..1024 (11 measured lengths)"


@pytest.mark.parametrize(
    ("edge", "expected"),
    [(200, Transition(200, 201, DOWN)), (1023, Transition(1023, 1024, DOWN))],
)
def test_boundary_at_the_grid_ends(edge, expected):
    result = find_boundaries(SEED_GRID, polluted_up_to(edge))
    assert result.transitions == [expected]


def test_boundary_between_adjacent_integers_in_a_unsorted_duplicated_grid():
    verdict_of = polluted_up_to(10)
    result = find_boundaries([11, 10, 10, 1], verdict_of)
    assert result.grid == [1, 10, 11]
    assert result.transitions == [Transition(10, 11, DOWN)]
    assert result.probes == 3 and sorted(verdict_of.calls) == [1, 10, 11]


def test_verdicts_are_sorted_and_cover_bisection_points():
    result = find_boundaries([100, 200], polluted_up_to(150))
    assert list(result.verdicts) == sorted(result.verdicts)
    assert result.verdicts[150] == "polluted" and result.verdicts[151] == "clean"
    assert result.probes <= 2 + math.ceil(math.log2(100))


def test_budget_hit_during_bisection_keeps_what_was_found():
    verdict_of = polluted_up_to(1000, 1500)
    grid = [1, 1250, 4000]
    result = find_boundaries(grid, verdict_of, max_probes=5)
    assert result.budget_hit and result.probes == 5 == len(verdict_of.calls)
    assert result.unresolved, "a pair must be left unresolved"
    for t in result.unresolved:
        assert t.hi - t.lo > 1 and not t.resolved
        assert f"{t.direction} at {t.lo}..{t.hi}" in result.describe()
    assert "probe budget search.max_probes=5 spent" in result.describe()
    assert "raise search.max_probes" in result.describe()


def test_flips_that_cancel_between_grid_points_are_invisible():
    # Documented limit: two flips between neighbouring grid points look like none.
    result = find_boundaries([1, 2000], polluted_up_to(1000, 1500))
    assert result.transitions == [] and result.probes == 2


def test_budget_hit_during_the_grid_lists_unprobed_lengths():
    result = find_boundaries(SEED_GRID, polluted_up_to(512), max_probes=4)
    assert result.budget_hit
    assert result.unprobed == SEED_GRID[4:]
    assert "unprobed grid lengths 480, 512, 513" in result.describe()
    assert wanted(SEED_GRID, result.verdicts, max_probes=4) == []  # the search asks for nothing more


def test_a_budget_that_suffices_is_not_reported_as_hit():
    result = find_boundaries(SEED_GRID, polluted_up_to(512), max_probes=len(SEED_GRID))
    assert not result.budget_hit and "budget" not in result.describe() and result.unprobed == []


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="grid is empty"):
        find_boundaries([], polluted_up_to(1))
    with pytest.raises(ValueError, match="positive integers"):
        find_boundaries([0, 5], polluted_up_to(1))
    with pytest.raises(ValueError, match="max_probes=0"):
        find_boundaries([5], polluted_up_to(1), max_probes=0)
    with pytest.raises(ValueError, match=r"verdict_of\(5\) returned 'maybe'"):
        find_boundaries([5], lambda length: "maybe")


def test_wanted_asks_for_the_grid_then_one_midpoint_per_open_transition():
    grid = [100, 200, 300, 400]
    assert wanted(grid, {}) == grid
    verdicts = {100: "polluted", 200: "clean", 300: "clean", 400: "polluted"}
    assert wanted(grid, verdicts) == [150, 350]
    assert wanted(grid, verdicts, max_probes=5) == [150]  # the budget goes to the lowest first
    assert wanted(grid, verdicts, bisect=False) == []
    done = {**verdicts, **{L: "polluted" for L in range(100, 200)}, 199: "polluted", 200: "clean"}
    assert 150 not in wanted(grid, done) and wanted(grid, done) == [350]


def test_without_bisection_a_transition_is_as_wide_as_the_grid_and_no_budget_was_hit():
    result = find_boundaries(SEED_GRID, polluted_up_to(700), bisect=False)
    assert result.transitions == [Transition(600, 768, DOWN)] and not result.budget_hit
    assert "bisection is off (search.bisect=false)" in result.describe()


def test_each_side_of_a_transition_is_named_by_what_it_is():
    down, up = Transition(512, 513, DOWN), Transition(255, 256, UP)
    assert down.relations() == {"last_polluted": 512, "first_clean": 513}
    assert up.relations() == {"last_clean": 255, "first_polluted": 256}
    assert (down.polluted_side, down.clean_side, up.polluted_side, up.clean_side) == (512, 513, 256, 255)
    assert Transition.from_dict(down.as_dict()) == down and down.as_dict()["resolved"] is True
    assert Transition(510, 513, DOWN).text == "510..513" and not Transition(510, 513, DOWN).resolved


def test_polluted_spans_say_where_the_islands_are():
    result = find_boundaries(SEED_GRID, polluted_up_to(0, 300, 650, 900))  # clean, then islands
    assert result.transitions == [Transition(300, 301, UP), Transition(650, 651, DOWN), Transition(900, 901, UP)]
    assert polluted_spans(result.verdicts) == [(301, 650), (901, 1024)]
    assert polluted_spans({1: "clean"}) == [] and polluted_spans({}) == []


# -- exact texts, integer midpoints, the edges of the budget (mutation testing: docs/MUTATION.md) ---------

def test_an_unresolved_transition_says_where_the_flip_may_be():
    t = Transition(512, 520, DOWN)
    assert t.describe() == "polluted->clean somewhere in 513..520 (unresolved: last polluted 512, first clean 520)"
    assert Transition(300, 310, UP).describe() == ("clean->polluted somewhere in 301..310 (unresolved: last clean "
                                                   "300, first polluted 310)")
    assert (t.text, t.resolved, t.sign, t.as_dict()) == ("512..520", False, 1, {"lo": 512, "hi": 520,
                                                                                 "direction": DOWN, "resolved": False})
    assert Transition(1, 2, UP).sign == -1 and Transition.from_dict({"lo": "7", "hi": "8", "direction": UP}) == \
        Transition(7, 8, UP)
    assert (DOWN, UP) == ("polluted->clean", "clean->polluted")


def test_midpoints_are_integers_rounded_down():
    verdicts = {100: "polluted", 201: "clean"}
    assert wanted([100, 201], verdicts) == [150]
    assert all(type(L) is int for L in wanted([100, 201], verdicts))
    result = find_boundaries([100, 201], polluted_up_to(160))
    assert all(type(L) is int for L in result.verdicts) and result.transitions == [Transition(160, 161, DOWN)]


def test_the_budget_counts_every_probe_and_stops_at_exactly_zero_left():
    grid = [100, 200, 300, 400]
    verdicts = {100: "polluted", 200: "clean", 300: "clean", 400: "polluted"}
    assert wanted(grid, verdicts, max_probes=6) == [150, 350]
    assert wanted(grid, verdicts, max_probes=4) == [] and wanted(grid, verdicts, max_probes=3) == []
    assert wanted(grid, {100: "clean"}, max_probes=3) == [200, 300]
    assert wanted(grid, {}, max_probes=1) == [100]
    result = find_boundaries(grid, polluted_up_to(150), max_probes=1)
    assert (result.probes, result.unprobed, result.budget_hit) == (1, [200, 300, 400], True)


def test_a_grid_of_lengths_that_are_not_positive_integers_is_refused_with_them():
    from oneknob.verdict.search import check_grid

    assert check_grid([3, 1, 3]) == [1, 3]
    for bad, shown in (([0, 5], "[0]"), ([True, 5], "[True]"), ([2.5, 5], "[2.5]"), ([-1, 5], "[-1]")):
        with pytest.raises(ValueError) as refused:
            check_grid(bad)
        assert str(refused.value) == f"grid has invalid prompt lengths {shown}: lengths must be positive integers"
    with pytest.raises(ValueError) as empty:
        check_grid([])
    assert str(empty.value) == "grid is empty: give at least one prompt length to probe"
    with pytest.raises(ValueError) as budget:
        find_boundaries([5], polluted_up_to(1), max_probes=0)
    assert str(budget.value) == "max_probes=0: must be >= 1, or None for no limit"
    with pytest.raises(ValueError) as verdict:
        find_boundaries([5], lambda length: "maybe")
    assert str(verdict.value) == "verdict_of(5) returned 'maybe'; expected 'polluted' or 'clean'"


def test_describe_every_state_of_a_search():
    from oneknob.verdict.search import result

    assert result([5, 10], {}).describe() == "nothing probed; probe budget search.max_probes=None spent before " \
                                              "the search finished (unprobed grid lengths 5, 10): raise " \
                                              "search.max_probes to resolve every transition"
    one = result([100, 200], {100: "polluted", 200: "clean"}, max_probes=2)
    assert one.describe() == ("polluted->clean somewhere in 101..200 (unresolved: last polluted 100, first clean "
                              "200); probe budget search.max_probes=2 spent before the search finished: raise "
                              "search.max_probes to resolve every transition")
    assert one.budget_hit and one.monotone and one.unresolved == [Transition(100, 200, DOWN)]
    off = result([100, 200], {100: "polluted", 200: "clean"}, bisect=False)
    assert not off.budget_hit
    assert off.describe() == ("polluted->clean somewhere in 101..200 (unresolved: last polluted 100, first clean "
                              "200); bisection is off (search.bisect=false), so transitions are as wide as the grid")
    two = result([1, 2, 3], {1: "polluted", 2: "clean", 3: "polluted"})
    assert not two.monotone and two.describe() == ("non-monotone: 2 transitions: polluted->clean at 1|2, "
                                                   "clean->polluted at 2|3")
    assert list(result([3, 1], {3: "clean", 1: "clean"}).verdicts) == [1, 3]
    assert result([3, 1], {3: "clean", 1: "clean"}).grid == [1, 3]


def test_polluted_spans_of_single_lengths_and_a_polluted_end():
    assert polluted_spans({1: "polluted", 2: "clean", 3: "polluted"}) == [(1, 1), (3, 3)]
    assert polluted_spans({5: "clean", 6: "polluted", 7: "polluted"}) == [(6, 7)]
    assert polluted_spans({2: "polluted", 1: "clean"}) == [(2, 2)]


def test_a_budget_spent_early_speaks_only_of_measured_lengths():
    """Issue 22: max_probes=1 over [128, 513] said "all polluted over 128..513 (2 lengths)", 513 never measured."""
    result = find_boundaries([128, 513], lambda L: "polluted", max_probes=1)
    text = result.describe()
    assert text.startswith("all polluted over 128..128 (1 measured length); probe budget search.max_probes=1")
    assert "(unprobed grid lengths 513)" in text and "128..513" not in text


def test_suspects_are_the_candidate_thresholds_inside_the_grid_and_one_either_side():
    from oneknob.verdict.search import suspects, suspects_text

    found = suspects([128, 256, 1024], {"max_capture_size": 512, "model.sliding_window": 300, "spec.k": 3,
                                        "seqs_x_query_len": 1024, "grid_stride_edge": 256})
    assert found == {255: ["grid_stride_edge - 1"], 257: ["grid_stride_edge + 1"],
                     299: ["model.sliding_window - 1"], 300: ["model.sliding_window"],
                     301: ["model.sliding_window + 1"], 511: ["max_capture_size - 1"], 512: ["max_capture_size"],
                     513: ["max_capture_size + 1"]}
    assert suspects_text(found).startswith("255 (grid_stride_edge - 1), 257 (grid_stride_edge + 1), 299 (")
    assert suspects([300, 400], {"edge": 300}) == {301: ["edge + 1"]}  # q - 1 below the grid is not probed


def test_suspects_skip_thresholds_that_are_no_integer_and_name_every_reason_for_a_length():
    from oneknob.verdict.search import suspects, suspects_text

    assert suspects([1, 10], {"half": 3.5, "flag": True, "text": "4"}) == {}
    found = suspects([100, 1000], {"a": 300, "b": 301})
    assert found == {299: ["a - 1"], 300: ["a", "b - 1"], 301: ["a + 1", "b"], 302: ["b + 1"]}
    assert suspects_text(found) == "299 (a - 1), 300 (a, b - 1), 301 (a + 1, b), 302 (b + 1)"


def test_first_only_bisects_only_where_the_outcome_first_differs_from_the_first_end():
    """A sweep's bisection (oneknob.study.bisect): positions 0..16, from position 0, any labels. Only the first
    change is narrowed, in ceil(log2 16) = 4 probes after the two ends; the later change stays as wide as found."""
    labels = ["a"] * 3 + ["b"] * 7 + ["c"] * 7  # a up to position 2, b from 3, c from 10
    calls: list[int] = []

    def outcome_at(position: int) -> str:
        calls.append(position)
        return labels[position]

    result = find_boundaries([0, 16], outcome_at, outcomes=None, lowest=0, first_only=True)
    assert result.grid == [0, 16] and calls == [0, 16, 8, 4, 2, 3]
    assert result.transitions == [Transition(2, 3, "a->b"), Transition(8, 16, "b->c")]
    assert result.probes == 2 + math.ceil(math.log2(16))
    every = find_boundaries([0, 16], lambda position: labels[position], outcomes=None, lowest=0)
    assert every.transitions == [Transition(2, 3, "a->b"), Transition(9, 10, "b->c")]  # without it: both


def test_an_axis_from_position_0_refuses_negative_positions_as_positions():
    """lowest=0 (knob positions, batch sizes): 0 is allowed, -1 is refused naming positions, not prompt lengths."""
    from oneknob.verdict.search import check_grid, result

    assert check_grid([3, 0], lowest=0) == [0, 3]
    with pytest.raises(ValueError) as refused:
        check_grid([-1, 3], lowest=0)
    assert str(refused.value) == "grid has invalid positions [-1]: positions must be integers >= 0"
    assert result([0, 3], {0: "clean", 3: "polluted"}, lowest=0).transitions == [Transition(0, 3, UP)]
