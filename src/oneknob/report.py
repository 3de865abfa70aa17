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

from oneknob.explain import analysis, compare
from oneknob.explain.report import write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oneknob.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", metavar="ID", help="a sweep id (default: the latest sweep)")
    parser.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else ./mlruns/mlflow.db")
    parser.add_argument("--experiment", help="the MLflow experiment to look in (default: any)")
    parser.add_argument("--out", help="also write summary.json, report.md and the plots into this directory")
    args = parser.parse_args(argv)
    if args.out:
        from oneknob import files

        try:
            files.check_dir_place(Path(args.out))
        except OSError as exc:
            print(f"report: --out {args.out}: cannot write there ({exc.strerror or exc}); give a writable "
                  "directory", file=sys.stderr)
            return 2
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
