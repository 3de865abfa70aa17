"""report.md: what a vLLM maintainer receives, pasted into an issue as is, and the sweep's MLflow description.

    title, answer  the finding in a maintainer's words: where the baseline is polluted, which run moved or
                   cleared its boundary, what it tracks (tested) or coincides with (untested) (answer.py)
    header         what was compared, on what, how to reproduce it, the banners (report_header.py)
    knobs          what each knob's runs did; tested explanations; coincidences at the baseline
    runs           one row per run, and every run's mean NLL at the boundary's two sides
    notes, plots, the reproduction (repro.py, folded)
    folded         each run's transitions in words, and its per-length table (report_runs.py)

What stays open fits one screen; the detail is folded in <details> blocks, which GitHub shows closed (MLflow's
description shows them open: publish.py). A pure function of the summary (analysis.summarize over
compare.load_run's records), so a report rebuilt from MLflow is the same text; `links` turns run ids and plot
files into MLflow UI routes for the run's description.
"""

from __future__ import annotations

from typing import Any

from oneknob.explain import answer
from oneknob.explain import answer_followups
from oneknob.explain import axis_text
from oneknob.explain import explained
from oneknob.explain import oracle_views
from oneknob.explain import warnings_text
from oneknob.explain.report_oracles import combined, once, oracle_findings, oracle_versus_lines
from oneknob.explain.numbers import nll, percent
from oneknob.explain.report_header import EMULATED, SIMULATION, banners, header_lines, show  # noqa: F401
from oneknob.explain.report_runs import (  # noqa: F401  (for callers: publish, report)
    LENGTH_HEADER,
    PER_LENGTH,
    Links,
    _run_ref,
    details,
    graphs_cell,
    per_length_lines,
    run_section,
    transitions_cell,
)
from oneknob.verdict.judge import samples_text, tolerance_text
from oneknob.verdict.search import Transition

RESOLVED_COLUMNS = (("capture", "max_capture_size"), ("graphs", "cudagraph_mode"), ("K", "spec_k"),
                    ("seqs", "max_num_seqs"), ("runner", "runner"))


def rows(summary: dict) -> list[dict[str, Any]]:
    """One row per run: cells as text, plus which resolved cells differ from the baseline's."""
    out = []
    across = {row["run"]: row for row in answer.boundary_rows(summary)}
    for run in summary["runs"]:
        versus = run.get("versus_baseline")
        cells = {"run": run["name"], "knob": run["knob"] or "-",
                 "value": "baseline" if run["knob"] is None else show(run["value"]),
                 **{column: show(run["resolved"].get(field)) if run["resolved"] else "-"
                    for column, field in RESOLVED_COLUMNS},
                 "transitions": transitions_cell(run), "vs baseline": versus["relation"] if versus else "-",
                 "NLL polluted": nll(run["nll_polluted"]), "NLL clean": nll(run["nll_clean"]),
                 "status": run["status"] + (" (pinned)" if run["pinned"] else "")}
        if run["resolved"]:
            cells["graphs"] = graphs_cell(run)
        row = across.get(run["name"])
        cells |= {"NLL lo": nll(row["lo"]) if row else "-", "NLL hi": nll(row["hi"]) if row else "-",
                  "jump": percent((row["lo"] - row["hi"]) / row["hi"]) if row and row["hi"] else "-"}
        changed = {column for column, field in RESOLVED_COLUMNS if field in run["changed"]}
        out.append({"cells": cells, "changed": changed, "run_id": run["run_id"]})
    return out


def findings(summary: dict) -> list[str]:
    """What each knob's runs did to the baseline's boundary and what moved with it (answer.knob_lines), the
    conflict between knobs' claims, and the caveats. The runs of different knobs are never chained into one claim:
    the pooled claim (summary["overall"]) is said only where no knob was varied (runs picked by hand)."""
    lines = answer.knob_lines(summary) + [answer_followups.line(r) for r in answer_followups.followups(summary)]
    if summary.get("conflict"):
        lines.append(summary["conflict"]["text"])
    if not summary["tracks_detail"] and summary["overall"].get("text"):
        lines.append(f"all measured runs together: {summary['overall']['text']}".replace(" tracks ",
                                                                                          " coincides with "))
    for detail in [*summary["tracks_detail"].values(), summary["overall"]]:
        if detail["quantity"] and detail.get("caveat") and f"caveat: {detail['caveat']}" not in lines:
            lines.append(f"caveat: {detail['caveat']}")
    return lines


def _qualifiers(record: dict) -> list[str]:
    """What a transition's verdict alone does not say: samples that disagree, an edge of one tolerance."""
    found = []
    polluted, samples = record.get("polluted_samples"), record.get("samples")
    if samples and polluted is not None and polluted < samples:
        side = Transition.from_dict(record).polluted_side
        found.append(f"its polluted side {side} is {samples_text(polluted, samples)}")
    if record.get("tolerance"):
        found.append(tolerance_text(record["tolerance"]))
    return found


def _decode_qualifiers(record: dict) -> list[str]:
    """Where a decode oracle's polluted continuation first diverged (token positions)."""
    if "covers" not in record:
        return []
    lo, hi = record["covers"]
    first = record.get("first_position")
    return [f"the continuation after {lo} tokens covers positions {lo}..{hi}"
            + (f" and first diverges at position {first}" if first is not None else "")]


def transition_lines(run: dict) -> list[str]:
    """What the report says of one run's transitions: one line, or the shape and then each transition; each
    oracle's where they disagree."""
    if oracle_views.disagree(run):
        lines = [f"{run['name']}: {run['headline']}"]
        for names in oracle_views.groups(run):  # oracles with the same verdicts everywhere: once
            for record in run["oracles"][names[0]]["transitions"]:
                said, more = Transition.from_dict(record).describe(), [*_qualifiers(record),
                                                                       *_decode_qualifiers(record)]
                if more or f"{'/'.join(names)}: {said}" not in run["headline"]:  # else the headline said it all
                    lines.append(f"  - {'/'.join(names)}: " + "; ".join([said, *more]))
        return lines + ([f"  - unresolved: {run['budget']}"] if run["budget"] else [])
    records = run["transitions"]
    if len(records) == 1:
        lines = [f"{run['name']}: " + "; ".join([Transition.from_dict(records[0]).describe(),
                                                  *_qualifiers(records[0])])]
    else:
        lines = [f"{run['name']}: {run['shape']}"]
        lines += ["  - " + "; ".join([Transition.from_dict(r).describe(), *_qualifiers(r)]) for r in records]
    if run["budget"]:
        lines.append(f"  - unresolved: {run['budget']}")
    counts = {(s["polluted"], s["samples"]): [] for s in run["split_samples"]}
    for split in run["split_samples"]:
        counts[(split["polluted"], split["samples"])].append(str(split["length"]))
    lines += [f"  - {samples_text(*count)} at {', '.join(lengths)} (a length counts as polluted when any sample is)"
              for count, lengths in counts.items()]
    if run.get("axis", "length") != "length":
        lines.append(f"  - axis={run['axis']}: positions are {axis_text.axis_of(run).unit}")
    return lines + [f"  - {line}" for line in run.get("axis_edges") or []]


def runs_table(summary: dict, links: Links | None) -> list[str]:
    """One row per run; where the baseline's boundary lo|hi was measured, every run's mean NLL at lo and at hi
    and the jump across it (the seed's "15.878 -> 1.939"), the reference's in the legend."""
    sides = answer.sides(summary)
    names = {"NLL lo": f"NLL at {sides[0]}", "NLL hi": f"NLL at {sides[1]}",
             "jump": f"{sides[0]} -> {sides[1]}"} if sides else {}
    columns = ("run", "transitions", "vs baseline", *(c for c, _ in RESOLVED_COLUMNS), *names, "status")
    lines = ["| " + " | ".join((*(names.get(c, c) for c in columns), "MLflow run")) + " |",
             "|" + "".join("---:|" if c in names else "---|" for c in columns) + "---|"]
    for row in rows(summary):
        text = {c: row["cells"][c].replace("|", "\\|") for c in columns}  # a boundary "512|513" in a table
        cells = [f"**{text[c]}**" if c in row["changed"] else text[c] for c in columns]
        lines.append("| " + " | ".join([*cells, _run_ref(row["run_id"], links)]) + " |")
    legend = ("Bold: the resolved value differs from the baseline's. p->c: polluted->clean, c->p: clean->polluted; "
              "lo..hi: not narrowed to adjacent lengths.")
    if answer_followups.followups(summary):
        legend += f" {answer_followups.LEGEND[:1].upper()}{answer_followups.LEGEND[1:]}."
    reference = next((r for r in answer.boundary_rows(summary) if r["run"] == "reference"), None)
    if sides:
        lo, hi = sides
        said = f" (the reference: {nll(reference['lo'])}, {nll(reference['hi'])})" if reference else ""
        legend += (f" NLL at {lo}, {hi}: mean NLL at the baseline's boundary{said}; {lo} -> {hi}: (NLL at {lo} - "
                   f"NLL at {hi}) / NLL at {hi}.")
    return lines + ["", legend]


def explained_lines(summary: dict) -> list[str]:
    """Each run with an edge the baseline lacks: what its transitions coincide with, in its terms (explained.py);
    not a run whose knob's edges the Result already claims to track a quantity."""
    claimed = {knob for knob, detail in summary["tracks_detail"].items() if detail.get("quantity")}
    return [f"explained: {line}" for line in explained.new_edges([r for r in summary["runs"] if r["knob"] not in
                                                                  claimed and not r.get("followup")])]


def transitions_block(summary: dict) -> list[str]:
    """Every run's transitions in words, with what the verdict alone does not say (split samples, a tolerance's
    edge, an unresolved search and its budget, decode positions), folded."""
    lines = []
    for run in summary["runs"]:
        if run["shape"]:
            lines += [line if line.startswith("  ") else f"- {line}" for line in transition_lines(run)]
            lines += [f"  - {line}" for line in warnings_text.run_lines(summary, run)]
    return details("Transitions of each run, in words", lines) if lines else []


def answered(summary: dict, conf: dict) -> str | None:
    """The tested explanation that already separates what the suggested experiment would ("512|513 tracks the
    resolved max capture size"): it tracks the quantity the suggestion moves and rules out every other one the
    suggestion keeps, so the experiment would only repeat it."""
    suggestion = conf.get("suggestion") or {}
    others = set(suggestion.get("predicted") or {}) - {suggestion.get("moves")}
    at, edges = conf.get("at") or "baseline", {t["transition"] for t in conf["transitions"]}
    for c in answer.conclusions(summary):
        if (c["run"] == at and c["transition"] in edges and c.get("tracks") == suggestion.get("moves")
                and others <= set(c.get("ruled_out") or [])):
            return f"{c['transition']} tracks {answer.the(c['label'] or c['tracks'])}"
    return None


def _confound_lines(conf: dict, prefix: str, summary: dict | None = None) -> list[str]:
    lines = [f"- {prefix}{t['text']}" for t in conf["transitions"]] or [f"- {prefix}{conf['text']}"]
    lines += [f"- {prefix}checked in this sweep: {check['text']}" for check in conf["checked"]]
    if conf["suggestion"] and summary is not None and (settled := answered(summary, conf)):
        return lines + [f"- {prefix}next experiment: none needed: the runs of this sweep already tested it ({settled}"
                        "; see Tested explanations)"]
    return lines + ([f"- {prefix}next experiment: {conf['suggestion']['text']}"] if conf["suggestion"] else [])


def confounds_block(summary: dict) -> list[str]:
    """What the baseline's boundary coincides with, what this sweep checked of it, and what to run next (after
    the checks: a run already made answers before a suggested one); each oracle's where they disagree."""
    lines = _confound_lines(summary["confounds"], "", summary)
    baseline = next((r for r in summary["runs"] if r["knob"] is None), None)
    lines += [f"- {line}" for line in explained.same_edges(summary["runs"], baseline)]
    own: dict[str, list[str]] = {}  # an oracle whose verdicts are the combined ones: said above
    for name, found in (summary.get("oracles") or {}).items():
        if not combined(summary, name):
            for line in _confound_lines(found["confounds"], "", summary):
                own.setdefault(line.removeprefix("- "), []).append(name)
    return lines + [f"- {line}" for line in once(own)]


def markdown(summary: dict, plots: list[str], links: Links | None = None, per_length: bool = True,
             repro: list[str] | None = None) -> str:
    """report.md; `per_length=False` leaves out the per-length tables (each run's description holds its own);
    `repro`: the lines that show the reproduction (repro.report_lines)."""
    lines = [f"# {answer.title(summary)}", "", *banners(summary), answer.paragraph(summary), ""]
    if found := summary.get("from_command"):  # the bug report's line: which of its flags matter
        from oneknob.explain.from_command_text import lines as from_command_lines

        lines += ["## The reporter's flags", "", *from_command_lines(found), ""]
    if found := summary.get("bisect"):
        from oneknob.explain.bisect_text import sentences

        lines += ["## Bisect", ""] + [line if line.startswith("  ") else f"- {line}" for line in sentences(found)]
        lines += [""]
    lines += header_lines(summary, links)
    if tested := answer.conclusion_lines(summary):  # the anchor's opens the report; its follow-ups: the knobs
        count = sum(not line.startswith("  ") for line in tested)  # oracles that concluded the same: once
        lines += ["", "## Tested explanations", "", *details(
            f"What each run's edges track, tested by the runs one knob apart ({count})",
            [line if line.startswith("  ") else f"- {line}" for line in tested])]
    lines += ["", "## What each knob did", ""] + [f"- {line}" for line in [
        *findings(summary), *oracle_findings(summary), *oracle_versus_lines(summary), *explained_lines(summary),
        *warnings_text.finding_lines(summary)]]
    at = "the baseline" if summary["confounds"]["at"] in (None, "baseline") else summary["confounds"]["at"]
    lines += ["", f"## Coincidences at {at}", ""]
    settled = answer.settled(summary)  # a tested explanation answers what these coincidences ask
    lines += details(f"What {at}'s edges coincide with, before the tests ({settled})", confounds_block(summary)) \
        if settled else confounds_block(summary)
    if summary.get("steps"):
        lines += ["", "## Prefill steps", ""] + [f"- {line}" for line in summary["steps"]]
    lines += ["", "## Runs", "", *runs_table(summary, links)]
    lines += ["", "## Notes", ""] + [f"- {note}" for note in [*summary["notes"], summary["predictions"]["text"]]]
    if plots:
        image = links.image if links else (lambda name: name)
        lines += ["", "## Plots", ""] + [f"![{name.rsplit('.', 1)[0]}]({image(name)})" for name in plots]
    if repro:
        lines += ["", *repro]
    if block := transitions_block(summary):
        lines += ["", *block]
    if per_length:
        lines += ["", *per_length_lines(summary, links)]
    return "\n".join(lines).rstrip("\n") + "\n"


def open_lines(text: str) -> list[str]:
    """The lines of a report outside its <details> blocks: what a reader sees before unfolding anything."""
    shown, depth = [], 0
    for line in text.splitlines():
        if line.startswith("<details>"):
            depth += 1
        elif line.startswith("</details>"):
            depth -= 1
        elif depth == 0:
            shown.append(line)
    return shown
