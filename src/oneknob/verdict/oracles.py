"""Signals beyond mean NLL, each compared with the reference: the top-k of every position, greedy generation.

`nll` (verdict.judge) compares the prompt token's own logprob; a bug can leave the mean in tolerance and
still reorder the distribution, or corrupt prompt logprobs while generation stays clean (the seed's bug:
generation was unaffected). The oracles, chosen by `oracles: [nll, topk, greedy]`:

  topk    the engine's top-k prompt logprobs per position against the reference's: the share of the
          top-k ids both hold (`topk_overlap`, 1.0 = the same sets) and the KL divergence over that shared
          support, each renormalised there (`topk_kl`, reference first); per length the mean over
          positions (and samples), the worst position, and the share of positions beyond the threshold.
          Polluted when the mean overlap < verdict.topk_min_overlap or the mean KL > verdict.topk_max_kl.
  greedy  a greedy continuation of `verdict.greedy_tokens` tokens after the prompt against the
          reference's: the share of matching tokens (`greedy_match`, 1.0 = identical) and the first
          divergent position (`greedy_first_divergence`, 0-based, -1 when none). Polluted when the share
          < verdict.greedy_min_match.

Pure functions: top-k lists are [(token id, logprob), ...] per scored position, best first.
"""

from __future__ import annotations

import math

from oneknob.config.schema import ORACLES  # noqa: F401 (the names, defined with the config)

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


def greedy_compare(continuation: list[int], reference: list[int]) -> dict[str, float | int]:
    """Share of matching tokens and the first divergent position (-1 when the continuations agree)."""
    pairs = list(zip(continuation, reference))
    first = next((i for i, (a, b) in enumerate(pairs) if a != b), -1)
    if len(continuation) != len(reference) and first == -1:
        first = len(pairs)
    matching = sum(a == b for a, b in pairs)
    return {"greedy_match": matching / max(len(reference), 1), "greedy_first_divergence": first}


def flags(values: dict, verdict) -> dict[str, bool]:
    """Which oracles beyond nll flag these values (only those present)."""
    found = {}
    if "topk_overlap" in values:
        found["topk"] = values["topk_overlap"] < verdict.topk_min_overlap or values["topk_kl"] > verdict.topk_max_kl
    if "greedy_match" in values:
        found["greedy"] = values["greedy_match"] < verdict.greedy_min_match
    return found


def covers(record: dict, topk: int, greedy: int) -> bool:
    """Whether a cached point holds what the oracles asked for (else it is measured again)."""
    rows = record.get("topk") or []
    enough_topk = not topk or (bool(rows) and len(rows[0]) >= topk)
    return enough_topk and (not greedy or len(record.get("greedy") or []) >= greedy)


def length_metrics(points: list, length: int) -> list[tuple]:
    """The oracles' metrics of one length, step = length (means over samples; flags as 0/1)."""
    metrics = []
    for name, flag in (("nll", "nll_polluted"), ("topk", "topk_polluted"), ("greedy", "greedy_polluted")):
        if getattr(points[0], flag) is not None:
            metrics.append((f"polluted_{name}", float(any(getattr(p, flag) for p in points)), length))
    for field in ("topk_overlap", "topk_kl", "greedy_match"):
        if getattr(points[0], field) is not None:
            metrics.append((field, math.fsum(getattr(p, field) for p in points) / len(points), length))
    if points[0].greedy_first_divergence is not None:
        divergent = [p.greedy_first_divergence for p in points if p.greedy_first_divergence >= 0]
        metrics.append(("greedy_first_divergence", min(divergent) if divergent else -1, length))
    return metrics


def judge_greedy(points: dict[int, list], continuations: dict[tuple, list[int]], references: dict[tuple, list[int]],
                 verdict) -> dict[int, list]:
    """The points with their greedy continuation judged against the reference's."""
    from dataclasses import replace

    judged = {}
    for length, row in points.items():
        judged[length] = []
        for p in row:
            values = greedy_compare(continuations[(length, p.sample)], references[(length, p.sample)])
            flagged = values["greedy_match"] < verdict.greedy_min_match
            judged[length].append(replace(p, **values, greedy_polluted=flagged))
    return judged


def summary(points: dict[int, list], asked: tuple[str, ...]) -> dict[str, dict]:
    """Per oracle: the lengths it flagged and its transitions over the probed lengths (side by side, so
    'prompt logprobs polluted, generation clean' reads at a glance)."""
    from oneknob.verdict.search import transitions

    found = {}
    for name in asked:
        flag = f"{name}_polluted"
        flags = {L: any(bool(getattr(p, flag)) for p in row) for L, row in sorted(points.items())}
        verdicts = {L: "polluted" if flagged else "clean" for L, flagged in flags.items()}
        found[name] = {"flagged": [L for L, flagged in flags.items() if flagged],
                       "transitions": [t.as_dict() for t in transitions(verdicts)]}
    return found


def describe(found: dict[str, dict]) -> str:
    """One line: each oracle's verdict side by side ('nll polluted at 128..512, greedy clean')."""
    def one(name: str, record: dict) -> str:
        if not record["flagged"]:
            return f"{name} clean"
        edges = ", ".join(f"{t['direction']} at {t['lo']}{'|' if t['resolved'] else '..'}{t['hi']}"
                          for t in record["transitions"])  # lo..hi: no length between was probed
        return f"{name} polluted at {', '.join(map(str, record['flagged']))}" + (f" ({edges})" if edges else "")
    return "oracles: " + "; ".join(one(name, record) for name, record in found.items())
