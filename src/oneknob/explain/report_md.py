"""report.md: what a vLLM engineer pastes into an issue as is, and the sweep's MLflow description.

    header       what was compared, on what, how to reproduce it, the banners (report_header.py)
    result       what the boundary tracks, and what each variant did to the baseline's transitions
    transitions  each run's, in words
    confounds    at the baseline, once
    runs         one row per run
    notes, plots
    per length   each run's `prompt tokens | mean NLL | NLL ref | delta | verdict`, samples aggregated

The part read in a minute comes first, the tables last. Plain Markdown (MLflow's description renderer drops
<details>). A pure function of the
summary (analysis.summarize over compare.load_run's records), so a report rebuilt from MLflow is the same
text; `links` turns run ids and plot files into MLflow UI routes for the run's description.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from oneknob.explain import axis_text
from oneknob.explain import explained
from oneknob.explain import oracle_views
from oneknob.explain import warnings_text
from oneknob.explain.report_header import EMULATED, SIMULATION, header_lines, show  # noqa: F401  (banners, for callers)
from oneknob.verdict.search import DOWN, Transition
from oneknob.record.tags import EMULATED_TEXT
from oneknob.verdict.judge import samples_text, tolerance_text

RESOLVED_COLUMNS = (("capture", "max_capture_size"), ("graphs", "cudagraph_mode"), ("K", "spec_k"),
                    ("seqs", "max_num_seqs"), ("runner", "runner"))
LENGTH_HEADER = "| prompt tokens | mean NLL | NLL ref | delta | verdict |"
@dataclass(frozen=True)
class Links:
    """How the MLflow description links: a run id to its page, a plot file to the parent's artifact."""

    run: Callable[[str], str]
    image: Callable[[str], str]
    overlay: str | None = None  # the UI page of the runs' nll against prompt length, overlaid


def nll(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _short(record: dict) -> str:
    t = Transition.from_dict(record)
    return f"{t.text} {'p->c' if t.direction == DOWN else 'c->p'}{'' if t.resolved else ' (unresolved)'}"


def transitions_cell(run: dict) -> str:
    """Every transition of a run, short: "512|513 p->c", "299|300 c->p, 400|401 p->c", "510..513 p->c
    (unresolved)"; each oracle's, named, where they disagree ("nll: none (all clean); greedy/decode: 284|285
    c->p")."""
    if run.get("shape") and oracle_views.disagree(run):
        cells = []
        for names in oracle_views.groups(run):
            seen = oracle_views.view(run, names[0]) | {"oracles": {}, "shape": run["oracle_results"][names[0]]["shape"]}
            cells.append(f"{'/'.join(names)}: {transitions_cell(seen)}")
        return "; ".join(cells)
    if not run["transitions"]:
        if not run["points"] or not run["shape"]:  # nothing measured, or a search that did not finish
            return "-"
        return {"all clean": "none (all clean)", "all polluted": "none (all polluted)"}.get(run["shape"], "none")
    return ", ".join(_short(record) for record in run["transitions"])


def graphs_cell(run: dict) -> str:
    mode = show(run["resolved"].get("cudagraph_mode"))
    return f"{mode}, {EMULATED_TEXT}" if run.get("emulated") and mode != "NONE" else mode


def rows(summary: dict) -> list[dict[str, Any]]:
    """One row per run: cells as text, plus which resolved cells differ from the baseline's."""
    out = []
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
        changed = {column for column, field in RESOLVED_COLUMNS if field in run["changed"]}
        out.append({"cells": cells, "changed": changed, "run_id": run["run_id"]})
    return out


def findings(summary: dict) -> list[str]:
    """What the boundary tracks, per knob and overall. A knob with too few boundaries for a claim whose runs all
    say what they did to the baseline's transitions (versus_lines: cleared, moved, ...) is left to those lines."""
    told = {r["knob"] for r in summary["runs"] if r["knob"] and r.get("versus_baseline")}
    told -= {r["knob"] for r in summary["runs"] if r["knob"] and not r.get("versus_baseline")}
    lines = [f"{knob}: {detail['text']}" + (f" (conflicts with {', '.join(detail['conflicts_with'])}'s claim)"
                                             if detail.get("conflicts_with") else "")
             for knob, detail in summary["tracks_detail"].items()
             if not (detail.get("reason") == "too_few_boundaries" and knob in told)]
    if summary.get("conflict"):
        lines.append(summary["conflict"]["text"])
    if len(summary["tracks_detail"]) > 1 or not summary["tracks_detail"]:
        lines.append(f"all measured runs together: {summary['overall']['text']}")
    for detail in [*summary["tracks_detail"].values(), summary["overall"]]:
        if detail["quantity"] and detail.get("caveat") and f"caveat: {detail['caveat']}" not in lines:
            lines.append(f"caveat: {detail['caveat']}")
    return lines


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


def oracle_findings(summary: dict) -> list[str]:
    """What each oracle's transitions track, where the oracles disagree (analysis: summary["oracles"])."""
    lines = []
    for name, found in (summary.get("oracles") or {}).items():
        lines += [f"{name}: {knob}: {detail['text']}" for knob, detail in found["tracks_detail"].items()
                  if detail.get("reason") != "too_few_boundaries"]
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
        for name in oracle_views.asked(run):
            lines += [f"  - {name}: " + "; ".join([Transition.from_dict(r).describe(), *_qualifiers(r),
                                                    *_decode_qualifiers(r)])
                      for r in run["oracles"][name]["transitions"]]
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


# -- the body -----------------------------------------------------------------------------------------------

def _run_ref(run_id: str, links: Links | None, text: str | None = None) -> str:
    return f"[{text or run_id}]({links.run(run_id)})" if links else f"`{run_id}`"


def runs_table(summary: dict, links: Links | None) -> list[str]:
    columns = ("run", "transitions", "vs baseline", *(c for c, _ in RESOLVED_COLUMNS), "status")
    lines = ["| " + " | ".join((*columns, "MLflow run")) + " |", "|" + "---|" * (len(columns) + 1)]
    for row in rows(summary):
        text = {c: row["cells"][c].replace("|", "\\|") for c in columns}  # a boundary "512|513" in a table
        cells = [f"**{text[c]}**" if c in row["changed"] else text[c] for c in columns]
        lines.append("| " + " | ".join([*cells, _run_ref(row["run_id"], links)]) + " |")
    return lines + ["", "Bold: the resolved value differs from the baseline's. p->c: polluted->clean, c->p: "
                        "clean->polluted; lo..hi: not narrowed to adjacent lengths."]


def length_table(run: dict) -> list[str]:
    """The seed's table: one row per measured length (grid and bisection), samples aggregated; bold: the
    lengths on either side of a transition."""
    edges = {L for record in run["transitions"] for L in (record["lo"], record["hi"])}
    axis = axis_text.axis_of(run)
    header, extra = LENGTH_HEADER, ""
    if axis.name != "length":  # the first column names the axis; batch adds its step, repeat its agreement
        header = LENGTH_HEADER.replace("prompt tokens", axis.column)
        header += " tokens per step | schedule |" if axis.name == "batch" else " agreement |"
        extra = "---:|---|" if axis.name == "batch" else "---|"
    decode = run.get("decode") or {}
    if decode:  # the decode oracles (verdict.decode): each oracle's verdict, the continuation's agreement
        header += " oracles | greedy match | first divergent position | decode mean / max abs delta |"
        extra += "---|---:|---:|---:|"
    lines = [header, "|---:|---:|---:|---:|---|" + extra]
    labels = run.get("schedule_labels") or {}
    for p in run["points"]:
        delta = p.get("delta_nll")
        if delta is None and p.get("nll_ref") is not None:
            delta = p["nll"] - p["nll_ref"]
        verdict = "-" if p["polluted"] is None else "polluted" if p["polluted"] else "clean"
        if p["polluted"] and run.get("samples") and p.get("polluted_samples") is not None \
                and p["polluted_samples"] < run["samples"]:
            verdict = samples_text(p["polluted_samples"], run["samples"])
        length = f"**{p['length']}**" if p["length"] in edges else str(p["length"])
        row = (f"| {length} | {nll(p['nll'])} | {nll(p.get('nll_ref'))} | "
               f"{'-' if delta is None else f'{delta:+.3f}'} | {verdict} |")
        if axis.name == "batch":
            scheduled = labels.get(str(p["length"])) or ("co-scheduled" if p.get("co_scheduled") else "-")
            row += f" {p.get('step_tokens', '-')} | {scheduled} |"
        elif axis.name == "repeat":
            row += f" {axis_text.agreement_cell(p)} |"
        if decode:
            row += decode_cells(run, p["length"], decode.get(p["length"], {}))
        lines.append(row)
    return lines


def decode_cells(run: dict, length: int, values: dict) -> str:
    """A per-length row's oracle cells: "nll clean, greedy polluted", the greedy match, the first divergent token
    position (the length + the offset), the decode mean / max |delta logprob|."""
    verdicts = ", ".join(f"{name} {'polluted' if record['verdicts'][length] else 'clean'}"
                         for name, record in (run.get("oracles") or {}).items() if length in record["verdicts"])
    match = values.get("greedy_match")
    offsets = [o for key in ("greedy_first_divergence", "decode_first_deviation")
               if (o := values.get(key)) is not None and o >= 0]
    first = str(length + int(min(offsets))) if offsets else "-"
    delta = (f"{values['decode_delta']:.4f} / {values['decode_max_delta']:.4f}"
             if values.get("decode_delta") is not None else "-")
    return f" {verdicts or '-'} | {'-' if match is None else f'{match:.3f}'} | {first} | {delta} |"


def run_section(run: dict, links: Links | None, summary: dict | None = None) -> list[str]:
    """One run: its heading, what it did to the baseline's transitions, its engine warnings (those not every run
    of `summary` has), its per-length table."""
    emulated = f", {EMULATED_TEXT}" if run.get("emulated") else ""
    lines = [f"### {run['name']}: {transitions_cell(run)}", "",
             f"Status {run['status']}{emulated}; MLflow run {_run_ref(run['run_id'], links)}.", ""]
    if versus := run.get("versus_baseline"):
        lines += [f"Versus the baseline: {versus['text']}.", ""]
    if suspects := run.get("suspects"):
        said = ", ".join(f"{L} ({', '.join(why)})" for L, why in suspects.items())
        what = "lengths" if run.get("axis", "length") == "length" else f"points ({axis_text.axis_of(run).unit})"
        lines += [f"Suspect {what} probed beside the grid (q - 1, q and q + 1 of each candidate threshold q, "
                  f"counted in the probe budget): {said}.", ""]
    if per_length := run.get("reference_per_length"):
        lines += [f"Reference: {per_length}.", ""]
    if summary is None and (warnings := run.get("engine_warnings")):
        lines += ["Engine warnings (from the worker's log):", "", "```", *warnings, "```", ""]
    elif warnings := ((summary or {}).get("engine_warnings") or {}).get("only_in", {}).get(run["name"]):
        lines += ["Engine warnings in this run's worker log that not every run has (those every run has: the "
                  "header):", "", "```", *warnings, "```", ""]
    return lines + (length_table(run) if run["points"] else ["Nothing measured."]) + [""]


def explained_lines(summary: dict) -> list[str]:
    """Each run with an edge the baseline lacks: what its transitions coincide with, in its terms (explained.py);
    not a run whose knob's edges the Result already claims to track a quantity."""
    claimed = {knob for knob, detail in summary["tracks_detail"].items() if detail.get("quantity")}
    return [f"explained: {line}" for line in explained.new_edges([r for r in summary["runs"]
                                                                  if r["knob"] not in claimed])]


def confounds_lines(summary: dict) -> list[str]:
    lines = _confound_lines(summary["confounds"], "")
    baseline = next((r for r in summary["runs"] if r["knob"] is None), None)
    lines += [f"- {line}" for line in explained.same_edges(summary["runs"], baseline)]
    for name, found in (summary.get("oracles") or {}).items():  # where the oracles disagree: each one's own
        lines += _confound_lines(found["confounds"], f"{name}: ")
    return lines


def _confound_lines(conf: dict, prefix: str) -> list[str]:
    lines = [f"- {prefix}{t['text']}" for t in conf["transitions"]] or [f"- {prefix}{conf['text']}"]
    if conf["suggestion"]:
        lines.append(f"- {prefix}next experiment: {conf['suggestion']['text']}")
    return lines + [f"- {prefix}checked in this sweep: {check['text']}" for check in conf["checked"]]


PER_LENGTH = "## Per prompt length"


def per_length_lines(summary: dict, links: Links | None) -> list[str]:
    samples = next((r["samples"] for r in summary["runs"] if r.get("samples")), None)
    lines = [PER_LENGTH, "", f"Mean over {samples or 'the'} sample(s) per length; NLL ref: the reference's; "
             "delta = mean NLL - NLL ref; bold: the lengths on either side of a transition.", ""]
    for run in summary["runs"]:
        lines += run_section(run, links, summary)
    return lines


def markdown(summary: dict, plots: list[str], links: Links | None = None, per_length: bool = True) -> str:
    """report.md; `per_length=False` leaves out the per-length tables (each run's description holds its own)."""
    title = f"sweep `{summary['sweep_id']}`" if summary["sweep_id"] else "selected runs"
    varied = ", ".join(dict.fromkeys(r["knob"] for r in summary["runs"] if r["knob"])) or "the baseline"
    lines = [f"# oneknob: {varied} ({title})", ""]
    if found := summary.get("from_command"):  # the bug report's line first: which of its flags matter
        from oneknob.explain.from_command_text import lines as from_command_lines

        lines += ["## The reporter's flags", "", *from_command_lines(found), ""]
    lines += header_lines(summary, links)
    if found := summary.get("bisect"):
        from oneknob.explain.bisect_text import sentences

        lines += ["", "## Bisect", ""] + [line if line.startswith("  ") else f"- {line}" for line in sentences(found)]
    tested = [f"{c['run']}: {c['text']}" for c in summary.get("conclusions") or []]  # what the runs settle
    lines += ["", "## Result", ""] + [f"- {line}" for line in [*tested, *findings(summary), *oracle_findings(summary),
                                                               *versus_lines(summary), *explained_lines(summary),
                                                               *warnings_text.finding_lines(summary)]]
    lines += ["", "## Transitions", ""]
    for run in summary["runs"]:
        if run["shape"]:
            lines += [line if line.startswith("  ") else f"- {line}" for line in transition_lines(run)]
            lines += [f"  - {line}" for line in warnings_text.run_lines(summary, run)]
    lines += ["", f"## Confounds at {summary['confounds']['at'] or 'the baseline'}", "", *confounds_lines(summary)]
    if summary.get("steps"):
        lines += ["", "## Prefill steps", ""] + [f"- {line}" for line in summary["steps"]]
    lines += ["", "## Runs", "", *runs_table(summary, links)]
    lines += ["", "## Notes", ""] + [f"- {note}" for note in [*summary["notes"], summary["predictions"]["text"]]]
    if plots:
        image = links.image if links else (lambda name: name)
        lines += ["", "## Plots", ""] + [f"![{name.rsplit('.', 1)[0]}]({image(name)})" for name in plots]
    if per_length:
        lines += ["", *per_length_lines(summary, links)]
    return "\n".join(lines).rstrip("\n") + "\n"
