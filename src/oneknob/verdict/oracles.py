"""Signals beyond mean NLL, each compared with the reference: the top-k of every position, and the decode
oracles (greedy, decode: oneknob.verdict.decode).

`nll` (verdict.judge) compares the prompt token's own logprob; a bug can leave the mean in tolerance and
still reorder the distribution, or corrupt prompt logprobs while generation stays clean (the seed's bug), or
corrupt generation while prompt logprobs stay bit-identical (a decode-only bug). Every oracle is a verdict of
its own: the search narrows each one's transitions on shared probes, and a run is "all clean" only when each
is clean everywhere. The oracles, chosen by `oracles: [nll, topk, greedy, decode]`:

  topk    the engine's top-k prompt logprobs per position against the reference's: the share of the
          top-k ids both hold (`topk_overlap`, 1.0 = the same sets) and the KL divergence over that shared
          support, each renormalised there (`topk_kl`, reference first); per length the mean over
          positions (and samples), the worst position, and the share of positions beyond the threshold.
          Polluted when the mean overlap < verdict.topk_min_overlap or the mean KL > verdict.topk_max_kl.
  greedy  the engine's greedy continuation of `verdict.greedy_tokens` tokens: the share that are the
          reference's choice after the same prefix (oneknob.verdict.decode).
  decode  the same continuation's logprobs as the engine generated them against the reference's, in nats.

Pure functions: top-k lists are [(token id, logprob), ...] per scored position, best first.
"""

from __future__ import annotations

import math

from oneknob.config.schema import ORACLES

NO_SHARED_SUPPORT_KL = 99.0  # the two top-k sets share no token: as far apart as two distributions get here


def _kl_shared(ours: dict[int, float], theirs: dict[int, float]) -> float:
    shared = ours.keys() & theirs.keys()
    if not shared:
        return NO_SHARED_SUPPORT_KL
    ref_norm = math.log(math.fsum(math.exp(theirs[t]) for t in shared))
    our_norm = math.log(math.fsum(math.exp(ours[t]) for t in shared))
    return math.fsum(math.exp(theirs[t] - ref_norm) * ((theirs[t] - ref_norm) - (ours[t] - our_norm))
                     for t in shared)


def topk_compare(topk: list[list], reference: list[list], k: int, max_kl: float) -> dict[str, float]:
    """Per-position overlap and KL of two top-k tables (one row per scored position), summarised."""
    overlaps, kls = [], []
    for ours, theirs in zip(topk, reference):
        ours_d = {int(t): float(lp) for t, lp in ours[:k]}
        theirs_d = {int(t): float(lp) for t, lp in theirs[:k]}
        overlaps.append(len(ours_d.keys() & theirs_d.keys()) / max(len(theirs_d), 1))
        kls.append(max(0.0, _kl_shared(ours_d, theirs_d)))
    if not overlaps:
        return {"topk_overlap": 1.0, "topk_overlap_min": 1.0, "topk_kl": 0.0, "topk_kl_max": 0.0,
                "topk_share_beyond": 0.0}
    return {"topk_overlap": math.fsum(overlaps) / len(overlaps), "topk_overlap_min": min(overlaps),
            "topk_kl": math.fsum(kls) / len(kls), "topk_kl_max": max(kls),
            "topk_share_beyond": sum(kl > max_kl for kl in kls) / len(kls)}


def flags(values: dict, verdict) -> dict[str, bool]:
    """Whether oracle topk flags these values (only when present)."""
    found = {}
    if "topk_overlap" in values:
        found["topk"] = values["topk_overlap"] < verdict.topk_min_overlap or values["topk_kl"] > verdict.topk_max_kl
    return found


def covers(record: dict, topk: int, greedy: int) -> bool:
    """Whether a cached point holds what the oracles asked for (else it is measured again)."""
    rows = record.get("topk") or []
    enough_topk = not topk or (bool(rows) and len(rows[0]) >= topk)
    return enough_topk and (not greedy or (len(record.get("greedy") or []) >= greedy
                                           and len(record.get("greedy_logprobs") or []) >= greedy))


def length_metrics(points: list, length: int) -> list[tuple]:
    """The oracles' metrics of one length, step = length (means over samples; flags as 0/1)."""
    metrics = []
    for name in ORACLES:
        if getattr(points[0], f"{name}_polluted") is not None:
            metrics.append((f"polluted_{name}", float(any(getattr(p, f"{name}_polluted") for p in points)), length))
    for field in ("topk_overlap", "topk_kl", "greedy_match", "decode_delta", "decode_nll", "decode_nll_ref"):
        if getattr(points[0], field) is not None:
            metrics.append((field, math.fsum(getattr(p, field) for p in points) / len(points), length))
    if points[0].decode_max_delta is not None:
        metrics.append(("decode_max_delta", max(p.decode_max_delta for p in points), length))
    for field in ("greedy_first_divergence", "decode_first_deviation"):  # offsets in the continuation, -1: none
        if getattr(points[0], field) is not None:
            offsets = [getattr(p, field) for p in points if getattr(p, field) >= 0]
            metrics.append((field, min(offsets) if offsets else -1, length))
    return metrics
