"""The decode oracles: what the engine generated, judged against the reference's scoring of that same
continuation, teacher-forced.

Each request asks the engine for a greedy continuation of `verdict.greedy_tokens` (N) tokens and each
generated token's own logprob (vLLM `SamplingParams(logprobs=0)`: the sampled token's, from its decode step).
The reference then scores the prompt followed by the engine's N tokens in one prefill request, with the top-1
at every position: each generated token's reference logprob, and the reference's own choice after the same
prefix. So both oracles stay meaningful after the first divergent token (the reference scores what the engine
produced, not a continuation of its own), and one reference request serves both.

  greedy  the share of generated tokens that are the reference's argmax after the same prefix (`greedy_match`,
          1.0 = every token), and the first that is not (`greedy_first_divergence`, 0-based within the
          continuation, -1 when none). Polluted when the share < verdict.greedy_min_match. Up to the first
          divergence this is exactly "the engine's greedy continuation equals the reference's".
  decode  per generated position, delta = engine logprob - reference logprob of the same token (nats): the
          mean |delta| over the continuation (`decode_delta`), the largest (`decode_max_delta`), the first
          position beyond verdict.tol_decode_token (`decode_first_deviation`, 0-based, -1 when none), and the
          continuation's mean NLL under each (`decode_nll`, `decode_nll_ref`). Polluted when the mean |delta| >
          verdict.tol_decode or any |delta| > verdict.tol_decode_token: it sees a decode bug that drifts
          without flipping a token.

Positions: a continuation after a prompt of L tokens covers token positions L .. L + N - 1 (0-based), so the
first divergent position of a point is L + its offset (`position`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from oneknob.config.schema import DECODE_ORACLES

DECODE = tuple(DECODE_ORACLES)

FIELDS = ("greedy_match", "greedy_first_divergence", "greedy_polluted", "decode_nll", "decode_nll_ref",
          "decode_delta", "decode_max_delta", "decode_first_deviation", "decode_polluted")


def compare(tokens: list[int], logprobs: list[float], reference_logprobs: list[float],
            reference_argmax: list[int], verdict, malformed: bool = False) -> dict:
    """Both oracles' values and verdicts for one continuation. The decode values are over the generated tokens
    whose logprob is a finite number (all of them unless the answer was malformed, which the judge flags)."""
    n = len(tokens)
    if not n or len(logprobs) != n or len(reference_logprobs) != n or len(reference_argmax) != n:
        raise ValueError(f"a continuation of {n} tokens came with {len(logprobs)} engine logprobs and "
                         f"{len(reference_logprobs)} reference logprobs / {len(reference_argmax)} reference choices")
    matches = [int(t) == int(a) for t, a in zip(tokens, reference_argmax)]
    share = sum(matches) / n
    greedy = {"greedy_match": share, "greedy_first_divergence": next((i for i, ok in enumerate(matches) if not ok), -1),
              "greedy_polluted": share < verdict.greedy_min_match}
    readable = [i for i, x in enumerate(logprobs) if math.isfinite(x)]
    if len(readable) < n and not malformed:  # the worker marks every malformed answer: a bug else
        raise ValueError("engine returned a non-finite logprob for a generated token")
    if not readable:
        return greedy | {f: None for f in FIELDS if f.startswith("decode_")} | {"decode_polluted": True}
    deltas = {i: abs(logprobs[i] - reference_logprobs[i]) for i in readable}
    first_deviation = next((i for i, d in deltas.items() if d > verdict.tol_decode_token), -1)
    mean_delta = math.fsum(deltas.values()) / len(deltas)
    return greedy | {
        "decode_nll": -math.fsum(logprobs[i] for i in readable) / len(readable),
        "decode_nll_ref": -math.fsum(reference_logprobs) / n,
        "decode_delta": mean_delta, "decode_max_delta": max(deltas.values()), "decode_first_deviation": first_deviation,
        "decode_polluted": mean_delta > verdict.tol_decode or max(deltas.values()) > verdict.tol_decode_token}


def judge(point, tokens: list[int], logprobs: list[float], score: dict | None, oracles: tuple[str, ...], verdict):
    """The point with its continuation judged; `polluted` now also counts the decode oracles asked for. A decode
    oracle whose part of the answer was malformed (point.malformed) judges it polluted; `score` is None where the
    continuation's tokens themselves were (nothing to score teacher-forced)."""
    malformed = point.malformed or {}
    if score is None:
        values = {f: None for f in FIELDS} | {"greedy_polluted": True, "decode_polluted": True}
    else:
        values = compare(tokens, logprobs, score["logprobs"], score["argmax"], verdict, "decode" in malformed)
    for name in DECODE:
        if name in malformed:
            values[f"{name}_polluted"] = True
    judged = replace(point, **values)
    return replace(judged, polluted=any(flagged(judged, name) for name in oracles))


def flagged(point, oracle: str) -> bool:
    """One oracle's verdict on one point (False where that oracle did not judge it)."""
    return bool(getattr(point, f"{oracle}_polluted", None))


def position(length: int, offset: int | None) -> int | None:
    """The absolute token position of a continuation's offset (None/-1: no divergence)."""
    return None if offset is None or offset < 0 else length + offset
