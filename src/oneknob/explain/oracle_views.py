"""Every oracle is a verdict: each run seen through one oracle at a time.

A run's own `transitions` and per-length `polluted` are the combined verdict (polluted where any oracle the
study asked for is), so "all clean" means every oracle clean at every measured length. `view(run, oracle)` is
the same run with that oracle's verdicts and transitions in their place, so every analysis written for one
verdict (shape, versus_baseline, what a transition tracks, the confounds) runs unchanged on each oracle.

The headline of a run whose oracles disagree names each one ("nll: all clean; greedy/decode: clean->polluted at
284|285"), in the order the study listed them; where they agree it is the combined shape. Which oracles a run
has, and their verdicts, do not depend on that order.
"""

from __future__ import annotations

from typing import Any


def asked(run: dict) -> list[str]:
    return list(run.get("oracles") or {})


def view(run: dict, oracle: str) -> dict[str, Any]:
    """The run as this oracle alone judged it."""
    record = run["oracles"][oracle]
    verdicts = record["verdicts"]
    points = [p | {"polluted": verdicts.get(p["length"], p["polluted"]),
                   "polluted_samples": None} for p in run["points"]]
    return run | {"transitions": record["transitions"], "points": points, "split_samples": [], "oracle": oracle}


def groups(run: dict) -> list[list[str]]:
    """The run's oracles grouped by identical verdicts at every measured length."""
    found: dict[str, list[str]] = {}
    for name in asked(run):
        found.setdefault(repr(sorted(run["oracles"][name]["verdicts"].items())), []).append(name)
    return list(found.values())


def disagree(run: dict) -> bool:
    return len(groups(run)) > 1


def headline(run: dict, shape) -> str:
    """The run's transitions in words over every oracle (`shape`: analysis.shape_text)."""
    if not disagree(run):
        return shape(run)
    return "; ".join(f"{'/'.join(names)}: {shape(view(run, names[0]))}" for names in groups(run))


def per_oracle(run: dict, baseline: dict | None, shape, versus) -> dict[str, dict]:
    """{oracle: {shape, transitions, versus_baseline}} of one measured run."""
    found = {}
    for name in asked(run):
        mine = view(run, name)
        theirs = (view(baseline, name) if baseline and baseline is not run and name in (baseline.get("oracles") or {})
                  else None)
        found[name] = {"shape": shape(mine), "transitions": mine["transitions"],
                       "versus_baseline": versus(mine, theirs) if theirs is not None else None}
    return found


def varying(runs: list[dict]) -> list[str]:
    """The oracles that disagree with another somewhere in these runs (each then gets its own claims and
    confounds); [] when every run's oracles agree everywhere."""
    names: list[str] = []
    for run in runs:
        if disagree(run):
            names += [n for n in asked(run) if n not in names]
    return names
