"""NLL, the comparison with the reference, and the verdict per length.

Mean NLL of a prompt of L tokens is over its L - 1 scored positions. A causal
model scores token t from tokens < t only, so the reference logprobs of one
long prompt give NLL_ref(L) for every shorter prefix of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

POLLUTED, CLEAN = "polluted", "clean"


def mean_nll(logprobs: list[float]) -> float:
    return -math.fsum(logprobs) / len(logprobs)


@dataclass(frozen=True)
class Point:
    """One prompt (length, sample) as measured, compared and judged."""

    length: int
    sample: int
    nll: float
    scored: int
    seconds: float
    nll_ref: float | None = None
    delta_nll: float | None = None
    max_abs_delta: float | None = None  # largest |logprob - logprob_ref| over positions
    share_deviating: float | None = None  # share of positions beyond verdict.tol_token
    first_deviation: int | None = None  # first token position (1-based) beyond verdict.tol_token
    polluted: bool = False
    cached: bool = False


def judge(length: int, sample: int, logprobs: list[float], seconds: float, reference: list[float] | None,
          verdict, cached: bool = False) -> Point:
    """Compare one prompt's logprobs with the reference prefix (or judge absolutely)."""
    if len(logprobs) != length - 1:
        raise ValueError(f"engine returned {len(logprobs)} logprobs for a prompt of {length} tokens "
                         f"(expected {length - 1})")
    if any(not math.isfinite(x) for x in logprobs):
        raise ValueError(f"engine returned a non-finite logprob for length {length}, sample {sample}")
    nll = mean_nll(logprobs)
    if reference is None:
        return Point(length, sample, nll, len(logprobs), seconds, polluted=nll > verdict.max_nll, cached=cached)
    ref = reference[: length - 1]
    nll_ref = mean_nll(ref)
    deltas = [abs(a - b) for a, b in zip(logprobs, ref)]
    deviating = [i for i, d in enumerate(deltas) if d > verdict.tol_token]
    delta_nll = nll - nll_ref
    polluted = abs(delta_nll) > verdict.tol_nll and abs(delta_nll) > verdict.rtol_nll * abs(nll_ref)
    return Point(
        length, sample, nll, len(logprobs), seconds,
        nll_ref=nll_ref, delta_nll=delta_nll, max_abs_delta=max(deltas),
        share_deviating=len(deviating) / len(deltas),
        first_deviation=deviating[0] + 1 if deviating else None,
        polluted=polluted, cached=cached,
    )


def verdict_of(points: list[Point]) -> str:
    """Polluted when any sample at this length is: disagreement is reported, not averaged away."""
    return POLLUTED if any(p.polluted for p in points) else CLEAN


def disagreeing(points: list[Point]) -> bool:
    return len({p.polluted for p in points}) > 1


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)
