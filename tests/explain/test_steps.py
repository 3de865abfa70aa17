"""Prefill steps by the resolved token budget (oneknob.explain.steps): the chunks, the step rule's agreement
with the verdicts, and when the report says nothing."""

from __future__ import annotations

from oneknob.explain import steps

GRAPHS = {"cudagraph_mode": "FULL_AND_PIECEWISE", "enforce_eager": False}


def run(name: str, budget: int, capture: int, polluted: dict[int, bool], **resolved) -> dict:
    return {"name": name, "status": "ok", "axis": "length",
            "resolved": GRAPHS | {"max_num_batched_tokens": budget, "max_capture_size": capture} | resolved,
            "points": [{"length": L, "polluted": p} for L, p in polluted.items()]}


def test_prefill_steps_are_full_chunks_then_the_rest():
    assert steps.prefill_steps(513, 256) == [256, 256, 1]
    assert steps.prefill_steps(512, 256) == [256, 256]
    assert steps.prefill_steps(200, 2048) == [200]


def test_a_budget_below_the_lengths_chunks_them_and_the_rule_is_checked_per_run():
    baseline = run("baseline", 2048, 512, {256: True, 512: True, 513: False, 1024: False})
    small = run("engine_args.max_num_batched_tokens=256", 256, 256, {256: True, 513: True, 1024: True})
    said = steps.lines([baseline, small])
    assert said[0].startswith("baseline: token budget 2048") and "in one step" in said[0]
    assert "agrees at all 4 measured lengths" in said[0]
    assert "prefilled 513, 1024 in chunks of at most 256 tokens (e.g. 513 = 256 + 256 + 1)" in said[1]
    assert "agrees at all 3 measured lengths" in said[1]
    assert "not from recorded steps" in said[-1]


def test_the_rule_failing_is_said_with_the_lengths():
    # the last chunk of 600 is 88 tokens, within the capture: the rule says polluted, the run measured clean
    chunked = run("b", 256, 128, {200: False, 600: False})
    said = steps.lines([chunked])
    assert "fails at 600 of 2 measured lengths" in said[0]
    eager = run("eager", 256, 512, {600: True}, enforce_eager=True)
    assert "no step replays a graph" in steps.lines([eager])[0] and "fails at 600 of 1" in steps.lines([eager])[0]


def test_nothing_is_said_without_chunking_off_the_length_axis_or_unmeasured():
    assert steps.lines([run("baseline", 2048, 512, {256: True, 1024: False})]) == []
    assert steps.lines([run("x", 256, 256, {512: True}) | {"axis": "batch"}]) == []
    assert steps.lines([run("x", 256, 256, {512: True}) | {"status": "failed"}]) == []
    assert steps.lines([run("x", 256, 256, {512: True}) | {"resolved": {}}]) == []
