"""Rendering of a comparison summary: the terminal table, summary.json, report.md and two plots.

Pure functions of the summary built by analysis.summarize, so a report rebuilt
from MLflow is byte-for-byte the report written at the end of the sweep.
Every row carries its MLflow run id; every plot is drawn from the same rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from oneknob import confounds, store
from oneknob.search import DOWN, Transition, relation_text
from oneknob.verdict import samples_text, tolerance_text

RESOLVED_COLUMNS = (("capture", "max_capture_size"), ("graphs", "cudagraph_mode"), ("K", "spec_k"),
                    ("seqs", "max_num_seqs"), ("runner", "runner"))
HEADERS = ("run", "knob", "value", *(c for c, _ in RESOLVED_COLUMNS), "transitions", "NLL polluted", "NLL clean",
           "status")
NLL_PLOT, BOUNDARY_PLOT = "nll_vs_length.png", "boundary_vs_knob.png"


def _show(value: Any) -> str:
    return "null" if value is None else value if isinstance(value, str) else json.dumps(value)


def _nll(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def transitions_cell(run: dict) -> str:
    """Every transition of a run, short: "512|513 p->c", "299|300 c->p, 400|401 p->c",
    "510..513 p->c (unresolved)"."""
    if not run["transitions"]:
        if not run["points"] or not run["shape"]:  # nothing measured, or a search that did not finish
            return "-"
        return {"all clean": "none (all clean)", "all polluted": "none (all polluted)"}.get(run["shape"], "none")
    cells = []
    for record in run["transitions"]:
        t = Transition.from_dict(record)
        cells.append(f"{t.text} {'p->c' if t.direction == DOWN else 'c->p'}{'' if t.resolved else ' (unresolved)'}")
    return ", ".join(cells)


def rows(summary: dict) -> list[dict[str, Any]]:
    """One row per run: cells as text, plus which resolved cells differ from the baseline's."""
    out = []
    for run in summary["runs"]:
        status = run["status"] + (" (pinned)" if run["pinned"] else "")
        cells = {"run": run["name"], "knob": run["knob"] or "-",
                 "value": "baseline" if run["knob"] is None else _show(run["value"]),
                 **{column: _show(run["resolved"].get(field)) if run["resolved"] else "-"
                    for column, field in RESOLVED_COLUMNS},
                 "transitions": transitions_cell(run), "NLL polluted": _nll(run["nll_polluted"]),
                 "NLL clean": _nll(run["nll_clean"]), "status": status}
        changed = {column for column, field in RESOLVED_COLUMNS if field in run["changed"]}
        out.append({"cells": cells, "changed": changed, "run_id": run["run_id"]})
    return out


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


def transition_lines(run: dict) -> list[str]:
    """What the report says of one run's transitions: one line, or the shape and then each transition."""
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
    return lines


def print_table(summary: dict, console: Console) -> None:
    title = f"sweep {summary['sweep_id']}" if summary["sweep_id"] else f"{len(summary['runs'])} run(s)"
    table = Table(title=f"{title}: boundary per run (engine {summary['engine']})",
                  caption="bold: resolved value differs from the baseline's" if summary["baseline"] else None)
    for header in HEADERS:
        table.add_column(header, justify="right" if header.startswith("NLL") else "left")
    for row in rows(summary):
        table.add_row(*(f"[bold yellow]{row['cells'][h]}[/]" if h in row["changed"] else row["cells"][h]
                        for h in HEADERS))
    console.print(table)
    for line in findings(summary):
        console.print(f"- {escape(line)}")
    console.print(f"- confounds at {summary['confounds']['at']}: {escape(summary['confounds']['text'])}")
    for check in summary["confounds"]["checked"]:
        console.print(f"  - {escape(check['text'])}")
    for note in [*summary["notes"], summary["predictions"]["text"]]:
        console.print(f"[yellow]note:[/] {escape(note)}")


def findings(summary: dict) -> list[str]:
    lines = [f"{knob}: {detail['text']}" + (f" (conflicts with {', '.join(detail['conflicts_with'])}'s claim)"
                                             if detail.get("conflicts_with") else "")
             for knob, detail in summary["tracks_detail"].items()]
    if summary.get("conflict"):
        lines.append(summary["conflict"]["text"])
    if len(summary["tracks_detail"]) > 1 or not summary["tracks_detail"]:
        lines.append(f"all measured runs together: {summary['overall']['text']}")
    for detail in [*summary["tracks_detail"].values(), summary["overall"]]:
        if detail["quantity"] and detail.get("caveat") and f"caveat: {detail['caveat']}" not in lines:
            lines.append(f"caveat: {detail['caveat']}")
    return lines


def markdown(summary: dict, plots: list[str]) -> str:
    conf = summary["confounds"]
    lines = [f"# oneknob comparison: {'sweep ' + summary['sweep_id'] if summary['sweep_id'] else 'selected runs'}",
             ""]
    if summary["parent_run_id"]:
        lines.append(f"- parent run `{summary['parent_run_id']}`")
    if summary["command"]:
        lines.append(f"- command: `{summary['command']}`")
    lines.append(f"- engine: `{summary['engine']}`")
    if summary["baseline"]:
        lines.append(f"- baseline knobs: `{json.dumps(summary['baseline']['requested'])}`")
    lines += ["", "## What the boundary tracks", ""] + [f"- {line}" for line in findings(summary)]
    lines += ["", "## Runs", "", "| " + " | ".join((*HEADERS, "MLflow run")) + " |",
              "|" + "---|" * (len(HEADERS) + 1)]
    for row in rows(summary):
        text = {h: row["cells"][h].replace("|", "\\|") for h in HEADERS}  # a boundary "512|513" in a table
        cells = [f"**{text[h]}**" if h in row["changed"] else text[h] for h in HEADERS]
        lines.append("| " + " | ".join([*cells, f"`{row['run_id']}`"]) + " |")
    lines += ["", "Bold: resolved value differs from the baseline's. Transitions: lo|hi p->c (polluted->clean) "
              "or c->p (clean->polluted); lo..hi when unresolved. NLL polluted / clean: mean prompt NLL over "
              "the measured lengths with that verdict.", "", "## Transitions", ""]
    for run in summary["runs"]:
        if run["shape"]:
            lines += [f"- {line}" if not line.startswith("  ") else line for line in transition_lines(run)]
    lines += ["", f"## Confounds at {conf['at'] or 'the baseline'}", ""]
    lines += [f"- {t['text']}" for t in conf["transitions"]] or [conf["text"]]
    if conf["coinciding"]:
        lines += [f"- coinciding: {', '.join(conf['labels'])}", f"- ambiguous: {str(conf['ambiguous']).lower()}"]
    if conf["suggestion"]:
        lines.append(f"- next experiment: {conf['suggestion']['text']}")
    lines += [f"- checked in this sweep: {check['text']}" for check in conf["checked"]]
    lines += ["", "## Notes", ""] + [f"- {note}" for note in summary["notes"]]
    lines.append(f"- {summary['predictions']['text']}")
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _figure(n: int, ncols: int, size: tuple[float, float]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return plt, fig, list(axes.flat)


def plot_nll(summary: dict, path: Path) -> Path | None:
    runs = [r for r in summary["runs"] if r["points"]]
    if not runs:
        return None
    plt, fig, axes = _figure(len(runs), min(3, len(runs)), (5.0, 3.4))
    for ax, run in zip(axes, runs):
        lengths = [p["length"] for p in run["points"]]
        ax.plot(lengths, [p["nll"] for p in run["points"]], "o-", ms=3, label="NLL")
        if any(p["nll_ref"] is not None for p in run["points"]):
            ax.plot(lengths, [p["nll_ref"] for p in run["points"]], "--", color="gray", label="NLL_ref")
        bad = [p for p in run["points"] if p["polluted"]]
        ax.plot([p["length"] for p in bad], [p["nll"] for p in bad], "x", color="red", label="polluted")
        for i, record in enumerate(run["transitions"]):
            t = Transition.from_dict(record)
            ax.axvline((t.lo + t.hi) / 2, color="red", ls=":", label="transitions" if i == 0 else None)
        ax.set_title(f"{run['name']} ({run['status']})", fontsize=9)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("mean NLL (nats)")
        ax.legend(fontsize=7)
    return _save(plt, fig, path)


def plot_boundaries(summary: dict, path: Path) -> Path | None:
    knobs = list(summary["tracks_detail"])
    if not knobs:
        return None
    baseline = next((r for r in summary["runs"] if r["knob"] is None and r["points"]), None)
    plt, fig, axes = _figure(len(knobs), min(3, len(knobs)), (4.2, 3.2))
    for ax, knob in zip(axes, knobs):
        series = ([(f"{_show(baseline['requested'].get(knob))} (base)", baseline)] if baseline else []) + \
                 [(_show(r["value"]), r) for r in summary["runs"] if r["knob"] == knob and r["points"]]
        detail = summary["tracks_detail"][knob]
        relation = detail.get("relation") or "lo"
        xs = list(range(len(series)))
        ys = [_side(r, relation) for _, r in series]
        ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], "o",
                color="red", label=relation_text(relation) if detail.get("relation") else "first transition (lo)")
        for x, y in zip(xs, ys):
            if y is None:
                ax.plot(x, 0, "x", color="green")
                ax.annotate("none", (x, 0), textcoords="offset points", xytext=(4, 4), fontsize=8)
        quantity = detail["quantity"] or summary["overall"]["quantity"]
        if quantity:
            ax.plot(xs, [confounds.derived_quantities(r["resolved"]).get(quantity) for _, r in series], "--",
                    color="gray", label=confounds.label(quantity))
        ax.set_xticks(xs, [label for label, _ in series], fontsize=8)
        ax.set_xlim(-0.5, len(xs) - 0.5)
        ax.set_ylim(-20, max([y for y in ys if y is not None] + [256]) * 1.2)
        ax.set_title(knob, fontsize=9)
        ax.set_ylabel("boundary (prompt length)")
        ax.legend(fontsize=7)
    return _save(plt, fig, path)


def _side(run: dict, relation: str) -> int | None:
    """The `relation` side of the run's first transition that has one ("lo": the first transition's lo)."""
    for record in run["transitions"]:
        t = Transition.from_dict(record)
        if relation == "lo":
            return t.lo
        if relation in t.relations() and t.resolved:
            return t.relations()[relation]
    return None


def write(summary: dict, out: Path) -> list[Path]:
    """summary.json, the plots and report.md in `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    plots = [p for p in (plot_nll(summary, out / NLL_PLOT), plot_boundaries(summary, out / BOUNDARY_PLOT)) if p]
    summary["plots"] = [p.name for p in plots]
    store.write_json_atomic(out / "summary.json", summary)
    (out / "report.md").write_text(markdown(summary, [p.name for p in plots]))
    return [out / "summary.json", out / "report.md", *plots]
