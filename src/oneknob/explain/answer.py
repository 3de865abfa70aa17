"""The answer first: report.md's title and opening paragraph, what each knob did, and the terminal's summary.

Written as a vLLM maintainer would write the finding: where the baseline is polluted, which run moved or cleared
its boundary, and what the boundary tracks. "Tracks" is said only of a tested explanation (summary
["conclusions"]: a follow-up run moved the quantity and the boundary moved as predicted); without one, the
quantities a boundary coincides with are said to coincide, never to be tracked. Pure functions of the summary
(analysis.summarize), so the report rebuilt from MLflow says the same.
"""

from __future__ import annotations

import json
from typing import Any

from oneknob.config.quantities import POWER_OF_TWO, label
from oneknob.verdict import search
from oneknob.verdict.search import DOWN, Transition, relation_text

MEASURED = ("ok", "confounded")
SAID = {"cleared": "cleared it", "unchanged": "left the verdicts unchanged", "flattened": "flattened it"}


def measured(run: dict) -> bool:
    return run["status"] in MEASURED and bool(run["points"])


def anchor(summary: dict) -> dict | None:
    """The run the answer is about: the baseline, else the first measured run with a transition."""
    runs = summary["runs"]
    baseline = next((r for r in runs if r["knob"] is None and measured(r)), None)
    return baseline or next((r for r in runs if measured(r) and r["transitions"]), None)


def the(text: str) -> str:
    """A quantity's label as a noun: "the resolved max capture size", but "max_num_seqs x (K+1)" as written."""
    return text if any(c in text for c in "_.'") or text.startswith("a ") else f"the {text}"


def join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


def edges(run: dict) -> str:
    return ", ".join(Transition.from_dict(t).text for t in run["transitions"]) or "no transition"


def _unit(run: dict) -> str:
    from oneknob.explain.axis_text import axis_of

    unit = axis_of(run).unit
    return "tokens" if unit == "prompt tokens" else unit


def where(run: dict) -> str:
    """"polluted at 128..512 and clean at 513..1024 tokens (512|513)": the run's verdicts over what it measured."""
    lengths = sorted(p["length"] for p in run["points"])
    verdicts = {p["length"]: search.POLLUTED if p["polluted"] else search.CLEAN for p in run["points"]}
    polluted = [L for L, v in verdicts.items() if v == search.POLLUTED]
    span = f"{lengths[0]}..{lengths[-1]} {_unit(run)}"
    if not polluted:
        return f"clean at every measured length ({span})"
    if len(polluted) == len(lengths):
        return f"polluted at every measured length ({span})"
    spans = " and ".join(f"{a}..{b}" if a != b else str(a) for a, b in search.polluted_spans(verdicts))
    records = [Transition.from_dict(t) for t in run["transitions"]]
    if len(records) == 1:
        clean = [L for L in lengths if verdicts[L] == search.CLEAN]
        clean_span = f"{clean[0]}..{clean[-1]}" if len(clean) > 1 else str(clean[0])
        said = (f"polluted at {spans} {_unit(run)} and clean at {clean_span}" if records[0].direction == DOWN else
                f"clean at {clean_span} {_unit(run)} and polluted at {spans}")
        return f"{said}: the boundary is {records[0].text}"
    return f"polluted at {spans} of {span}: the boundary{'s are' if len(records) > 1 else ' is'} {edges(run)}"


def _value(run: dict) -> str:
    return f"{run['knob']}={json.dumps(run['value'])}"


def did(run: dict) -> str:
    """What one variant did to the baseline's boundary, in a few words: "moved it to 256|257", "cleared it"."""
    if not measured(run):
        return f"did not measure ({run['status']})"
    versus = run.get("versus_baseline")
    if not versus:
        return edges(run)
    relation = versus["relation"]
    if relation == "moved":
        return f"moved it to {versus['to']}"
    if relation == "unchanged" and versus["from"] != "none":
        return f"left it at {versus['from']}"
    if relation in SAID:
        return SAID[relation]
    return versus["text"].split(";")[0]  # appeared / spread / shrank: its first clause says where


def _qualifier(run: dict) -> str:
    """What a reader must know beside the verdict: a pin, a confounded run."""
    said = [f"pinned {k}={json.dumps(v)}" for k, v in (run.get("pinned") or {}).items()]
    if run["status"] == "confounded":
        said.append(f"confounded: also moved {', '.join(run.get('side_effects') or []) or 'another field'}")
    return f" ({'; '.join(said)})" if said else ""


def conclusions(summary: dict, run: dict | None = None) -> list[dict]:
    """The tested explanations (explain.tested), of `run`'s transitions only where given."""
    return [c for c in summary.get("conclusions") or [] if c.get("text") and (run is None or c["run"] == run["name"])]


def _shared(found: list[dict], run: dict) -> list[dict]:
    """Conclusions that say the same of one edge for several oracles, said once: `oracles` lists them, and the
    edge needs no oracle's name where it is the run's own (every oracle that has it agrees)."""
    groups: dict[str, dict] = {}
    for c in found:
        key = json.dumps([c["transition"], c.get("direction"), c.get("tracks"), c.get("offset"), c.get("ruled_out")],
                         sort_keys=True, default=str)
        if key in groups:
            groups[key]["oracles"].append(c["oracle"])
        else:
            groups[key] = {**c, "oracles": [c["oracle"]] if c.get("oracle") else []}
    own = {f"{t['lo']}|{t['hi']}" for t in run.get("transitions") or []}
    merged = []
    for c in groups.values():
        head = f"{c['oracle']}: " if c.get("oracle") else ""
        if len(c["oracles"]) > 1:
            plain = c["transition"] in own
            c = {**c, "oracle": None if plain else ", ".join(c["oracles"])}
            if head and c["text"].startswith(head):
                c["text"] = (f"{c['oracle']}: " if c["oracle"] else "") + c["text"][len(head):]
        merged.append(c)
    return merged


def _claim(summary: dict) -> tuple[str, dict] | None:
    """(knob, tracks_detail) of the first knob whose runs moved the boundary with one quantity (claims.tracks)."""
    return next(((knob, detail) for knob, detail in (summary.get("tracks_detail") or {}).items()
                 if detail.get("quantity") and not detail.get("reason")), None)


def _coinciding(summary: dict) -> list[str]:
    return [q for q in (summary.get("confounds") or {}).get("coinciding") or [] if q != POWER_OF_TWO]


def _arrow(values: list) -> str:
    return " -> ".join(str(v) for v in values)


def explanation(summary: dict, run: dict) -> list[str]:
    """What the boundary tracks (tested), or what it coincides with (untested), in sentences."""
    tested = _shared(conclusions(summary, run), run)
    if tested:
        return [c["text"] for c in tested]
    if not run["transitions"]:
        return []
    said = []
    claim = _claim(summary)
    if claim:
        knob, detail = claim
        said.append(f"{edges(run)} coincides with {the(detail['label'])} in every run of {knob} "
                    f"({relation_text(detail['relation'])} = it: {_arrow(detail['values'])})")
    others = [q for q in _coinciding(summary) if not claim or q != claim[1]["quantity"]]
    if others:
        at = summary["confounds"]["at"]
        said.append(f"at {'the baseline' if at in (None, 'baseline') else at} it {'also ' if claim else ''}equals "
                    f"{join([the(label(q)) for q in others])}")
    for check in (summary.get("confounds") or {}).get("checked") or []:
        if not check["follows"] and check["held"] is not False:
            said.append(f"{check['knob']}={json.dumps(check['value'])} moved {the(label(check['quantity']))} to "
                        f"{check['resolved']} and the boundary did not follow")
    if said:
        said[-1] += " (coincidences: no follow-up run has tested them)"
    return said


def _groups(summary: dict) -> dict[str, list[dict]]:
    """The variants (follow-ups apart) by what they did: cleared, moved, unchanged, the rest."""
    groups: dict[str, list[dict]] = {}
    for run in summary["runs"]:
        if run["knob"] is None or run.get("followup"):
            continue
        relation = (run.get("versus_baseline") or {}).get("relation") if measured(run) else "unmeasured"
        groups.setdefault(relation or "other", []).append(run)
    return groups


def _edge(conclusion: dict) -> str:
    """A tested edge as the title names it: "424|425", or "greedy's 424|425" where one oracle's edge it is."""
    if not conclusion.get("oracle"):
        return conclusion["transition"]
    owners = [o + "'s" for o in conclusion.get("oracles") or [conclusion["oracle"]]]
    return f"{join(owners)} {conclusion['transition']}"


def title(summary: dict) -> str:
    """The finding in one line: "512|513 tracks the max capture size; runner="v2" clears it"."""
    run = anchor(summary)
    if run is None:
        return "no run measured anything" if summary["runs"] else "no runs"
    groups = _groups(summary)
    parts = []
    found = _shared(conclusions(summary, run), run)
    tested = [c for c in found if c.get("tracks")]
    claim = _claim(summary)
    ruled_out = [c for c in found if not c.get("tracks") and c.get("ruled_out")]
    if tested:
        parts += [f"{_edge(c)} tracks {the(c['label'] or label(c['tracks']))}" for c in tested]
    elif ruled_out:  # every tested quantity failed its test: that is the finding
        parts += [f"{_edge(c)} tracks none of the {len(c['ruled_out'])} quantities tested"
                  if len(c["ruled_out"]) > 1 else f"{_edge(c)} does not track {the(label(c['ruled_out'][0]))}"
                  for c in ruled_out]
    elif run["transitions"]:
        if claim:
            parts.append(f"{edges(run)} coincides with {the(claim[1]['label'])}")
        elif coinciding := _coinciding(summary):
            more = len(coinciding) - 1
            parts.append(f"{edges(run)} coincides with {the(label(coinciding[0]))}"
                         + (f" and {more} other quantit{'ies' if more > 1 else 'y'}" if more else ""))
        else:
            parts.append(f"{edges(run)} equals no candidate quantity")
    else:
        parts.append(f"{'The baseline' if run['knob'] is None else run['name']} is {where(run)}")
    if moved := groups.get("moved"):
        parts.append(", ".join(f"{r['name']} moves it to {r['versus_baseline']['to']}" for r in moved))
    if cleared := groups.get("cleared"):
        parts.append(f"{join([r['name'] for r in cleared])} clear{'s' if len(cleared) == 1 else ''} it")
    for relation in ("appeared", "spread", "shrank"):
        if found := groups.get(relation):
            parts.append(f"{join([r['name'] for r in found])}: {relation}")
    return "; ".join(parts)


def paragraph(summary: dict) -> str:
    """The opening paragraph: the baseline's verdicts, what each group of variants did, the explanation."""
    run = anchor(summary)
    if run is None:
        return "No run measured anything: see the notes."
    who = "The baseline" if run["knob"] is None else run["name"]
    sentences = [f"{who} is {where(run)}."]
    groups = _groups(summary)
    said = []
    for relation in ("moved", "cleared", "unchanged", "flattened", "appeared", "spread", "shrank", "other"):
        for found in [groups.get(relation) or []]:
            if not found:
                continue
            if relation in ("moved", "appeared", "spread", "shrank", "other"):
                said += [f"{r['name']}{_qualifier(r)} {did(r)}" for r in found]
            else:
                said.append(f"{join([r['name'] + _qualifier(r) for r in found])} {did(found[0])}")
    if groups.get("unmeasured"):
        said.append(f"{join([r['name'] for r in groups['unmeasured']])} measured nothing (see the notes)")
    if said:
        sentences.append(_capital("; ".join(said)) + ".")
    if explained := explanation(summary, run):
        sentences.append(_capital("; ".join(explained)) + ".")
    return " ".join(sentences)


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:] if text and not text[0].isupper() and "=" not in text.split()[0] else text


def knob_lines(summary: dict) -> list[str]:
    """One line per knob: what each of its values did to the baseline's boundary, and the quantity its runs moved
    with it (said as a coincidence until a follow-up tests it)."""
    lines = []
    details = summary.get("tracks_detail") or {}
    tested = {c["tracks"] for c in conclusions(summary) if c.get("tracks")}
    for knob in dict.fromkeys(r["knob"] for r in summary["runs"] if r["knob"] and not r.get("followup")):
        runs = [r for r in summary["runs"] if r["knob"] == knob and not r.get("followup")]
        said = "; ".join(f"{r['name']}{_qualifier(r)} {did(r)}" for r in runs)
        detail = details.get(knob) or {}
        if detail.get("quantity") and not detail.get("reason"):
            verb = "tracks" if detail["quantity"] in tested else "coincides with"
            said += (f"; the boundary {verb} {the(detail['label'])} in these runs "
                     f"({relation_text(detail['relation'])} = it: {_arrow(detail['values'])})")
        elif detail.get("reason") in ("ambiguous", "conflict", "unexplained", "model_threshold", "unresolved"):
            said += "; " + detail["text"].replace(" tracks ", " coincides with ")
        if detail.get("conflicts_with"):
            said += f" (conflicts with {', '.join(detail['conflicts_with'])}'s claim)"
        lines.append(said)
    return lines


def settled(summary: dict) -> str | None:
    """What the anchor's tested explanations settle ("512|513 tracks the resolved max capture size"), or None."""
    run = anchor(summary)
    found = [c for c in _shared(conclusions(summary, run), run) if c.get("tracks")] if run else []
    return "; ".join(f"{_edge(c)} tracks {the(c['label'] or label(c['tracks']))}" for c in found) or None


def conclusion_lines(summary: dict) -> list[str]:
    """Each tested explanation (summary["conclusions"]), with what it could not test and why (the follow-ups that
    tested it: answer_followups)."""
    lines = []
    for c in (c for run in summary["runs"] for c in _shared(conclusions(summary, run), run)):
        lines.append(f"{c['run']}: {c['text']}")
        lines += [f"  - untested: {label(u['quantity'])}: {u['why']}" for u in c.get("untested") or []]
        if c.get("untestable"):
            lines.append(f"  - no knob moves {join([label(q) for q in c['untestable']])} alone: not testable here")
        if c.get("evidence"):
            lines.append(f"  - evidence: {', '.join(c['evidence'])}")
    return lines


def sides(summary: dict) -> tuple[int, int] | None:
    """The two lengths around the anchor's first resolved transition, when the anchor measured both."""
    run = anchor(summary)
    record = next((t for t in (run or {}).get("transitions") or [] if t["resolved"]), None)
    if record is None:
        return None
    measured_at = {p["length"] for p in run["points"]}
    return (record["lo"], record["hi"]) if {record["lo"], record["hi"]} <= measured_at else None


def boundary_rows(summary: dict) -> list[dict[str, Any]]:
    """Every measured run's mean NLL at the anchor's two sides (and the reference's): the seed's "15.878 ->
    1.939" per run, with the verdicts there."""
    found = sides(summary)
    if found is None:
        return []
    lo, hi = found
    rows = []
    reference = {}
    for run in summary["runs"]:
        if not measured(run):
            continue
        points = {p["length"]: p for p in run["points"]}
        if lo not in points or hi not in points:
            continue
        for L in (lo, hi):
            if points[L].get("nll_ref") is not None:
                reference.setdefault(L, points[L]["nll_ref"])
        rows.append({"run": run["name"], "lo": points[lo]["nll"], "hi": points[hi]["nll"],
                     "verdicts": ["polluted" if points[L]["polluted"] else "clean" for L in (lo, hi)]})
    if len(reference) == 2 and len({run["name"] for run in summary["runs"]}) > 0:
        rows.append({"run": "reference", "lo": reference[lo], "hi": reference[hi], "verdicts": None})
    return rows
