"""Every transition of every run explained in that run's own terms: what each one coincides with.

The confounds at the baseline (confounds.py) and what a boundary tracks across runs (claims.py) read the
baseline's edges. A variant's edges (an edge that appeared, moved, an island) and every oracle's edges get the
same reading here: each side of a resolved transition against the run's candidate quantities (its resolved
config's, its model's config.json length fields `model.<path>`, its knobs' integer values), exactly or off by
one or two (`last clean 301 = model.rope_scaling.original_max_position_embeddings (300) + 1`); for a decode
oracle also the first divergent token position of the first polluted continuation (a decode bug's edge is
often a position). Against the baseline, an edge the variant has and the baseline lacks says which of its
coinciding quantities moved with the knob and which did not.

Pure functions over run dicts (compare.load_run, after analysis has added `oracle_results`).
"""

from __future__ import annotations

from typing import Any

from oneknob.config.quantities import derived_quantities, label, ordered
from oneknob.explain import oracle_views
from oneknob.verdict.search import Transition, relation_text

OFFSETS = (0, 1, -1, 2, -2)  # how far a side may sit from a quantity and still be said to coincide with it


def candidates(run: dict) -> dict[str, int]:
    """The run's named quantities: its resolved config's (model fields included), the integers of the engine's
    scheduler, cache and compilation config (`<section>.<field>`) and its knobs' integer values."""
    resolved = run.get("resolved") or {}
    found = derived_quantities(resolved) if resolved else {}
    found |= {k: v for k, v in (resolved.get("config_quantities") or {}).items() if k not in found}
    knobs = {f"knob {k}": v for k, v in (run.get("requested") or {}).items()
             if isinstance(v, int) and not isinstance(v, bool) and v > 1}
    return found | {k: v for k, v in knobs.items() if v not in found.values()}


def _offset_text(name: str, value: int, offset: int) -> str:
    said = f"{label(name)} ({value})" if offset else label(name)
    return said + (f" + {offset}" if offset > 0 else f" - {-offset}" if offset < 0 else "")


def coincidences(side: int, quantities: dict[str, int]) -> list[dict[str, Any]]:
    """The quantities within OFFSETS of one length or position, nearest first."""
    found = []
    for offset in OFFSETS:
        found += [{"quantity": q, "value": quantities[q], "offset": offset}
                  for q in ordered(quantities) if quantities[q] + offset == side]
    return found


def transition(record: dict, quantities: dict[str, int], oracle: str | None) -> dict[str, Any]:
    """One transition: each side's coincidences, and for a decode oracle its first divergent position's."""
    edge = Transition.from_dict(record)
    head = (f"{oracle}: " if oracle else "") + f"{edge.direction} at {edge.text}"
    at = dict(edge.relations()) if edge.resolved else {}
    if (position := record.get("first_position")) is not None:
        at["first_divergent_position"] = position
    sides = [{"relation": relation, "at": value, "matches": found}
             for relation, value in at.items() if (found := coincidences(value, quantities))]
    if any(m["offset"] == 0 for s in sides for m in s["matches"]):  # an exact match says it: no offsets beside it
        sides = [s | {"matches": exact} for s in sides if (exact := [m for m in s["matches"] if m["offset"] == 0])]
    clauses = [f"{relation_text(s['relation'])} {s['at']} = "
               + ", ".join(_offset_text(m["quantity"], m["value"], m["offset"]) for m in s["matches"])
               for s in sides]
    if not edge.resolved:
        text = f"{head} is unresolved (the flip lies in {edge.lo + 1}..{edge.hi})"
    else:
        text = f"{head}: " + ("; ".join(clauses) if clauses else
                              f"no candidate quantity is within 2 of {edge.lo}, {edge.hi}"
                              + (f" or position {position}" if position is not None else ""))
    return {"oracle": oracle, "transition": edge.text, "direction": edge.direction, "resolved": edge.resolved,
            "sides": sides, "text": text}


def edges(run: dict) -> list[tuple[str | None, dict]]:
    """(oracle or None, transition record) of every transition: each oracle's where they disagree."""
    if oracle_views.disagree(run):
        return [(name, record) for name in oracle_views.asked(run) for record in run["oracles"][name]["transitions"]]
    decode = next((n for n in oracle_views.asked(run) if n in ("greedy", "decode")), None)
    if decode and run["oracles"][decode]["transitions"]:  # the same edges: the decode records carry positions
        return [(None, record) for record in run["oracles"][decode]["transitions"]]
    return [(None, record) for record in run["transitions"]]


def explain_run(run: dict, baseline: dict | None) -> list[dict[str, Any]]:
    """Every transition of one measured run explained; against the baseline, for an edge the baseline lacks,
    which coinciding quantities moved with the knob."""
    quantities = candidates(run)
    theirs = candidates(baseline) if baseline is not None and baseline is not run else None
    base_edges = {(o, r["lo"], r["hi"]) for o, r in edges(baseline)} if theirs is not None else set()
    found = []
    for oracle, record in edges(run):
        explained = transition(record, quantities, oracle)
        if theirs is not None and (oracle, record["lo"], record["hi"]) not in base_edges:
            explained["versus_baseline"] = _moved(explained, quantities, theirs)
            if explained["versus_baseline"]:
                explained["text"] += f" (an edge the baseline lacks; {explained['versus_baseline']})"
        found.append(explained)
    return found


def _moved(explained: dict, mine: dict[str, int], theirs: dict[str, int]) -> str:
    """Which of an edge's coinciding quantities differ from the baseline's (moved with the knob) and which
    do not (the edge is new although they stayed)."""
    names = list(dict.fromkeys(m["quantity"] for s in explained["sides"] for m in s["matches"]))
    moved = [f"{label(q)} {theirs[q]} -> {mine[q]}" for q in names if q in theirs and theirs[q] != mine[q]]
    kept = [f"{label(q)} ({mine[q]})" for q in names if q in theirs and theirs[q] == mine[q]]
    parts = ([f"moved with the knob: {', '.join(moved)}"] if moved else []) + \
        ([f"unmoved: {', '.join(kept)}"] if kept else [])
    return "; ".join(parts)


def _named(entry: dict) -> set[str]:
    return {m["quantity"] for s in entry["sides"] for m in s["matches"]}


def new_edges(runs: list[dict]) -> list[str]:
    """One line per run with an edge the baseline lacks: "<run>: <its explanations>" (report.md's Result)."""
    return [f"{run['name']}: " + "; ".join(e["text"] for e in run["explained"]) for run in runs
            if any("versus_baseline" in e for e in run.get("explained") or [])]


def same_edges(runs: list[dict], baseline: dict | None) -> list[str]:
    """For a run whose edges are all the baseline's: only what differs in what they coincide with ("also =",
    "no longer ="); nothing when that is the same too (its Confounds line)."""
    if baseline is None:
        return []
    theirs = {(e["oracle"], e["transition"]): e for e in baseline.get("explained") or []}
    found = []
    for run in runs:
        if run is baseline or not run.get("explained") or any("versus_baseline" in e for e in run["explained"]):
            continue
        said = []
        for entry in run["explained"]:
            before = theirs.get((entry["oracle"], entry["transition"]))
            added, gone = _named(entry) - _named(before or entry), _named(before or entry) - _named(entry)
            if added or gone:
                said.append(f"{entry['transition']} as at the baseline"
                            + (f"; also = {', '.join(label(q) for q in ordered(dict.fromkeys(added, 0)))}"
                               if added else "")
                            + (f"; no longer = {', '.join(label(q) for q in ordered(dict.fromkeys(gone, 0)))}"
                               if gone else ""))
        if said:
            found.append(f"{run['name']}: " + "; ".join(dict.fromkeys(said)))  # oracles sharing an edge: once
    return found
