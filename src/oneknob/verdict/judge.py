"""NLL, the comparison with the reference, and the verdict per length.

Mean NLL of a prompt of L tokens is over its L - 1 scored positions. A causal
model scores token t from tokens < t only, so the reference logprobs of one
long prompt give NLL_ref(L) for every shorter prefix of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from oneknob.verdict import oracles as oracles_mod
from oneknob.verdict.search import CLEAN, POLLUTED



def mean_nll(logprobs: list[float]) -> float:
    return -math.fsum(logprobs) / len(logprobs)


# The fields of an engine's answer each oracle reads (oneknob.engines.answers): an oracle whose field is malformed
# judges its point polluted, with the reason; the others judge it as usual.
MALFORMED_FIELDS = {"nll": ("logprobs",), "topk": ("topk",), "greedy": ("greedy",),
                    "decode": ("greedy", "greedy_logprobs")}


def malformed_oracles(fields: dict[str, str] | None, oracles: tuple[str, ...]) -> dict[str, str]:
    """{oracle: reason} of the asked-for oracles that read a malformed field of this answer."""
    found = {}
    for name in oracles:
        read = [field for field in MALFORMED_FIELDS.get(name, ()) if (fields or {}).get(field)]
        if read:  # the field named only where the oracle reads two (decode: the tokens and their logprobs)
            found[name] = "malformed: " + "; ".join(fields[f] if len(MALFORMED_FIELDS[name]) == 1 else
                                                    f"{f}: {fields[f]}" for f in read)
    return found


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
    polluted: bool = False  # by the oracles the study asked for (any of them)
    cached: bool = False
    nll_polluted: bool | None = None  # oracle nll: the rule above (tolerances, or verdict.max_nll)
    topk_overlap: float | None = None  # oracle topk (oracles.topk_compare): mean share of shared top-k ids
    topk_kl: float | None = None  # ... mean KL over the shared support
    topk_polluted: bool | None = None
    # the decode oracles (verdict.decode): the engine's continuation against the reference's teacher-forced score
    greedy_match: float | None = None  # oracle greedy: share of generated tokens that are the reference's argmax
    greedy_first_divergence: int | None = None  # ... first divergent offset in the continuation, -1 when none
    greedy_polluted: bool | None = None
    decode_nll: float | None = None  # oracle decode: the continuation's mean NLL as the engine generated it
    decode_nll_ref: float | None = None  # ... and under the reference, teacher-forced
    decode_delta: float | None = None  # ... mean |engine - reference logprob| over the generated tokens
    decode_max_delta: float | None = None  # ... the largest
    decode_first_deviation: int | None = None  # ... first offset beyond verdict.tol_decode_token, -1 when none
    decode_polluted: bool | None = None
    # axis=batch (verdict.agreement.co_scheduling): the probe's step, and whether it held what the point claims
    step_tokens: int | None = None  # tokens the probe's (first) prefill step scheduled: probe + neighbours
    probe_steps: list[int] | None = None  # the token count of every step that scheduled part of the probe
    schedule: str | None = None  # "co-scheduled", or what went otherwise (the point is labelled, not hidden)
    # axis=repeat (verdict.agreement.agreement): the worst repeat against the first
    agreement: str | None = None  # identical | within tolerance | differs
    # {oracle: "malformed: <reason>"}: every oracle that reads a malformed part of the engine's answer (its shape,
    # or NaN / inf values: oneknob.engines.answers), with why; those asked for judge the point polluted. None when
    # the answer was well formed
    malformed: dict[str, str] | None = None


def judge(length: int, sample: int, logprobs: list[float], seconds: float, reference: list[float] | None,
          verdict, cached: bool = False, *, oracles: tuple[str, ...] = ("nll",), topk: list | None = None,
          reference_topk: list | oracles_mod.TopKTable | None = None, malformed: dict[str, str] | None = None) -> Point:
    """Compare one prompt's logprobs (and its top-k, when given) with the reference prefix (or judge
    absolutely); polluted when any asked-for oracle says so. `malformed`: the answer's malformed fields and why
    (oneknob.engines.answers): the oracles reading them judge it polluted, on the values that could be read."""
    bad = malformed_oracles(malformed, tuple(dict.fromkeys((*oracles, "nll", "topk", "greedy", "decode"))))
    point = _judge_nll(length, sample, logprobs, seconds, reference, verdict, cached, "nll" in bad)
    extra: dict = {"nll_polluted": point.polluted or "nll" in bad}
    if topk is not None and reference_topk is not None:
        values = oracles_mod.topk_compare(topk, reference_topk[: length - 1], verdict.topk, verdict.topk_max_kl)
        extra |= {"topk_overlap": values["topk_overlap"], "topk_kl": values["topk_kl"],
                  "topk_polluted": oracles_mod.flags(values, verdict)["topk"] or "topk" in bad}
    asked = {"nll": extra["nll_polluted"], "topk": extra.get("topk_polluted")}
    return replace(point, polluted=any(asked[o] for o in oracles if asked.get(o) is not None),
                   malformed=bad or None, **extra)


def _judge_nll(length: int, sample: int, logprobs: list[float], seconds: float, reference: list[float] | None,
               verdict, cached: bool, malformed: bool = False) -> Point:
    """Mean NLL and its comparison over the positions whose logprob is a finite number: all of them, unless the
    answer was malformed (the judge flags it then, and these are the values that could be read; with none
    readable the NLL is NaN and there is no deviation to give)."""
    if len(logprobs) != length - 1:
        raise ValueError(f"engine returned {len(logprobs)} logprobs for a prompt of {length} tokens "
                         f"(expected {length - 1})")
    ref = None if reference is None else reference[: length - 1]
    readable = [i for i, x in enumerate(logprobs) if math.isfinite(x)]
    if len(readable) < len(logprobs) and not malformed:  # the worker marks every malformed answer: a bug else
        raise ValueError(f"engine returned a non-finite logprob for length {length}, sample {sample}")
    if len(readable) < len(logprobs):
        if not readable:
            return Point(length, sample, math.nan, 0, seconds, polluted=True, cached=cached,
                         nll_ref=None if ref is None else mean_nll(ref))
        logprobs = [logprobs[i] for i in readable]
        ref = None if ref is None else [ref[i] for i in readable]
    nll = mean_nll(logprobs)
    if ref is None:
        return Point(length, sample, nll, len(logprobs), seconds, polluted=nll > verdict.max_nll, cached=cached)
    nll_ref = mean_nll(ref)
    deltas = [abs(a - b) for a, b in zip(logprobs, ref)]
    deviating = [readable[i] for i, d in enumerate(deltas) if d > verdict.tol_token]
    delta_nll = nll - nll_ref
    polluted = all(fails(delta_nll, nll_ref, verdict).values())
    return Point(
        length, sample, nll, len(logprobs), seconds,
        nll_ref=nll_ref, delta_nll=delta_nll, max_abs_delta=max(deltas),
        share_deviating=len(deviating) / len(deltas),
        first_deviation=deviating[0] + 1 if deviating else None,
        polluted=polluted, cached=cached,
    )


def fails(delta_nll: float, nll_ref: float, verdict) -> dict[str, bool]:
    """Which of the two tolerances a deviation exceeds; polluted needs both."""
    return {"tol_nll": abs(delta_nll) > verdict.tol_nll, "rtol_nll": abs(delta_nll) > verdict.rtol_nll * abs(nll_ref)}


def tolerance_edge(clean_points: list[Point], verdict) -> dict | None:
    """Whether a clean length is clean only by one tolerance: a sample there exceeds the other one, so the
    edge next to it comes from that tolerance alone (under the other alone this length would be polluted)."""
    for only in ("rtol_nll", "tol_nll"):
        other = "tol_nll" if only == "rtol_nll" else "rtol_nll"
        for p in clean_points:
            if p.delta_nll is not None and fails(p.delta_nll, p.nll_ref, verdict)[other]:
                limit = verdict.rtol_nll * abs(p.nll_ref) if only == "rtol_nll" else verdict.tol_nll
                return {"only": only, "length": p.length, "sample": p.sample, "delta_nll": round(p.delta_nll, 6),
                        "limit": round(limit, 6), "tol_nll": verdict.tol_nll, "rtol_nll": verdict.rtol_nll}
    return None


def tolerance_text(edge: dict) -> str:
    """One line from a tolerance_edge record."""
    length, delta, limit = edge["length"], abs(edge["delta_nll"]), edge["limit"]
    if edge["only"] == "rtol_nll":
        return (f"an edge of the relative tolerance alone: at {length}, |delta NLL| {delta:.4f} > verdict.tol_nll="
                f"{edge['tol_nll']:g} but <= verdict.rtol_nll={edge['rtol_nll']:g} x NLL_ref ({limit:.4f}); "
                f"under the absolute tolerance alone {length} would be polluted too")
    return (f"an edge of the absolute tolerance alone: at {length}, |delta NLL| {delta:.4f} > verdict.rtol_nll="
            f"{edge['rtol_nll']:g} x NLL_ref but <= verdict.tol_nll={edge['tol_nll']:g}; under the relative "
            f"tolerance alone {length} would be polluted too")


def samples_text(polluted: int, samples: int) -> str:
    return f"polluted in {polluted} of {samples} samples"


def verdict_of(points: list[Point]) -> str:
    """Polluted when any sample at this length is: disagreement is reported, not averaged away."""
    return POLLUTED if any(p.polluted for p in points) else CLEAN


def oracle_verdicts(points: list[Point], oracles: tuple[str, ...]) -> dict[str, str]:
    """Each oracle's verdict at one length: polluted when it flags any sample. Points no oracle judged one by
    one (axis=repeat: agreement between repeats) give every oracle the point's own verdict."""
    found = {}
    for name in oracles:
        flags = [getattr(p, f"{name}_polluted", None) for p in points]
        found[name] = verdict_of(points) if all(f is None for f in flags) else POLLUTED if any(flags) else CLEAN
    return found


def disagreeing(points: list[Point]) -> bool:
    return len({p.polluted for p in points}) > 1


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)
