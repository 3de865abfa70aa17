"""A comparison summary rendered: the terminal table, and summary.json, report.md and the plots on disk
(`python -m oneknob report` prints it from MLflow: explain/report_command.py).

Pure functions of the summary built by analysis.summarize, so a report rebuilt from MLflow is byte-for-byte
the report written at the end of the sweep. Every row carries its MLflow run id; every plot is drawn from the
same rows. report.md itself: report_md.py; the plots: plots.py.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from oneknob.explain import plots
from oneknob.explain import report_md
from oneknob.explain import warnings_text
from oneknob.record import store
from oneknob.explain.plots import BOUNDARY_PLOT, NLL_PLOT  # noqa: F401  (the file names, for callers)
from oneknob.explain.report_md import findings, rows, transition_lines, transitions_cell  # noqa: F401

HEADERS = ("run", "knob", "value", *(c for c, _ in report_md.RESOLVED_COLUMNS), "transitions", "NLL polluted",
           "NLL clean", "status")


def print_table(summary: dict, console: Console, shown_warnings: set[str] = frozenset()) -> None:
    """`shown_warnings`: the keys of the engine warnings already printed (by the sweep's jobs): counted, not
    repeated."""
    title = f"sweep {summary['sweep_id']}" if summary["sweep_id"] else f"{len(summary['runs'])} run(s)"
    table = Table(title=f"{title}: boundary per run (engine {summary['engine']})",
                  caption="bold: resolved value differs from the baseline's" if summary["baseline"] else None)
    for header in HEADERS:
        table.add_column(header, justify="right" if header.startswith("NLL") else "left")
    for row in rows(summary):
        table.add_row(*(f"[bold yellow]{row['cells'][h]}[/]" if h in row["changed"] else row["cells"][h]
                        for h in HEADERS))
    console.print(table)
    for line in findings(summary) + report_md.versus_lines(summary):
        console.print(f"- {escape(line)}")
    for conclusion in summary.get("conclusions") or []:  # what the runs settle (explain.tested)
        console.print(f"- {escape(conclusion['run'])}: {escape(conclusion['text'])}")
    if not any(c["run"] == summary["confounds"]["at"] for c in summary.get("conclusions") or []):
        console.print(f"- confounds at {summary['confounds']['at']}: {escape(summary['confounds']['text'])}")
        for check in summary["confounds"]["checked"]:
            console.print(f"  - {escape(check['text'])}")
    for note in [*summary["notes"], summary["predictions"]["text"]]:
        console.print(f"[yellow]note:[/] {escape(note)}")
    for line in warnings_text.terminal_lines(summary, shown_warnings):
        console.print(f"[yellow]{escape(line)}[/]")


def tolerance(summary: dict) -> float | None:
    """verdict.tol_nll as the runs recorded it (the band the nll plot shades)."""
    value = next((r["verdict"].get("tol_nll") for r in summary["runs"] if r.get("verdict")), None)
    return None if value is None else float(value)


def write(summary: dict, out: Path) -> list[Path]:
    """summary.json, the plots and report.md in `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    drawn = [plots.plot_nll(summary, out / NLL_PLOT, tolerance(summary)),
             plots.plot_boundaries(summary, out / BOUNDARY_PLOT)]
    drawn = [p for p in drawn if p]
    summary["plots"] = [p.name for p in drawn]
    store.write_json_atomic(out / "summary.json", summary)
    (out / "report.md").write_text(report_md.markdown(summary, [p.name for p in drawn]))
    return [out / "summary.json", out / "report.md", *drawn]
