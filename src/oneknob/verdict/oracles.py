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

Pure functions: top-k lists are [(token id, logprob), ...] per scored position, best first, or a `TopKTable`
read from them once (a reference's, sliced per length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain

import numpy as np

from oneknob.config.schema import ORACLES

NO_SHARED_SUPPORT_KL = 99.0  # the two top-k sets share no token: as far apart as two distributions get here


@dataclass(frozen=True)
class TopKTable:
    """Top-k rows as two (positions, k) arrays: ids (-1 where a row holds fewer than k) and logprobs (-inf there).
    A reference's rows are read into one per sample once; each length's judgement takes a prefix, a view."""
    ids: np.ndarray
    logprobs: np.ndarray

    @classmethod
    def read(cls, rows: list[list], k: int) -> TopKTable:
        """The first k entries of every row."""
        if all(len(row) >= k for row in rows):  # as engines answer: read in one pass, without a loop in Python
            flat = np.fromiter(chain.from_iterable(chain.from_iterable(row[:k] for row in rows)), dtype=np.float64,
                               count=len(rows) * k * 2).reshape(len(rows), k, 2)
            return cls(flat[:, :, 0].astype(np.int64), flat[:, :, 1])
        ids = np.full((len(rows), k), -1, dtype=np.int64)
        logprobs = np.full((len(rows), k), -np.inf)
        for i, row in enumerate(rows):
            row = row[:k]
            if row:
                ids[i, :len(row)], logprobs[i, :len(row)] = zip(*row)
        return cls(ids, logprobs)

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.ids, self.logprobs

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, positions: slice) -> TopKTable:
        return TopKTable(self.ids[positions], self.logprobs[positions])


def _table(rows: list[list] | TopKTable, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, logprobs) of the first k entries of the first n rows. Rows that hold their `arrays` (a table read
    before, or the rows of a worker's answer, oneknob.run.executor) give those; padding beyond their width is the
    same: a -1 id matches nothing."""
    ids, logprobs = getattr(rows, "arrays", None) or TopKTable.read(rows[:n], k).arrays
    return ids[:n, :k], logprobs[:n, :k]


def topk_compare(topk: list[list] | TopKTable, reference: list[list] | TopKTable, k: int,
                 max_kl: float) -> dict[str, float]:
    """Per-position overlap and KL of two top-k tables (one row per scored position), summarised. Vectorised over
    positions (between two engine requests: ~1000 positions x k per prompt), the same numbers as, per position,
    {id: logprob} dicts of both rows' first k entries, the overlap their shared ids over the reference's, and
    the KL over the shared ids, each side renormalised there (NO_SHARED_SUPPORT_KL when none is shared)."""
    n = min(len(topk), len(reference))
    if not n:
        return {"topk_overlap": 1.0, "topk_overlap_min": 1.0, "topk_kl": 0.0, "topk_kl_max": 0.0,
                "topk_share_beyond": 0.0}
    our_ids, ours = _table(topk, k, n)
    ref_ids, theirs = _table(reference, k, n)
    # same[i, a, b]: our entry a and the reference's entry b name the same token (ids within a row are distinct)
    same = (our_ids[:, :, None] == ref_ids[:, None, :]) & (ref_ids[:, None, :] >= 0)
    shared = same.any(axis=1)  # per reference entry: we hold it too
    overlaps = shared.sum(axis=1) / np.maximum((ref_ids >= 0).sum(axis=1), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ours_there = np.where(shared, np.where(same, ours[:, :, None], 0.0).sum(axis=1), -np.inf)
        theirs_there = np.where(shared, theirs, -np.inf)
        ref_norm = np.log(np.exp(theirs_there).sum(axis=1, keepdims=True))
        our_norm = np.log(np.exp(ours_there).sum(axis=1, keepdims=True))
        terms = np.exp(theirs_there - ref_norm) * ((theirs_there - ref_norm) - (ours_there - our_norm))
    kls = np.where(shared.any(axis=1), np.maximum(0.0, np.where(shared, terms, 0.0).sum(axis=1)),
                   NO_SHARED_SUPPORT_KL)
    return {"topk_overlap": float(overlaps.mean()), "topk_overlap_min": float(overlaps.min()),
            "topk_kl": float(kls.mean()), "topk_kl_max": float(kls.max()),
            "topk_share_beyond": float((kls > max_kl).mean())}


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
    # over the samples that have the value: a malformed answer may leave a sample without it
    for field in ("topk_overlap", "topk_kl", "greedy_match", "decode_delta", "decode_nll", "decode_nll_ref"):
        if values := [v for p in points if (v := getattr(p, field)) is not None and math.isfinite(v)]:
            metrics.append((field, math.fsum(values) / len(values), length))
    if deltas := [p.decode_max_delta for p in points if p.decode_max_delta is not None]:
        metrics.append(("decode_max_delta", max(deltas), length))
    for field in ("greedy_first_divergence", "decode_first_deviation"):  # offsets in the continuation, -1: none
        if any(getattr(p, field) is not None for p in points):
            offsets = [v for p in points if (v := getattr(p, field)) is not None and v >= 0]
            metrics.append((field, min(offsets) if offsets else -1, length))
    return metrics
