"""report.md where the oracles disagree somewhere: what each oracle found, said once.

The report speaks of the combined verdict (a length is polluted where any oracle says so). An oracle whose verdicts
are the combined ones in every run adds nothing under its own name; oracles that say the same are named together;
one that is clean everywhere is one line (the seed's "generation was unaffected").
"""

from __future__ import annotations

from oneknob.explain import oracle_views


def versus_lines(summary: dict) -> list[str]:
    """The variants grouped by what they did to the baseline's transitions (analysis: versus_baseline), over
    every oracle, then per oracle where the oracles of a run disagree."""
    groups: dict[str, list[str]] = {}
    for run in summary["runs"]:
        if versus := run.get("versus_baseline"):
            groups.setdefault(versus["relation"], []).append(run["name"])
        if oracle_views.disagree(run) or any(oracle_views.disagree(r) for r in summary["runs"] if r["knob"] is None):
            for name, record in (run.get("oracle_results") or {}).items():
                if versus := record.get("versus_baseline"):
                    groups.setdefault(f"{name}: {versus['relation']}", []).append(run["name"])
    return [f"{relation} versus the baseline: {', '.join(names)}" for relation, names in groups.items()]


def _polluted(run: dict, oracle: str | None = None) -> set[str]:
    if oracle is None:
        return {str(p["length"]) for p in run["points"] if p["polluted"]}
    return {str(length) for length, bad in run["oracles"][oracle]["verdicts"].items() if bad}


def combined(summary: dict, oracle: str) -> bool:
    """The oracle judged every run as the combined verdict did: what the report says of the runs is its finding
    too, so a line of its own would repeat it."""
    return all(_polluted(r, oracle) == _polluted(r) for r in summary["runs"] if oracle in (r.get("oracles") or {}))


def once(found: dict[str, list[str]]) -> list[str]:
    """{text: oracles} as lines, each text once with every oracle that says it ("nll, topk: ...")."""
    return [f"{', '.join(names)}: {text}" for text, names in found.items()]


def oracle_findings(summary: dict) -> list[str]:
    """What each oracle's transitions track, where the oracles disagree (analysis: summary["oracles"]): an oracle
    whose verdicts are the combined ones is already said, one that only says the boundary never moved (a cleared run
    is no boundary: the versus lines say what it did) says nothing, and oracles that say the same are named once."""
    found: dict[str, list[str]] = {}
    for name, seen in (summary.get("oracles") or {}).items():
        if combined(summary, name):
            continue
        for knob, detail in seen["tracks_detail"].items():
            if detail.get("reason") not in ("too_few_boundaries", "never_moved"):
                found.setdefault(f"{knob}: {detail['text']}", []).append(name)
    return once(found)


def oracle_versus_lines(summary: dict) -> list[str]:
    """Per oracle, what the variants did, where the oracles of a run disagree and the oracle's verdicts are not
    the combined ones (those are answer.paragraph's and the knobs' lines); oracles that did the same named once."""
    found: dict[str, list[str]] = {}
    for line in versus_lines(summary):
        head, _, rest = line.partition(": ")
        if " versus " in head or combined(summary, head):
            continue
        if not any(_polluted(r, head) for r in summary["runs"] if head in (r.get("oracles") or {})):
            rest = "clean at every length of every run"  # "unchanged" of every variant would hide that
        if head not in found.get(rest, []):
            found.setdefault(rest, []).append(head)
    return once(found)
