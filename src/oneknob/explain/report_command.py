"""`python -m oneknob report`: a sweep's report.md, rebuilt from MLflow and printed (paste it into an issue).

    python -m oneknob report                        # report.md of the latest sweep, printed (paste it as is)
    python -m oneknob report --sweep ID             # of a named sweep
    python -m oneknob report --sweep ID --out DIR   # and summary.json, report.md and the plots in DIR

The summary is analysis.summarize's of the runs MLflow holds, rendered by report.write, so the report rebuilt
here is byte-for-byte the one written at the end of the sweep. It reads MLflow alone and writes nothing there
(`python -m oneknob compare` also logs the files on the parent run).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from oneknob.explain import analysis, compare
from oneknob.explain.report import write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oneknob report", description=__doc__.split("\n\n")[0])
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

