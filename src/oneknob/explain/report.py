"""A comparison summary rendered: the terminal table, and summary.json, report.md and the plots on disk
(`python -m oneknob report` prints it from MLflow: explain/report_command.py).

Pure functions of the summary built by analysis.summarize, so a report rebuilt from MLflow is byte-for-byte
the report written at the end of the sweep. Every row carries its MLflow run id; every plot is drawn from the
same rows. report.md itself: report_md.py; the plots: plots.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from oneknob.console import say, wrap_width
from oneknob.explain import answer
from oneknob.explain import answer_followups
from oneknob.explain import plots
from oneknob.explain import repro
from oneknob.explain import report_md
from oneknob.explain import warnings_text
from oneknob.record import store
from oneknob.explain.plots import BOUNDARY_PLOT, NLL_PLOT  # noqa: F401  (the file names, for callers)
from oneknob.explain.report_md import findings, rows, transition_lines, transitions_cell  # noqa: F401

HEADERS = ("run", "transitions", "vs baseline", "differs from baseline", "NLL p", "NLL c", "status")
TABLE_WIDTH = 120  # the end-of-sweep table, whatever the terminal: report.md has every column


def _differs(row: dict) -> str:
    """The resolved fields of a run that differ from the baseline's, "capture 0, graphs NONE" (bold in report.md)."""
    found = ", ".join(f"{column} {row['cells'][column]}" for column, _ in report_md.RESOLVED_COLUMNS
                      if column in row["changed"])
    if found or row["cells"]["knob"] == "-":
        return found or "-"
    # a knob no column shows (a model field, a patch): its own short name and value
    return f"{row['cells']['knob'].rsplit('.', 1)[-1]} {row['cells']['value']}"


def _widths(cells: list[dict], width: int) -> dict[str, int] | None:
    """Column widths within `width`: every column as wide as its widest cell where that fits, else the wrapping
    columns narrowed, the widest first, down to their longest word (a name, a boundary is not cut inside) and only
    then further; None where even that does not fit (rich folds then)."""
    fixed = {h for h in HEADERS if h.startswith("NLL") or h in ("vs baseline", "status")}
    natural = {h: max([len(h), *(len(c[h]) for c in cells)]) for h in HEADERS}
    least = {h: natural[h] if h in fixed else max(len(word) for text in [h, *(c[h] for c in cells)]
                                                   for word in text.split() or [""]) for h in HEADERS}
    # each column pads 1 on its right, and a space divides two columns
    widths, excess = dict(natural), sum(natural.values()) + 2 * len(HEADERS) - 1 - width
    for floor in (least, {h: least[h] if h in fixed else min(least[h], 8) for h in HEADERS}):  # then words fold
        while excess > 0 and (room := max(HEADERS, key=lambda h: widths[h] - floor[h])):
            if widths[room] <= floor[room]:
                break
            widths[room] -= 1
            excess -= 1
    return widths if excess <= 0 else None


def table(summary: dict, width: int = TABLE_WIDTH) -> Table:
    """The terminal's table: one row per run, the resolved fields only where they differ from the baseline's."""
    title = f"sweep {summary['sweep_id']}" if summary["sweep_id"] else f"{len(summary['runs'])} run(s)"
    found = Table(title=f"{title}: boundary per run (engine {summary['engine']})", box=box.SIMPLE_HEAD,
                  show_edge=False, padding=(0, 1, 0, 0), title_justify="left")
    cells = [row["cells"] | {"differs from baseline": _differs(row), "NLL p": row["cells"]["NLL polluted"],
                             "NLL c": row["cells"]["NLL clean"]} for row in report_md.rows(summary)]
    widths = _widths(cells, width) or {}
    for header in HEADERS:
        found.add_column(header, justify="right" if header.startswith("NLL") else "left",
                         no_wrap=header.startswith("NLL") or header in ("vs baseline", "status"),
                         overflow="fold", width=widths.get(header))
    for row in cells:
        found.add_row(*(escape(row[h]) for h in HEADERS))
    return found


def legend(summary: dict) -> list[str]:
    """What the table leaves out: the baseline's resolved config, what its NLL columns are."""
    baseline = next((r for r in report_md.rows(summary) if r["cells"]["value"] == "baseline"), None)
    lines = []
    if baseline and summary["baseline"] and summary["baseline"]["resolved"]:
        lines.append("baseline resolved: " + ", ".join(f"{c} {baseline['cells'][c]}"
                                                       for c, _ in report_md.RESOLVED_COLUMNS))
    lines.append("NLL p / NLL c: mean NLL over the lengths judged polluted / clean (every column: report.md)")
    return lines + ([answer_followups.LEGEND] if answer_followups.followups(summary) else [])


def print_table(summary: dict, console: Console, shown_warnings: set[str] = frozenset(),
                printed: Iterable[str] = ()) -> None:
    """The end of a sweep on the terminal: the table (within TABLE_WIDTH columns), the answer, the notes not
    `printed` already (the sweep printed its skipped jobs as it started), the engine warnings. `shown_warnings`: the
    keys of the engine warnings already printed (by the sweep's jobs): counted, not repeated."""
    width = min(wrap_width(console), TABLE_WIDTH)
    console.print(table(summary, width), width=width)
    for line in legend(summary):
        say(console, escape(line))
    say(console, escape(answer.paragraph(summary)))
    for note in [*summary["notes"], summary["predictions"]["text"]]:
        if note not in set(printed):
            say(console, f"[yellow]note:[/] {escape(note)}")
    for line in warnings_text.terminal_lines(summary, shown_warnings):
        say(console, f"[yellow]{escape(line)}[/]")


def tolerance(summary: dict) -> float | None:
    """verdict.tol_nll as the runs recorded it (the band the nll plot shades)."""
    value = next((r["verdict"].get("tol_nll") for r in summary["runs"] if r.get("verdict")), None)
    return None if value is None else float(value)


def write(summary: dict, out: Path) -> list[Path]:
    """summary.json, the plots, report.md and (a vLLM sweep's) repro.py in `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    drawn = [plots.plot_nll(summary, out / NLL_PLOT, tolerance(summary)),
             plots.plot_boundaries(summary, out / BOUNDARY_PLOT)]
    drawn = [p for p in drawn if p]
    summary["plots"] = [p.name for p in drawn]
    store.write_json_atomic(out / "summary.json", summary)
    reproduction = repro.write(summary, out)
    (out / "report.md").write_text(report_md.markdown(summary, [p.name for p in drawn],
                                                      repro=repro.report_lines(summary)))
    return [out / "summary.json", out / "report.md", *drawn, *reproduction]
