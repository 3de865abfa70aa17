"""Judging the two axes that are not prompt length: was the step what it should be, and do repeats agree.

Pure functions over what the engine returned (oneknob.plan.axis says what the axes are):

* `co_scheduling(steps, prompts, expected)`: a batch point (axis=batch) is only what it claims when the probe's
  prefill ran in ONE step together with every neighbour, whole. Otherwise it is labelled (probe split over
  several steps, a neighbour missing from the probe's step, a step of other than the expected token count: the
  scheduler's budget, max_num_seqs, a prefix-cache hit) and the label travels with the point into the report:
  never judged silently as if it were co-scheduled.
* `agreement(anchor, other, tol_token)`: a repeat (axis=repeat) against the first: identical (bit for bit),
  within tolerance (every token's |delta logprob| <= verdict.tol_token) or differs, with the max deviation.
"""

from __future__ import annotations

from typing import Any

CO_SCHEDULED = "co-scheduled"
IDENTICAL, WITHIN, DIFFERS = "identical", "within tolerance", "differs"


def co_scheduling(steps: list[dict[str, Any]], prompts: int, expected: int, probe: int = 0) -> dict[str, Any]:
    """{"schedule": CO_SCHEDULED or what went otherwise, "probe_steps": the token counts of the steps that
    scheduled the probe, "step_tokens": the first of them} for one engine call of `prompts` prompts whose
    probe should have shared one step of `expected` tokens with all the others."""
    mine = [step for step in steps if any(index == probe for index, _ in step["scheduled"])]
    totals = [int(step["total"]) for step in mine]
    if not mine:
        return {"schedule": "the probe was in no recorded step", "probe_steps": [], "step_tokens": None}
    together = {index for index, _ in mine[0]["scheduled"]}
    if len(mine) > 1:
        label = f"probe prefill split over {len(mine)} steps ({'+'.join(map(str, totals))} tokens)"
    elif missing := prompts - len(together):
        label = f"{missing} of {prompts - 1} neighbour(s) not in the probe's step"
    elif totals[0] != expected:
        label = f"the probe's step held {totals[0]} tokens, not the {expected} of probe + neighbours"
    else:
        label = CO_SCHEDULED
    return {"schedule": label, "probe_steps": totals, "step_tokens": totals[0]}


def agreement(anchor: list[float], other: list[float], tol_token: float) -> tuple[str, float]:
    """(IDENTICAL | WITHIN | DIFFERS, max |delta logprob|) of one repeat against the first."""
    if list(other) == list(anchor):
        return IDENTICAL, 0.0
    deviation = max((abs(a - b) for a, b in zip(anchor, other)), default=float("inf"))
    if len(anchor) != len(other):
        deviation = float("inf")
    return (WITHIN if deviation <= tol_token else DIFFERS), deviation


def repeats_agreement(outputs: list[list[float]], tol_token: float) -> tuple[str, float, int]:
    """(the worst label, the max deviation, the index of the worst output) of every output against the first."""
    worst, deviation, at = IDENTICAL, 0.0, 0
    rank = {IDENTICAL: 0, WITHIN: 1, DIFFERS: 2}
    for index, other in enumerate(outputs[1:], start=1):
        label, dev = agreement(outputs[0], other, tol_token)
        if (rank[label], dev) > (rank[worst], deviation):
            worst, deviation, at = label, dev, index
    return worst, deviation, at
