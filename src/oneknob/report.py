"""A comparison summary rendered: the terminal table, and summary.json, report.md and the plots on disk.

    python -m oneknob.report                        # report.md of the latest sweep, printed (paste it as is)
    python -m oneknob.report --sweep ID             # of a named sweep
    python -m oneknob.report --sweep ID --out DIR   # and summary.json, report.md and the plots in DIR

Pure functions of the summary built by analysis.summarize, so a report rebuilt from MLflow is byte-for-byte
the report written at the end of the sweep; `python -m oneknob.report` reads MLflow alone and writes nothing
there (`python -m oneknob.compare` also logs the files on the parent run). Every row carries its MLflow run
id; every plot is drawn from the same rows. report.md itself: report_md.py; the plots: plots.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from oneknob import plots, report_md, store
from oneknob.plots import BOUNDARY_PLOT, NLL_PLOT  # noqa: F401  (the file names, for callers)
from oneknob.report_md import findings, rows, transition_lines, transitions_cell  # noqa: F401

HEADERS = ("run", "knob", "value", *(c for c, _ in report_md.RESOLVED_COLUMNS), "transitions", "NLL polluted",
           "NLL clean", "status")


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
    for line in findings(summary) + report_md.versus_lines(summary):
        console.print(f"- {escape(line)}")
    console.print(f"- confounds at {summary['confounds']['at']}: {escape(summary['confounds']['text'])}")
    for check in summary["confounds"]["checked"]:
        console.print(f"  - {escape(check['text'])}")
    for note in [*summary["notes"], summary["predictions"]["text"]]:
        console.print(f"[yellow]note:[/] {escape(note)}")


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


def main(argv: list[str] | None = None) -> int:
    from oneknob import analysis, compare

    parser = argparse.ArgumentParser(prog="python -m oneknob.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", metavar="ID", help="a sweep id (default: the latest sweep)")
    parser.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else ./mlruns/mlflow.db")
    parser.add_argument("--experiment", help="the MLflow experiment to look in (default: any)")
    parser.add_argument("--out", help="also write summary.json, report.md and the plots into this directory")
    args = parser.parse_args(argv)
    try:
        client, experiment_id = compare.open_store(args.tracking_uri, args.experiment)
        meta, runs = compare.collect(client, experiment_id, sweep_id=args.sweep)
    except compare.CompareError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    summary = analysis.summarize(meta, runs)
    summary["notes"] += [f"skipped: {note}" for note in meta["skipped"]]
    with tempfile.TemporaryDirectory(prefix="oneknob-report-") as scratch:
        out = Path(args.out or scratch)  # the same files as the sweep's: the plots decide what report.md links
        write(summary, out)
        sys.stdout.write((out / "report.md").read_text())
    if args.out:
        print(f"wrote {out / 'summary.json'}, {out / 'report.md'} and the plots", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
