"""Probes to find an exact boundary in [2, 4096]: oneknob's grid + bisection against a linear scan.

The grid is 12 points, 2, 4, 8, ..., 4096 (powers of two: the seed's boundaries 256|257 and 512|513
sit right above grid points). The verdict function is known: polluted up to the boundary B, clean
from B + 1. oneknob probes the grid, then bisects the one verdict change to (B, B + 1). A linear scan
from 2 upward needs every length up to the first clean one: B lengths (2..B+1).
"""

from __future__ import annotations

import random
import statistics

from oneknob.verdict.search import find_boundaries
from oneknob.verdict.judge import CLEAN, POLLUTED

GRID = [2**i for i in range(1, 13)]
NAMED = [2, 3, 100, 256, 257, 512, 513, 777, 1500, 2048, 3000, 4095]


def probes_for(boundary: int) -> tuple[int, bool]:
    """(probes used, whether the boundary found is exactly (B, B+1))."""
    result = find_boundaries(GRID, lambda length: POLLUTED if length <= boundary else CLEAN)
    return result.probes, [(t.lo, t.hi) for t in result.transitions] == [(boundary, boundary + 1)]


def bench(random_boundaries: int = 2000, seed: int = 0) -> dict:
    named = [(b, *probes_for(b), b) for b in NAMED]  # (B, probes, exact, linear-scan lengths)
    rng = random.Random(seed)
    sampled = [rng.randint(2, 4095) for _ in range(random_boundaries)]
    probes = [probes_for(b) for b in sampled]
    return {"named": named, "random": {"n": random_boundaries, "all_exact": all(e for _, e in probes),
                                       "probes_median": statistics.median(p for p, _ in probes),
                                       "probes_max": max(p for p, _ in probes),
                                       "linear_median": statistics.median(sampled),
                                       "linear_max": max(sampled)}}


def markdown(result: dict) -> str:
    lines = ["| boundary B (last polluted) | oneknob probes (12-point grid + bisection) | exact B\\|B+1 | "
             "linear scan from 2 (lengths) | linear / oneknob |", "|---|---|---|---|---|"]
    for boundary, probes, exact, linear in result["named"]:
        lines.append(f"| {boundary} | {probes} | {'yes' if exact else 'NO'} | {linear} | {linear / probes:.1f}x |")
    r = result["random"]
    lines.append(f"| {r['n']} uniform random B in [2, 4095] | median {r['probes_median']:g}, max {r['probes_max']} "
                 f"| {'all' if r['all_exact'] else 'NOT all'} | median {r['linear_median']:g}, max {r['linear_max']} "
                 f"| {r['linear_median'] / r['probes_median']:.0f}x (medians) |")
    return "\n".join(lines)
