"""What a compared sweep leaves in the MLflow UI besides its runs, and where the UI shows them.

    describe(client, summary, plots)   the report as the parent run's description (plots shown from its
                                       artifacts, run ids linked to their pages), each job run's own section as
                                       its description, the reference the sweep measured nested under it
    where(summary, tracking_uri)       the lines a sweep ends with: the report, repro.py, the parent run's UI page
                                       (its description links `nll` against prompt length, the runs overlaid)

A reference is reused by later sweeps: it nests under the sweep that measured it, and every job's
description links to the reference it was judged against (its param `reference.run_id`).
"""

from __future__ import annotations

from pathlib import Path

from oneknob.explain import mlflow_ui
from oneknob.explain import repro
from oneknob.explain import report_md
from oneknob.explain.report_md import Links
from oneknob.explain.report_header import SIMULATION_LINE
from oneknob.config import commands

NOTE = "mlflow.note.content"  # a run's description in the MLflow UI (Markdown)
NOTE_LIMIT = 8000  # MLflow cuts a longer tag value silently
CUT = "\n\n*Cut to fit MLflow's {limit}-character description: the whole report is this run's artifact report.md.*\n"


def links(summary: dict) -> Links:
    experiment_id, parent = summary["experiment"]["id"], summary["parent_run_id"]
    measured = [r["run_id"] for r in summary["runs"] if r["points"]]
    return Links(run=lambda run_id: mlflow_ui.run_route(experiment_id, run_id),
                 image=lambda name: mlflow_ui.artifact_route(parent, name),
                 overlay=mlflow_ui.metric_route(experiment_id, measured) if measured else None)


def fit(text: str, limit: int = NOTE_LIMIT) -> str:
    """The text, or its longest prefix that ends before a heading and leaves room to say it was cut."""
    if len(text) <= limit:
        return text
    tail = CUT.format(limit=limit)
    cut = max(text.rfind("\n## ", 0, limit - len(tail)), text.rfind("\n### ", 0, limit - len(tail)))
    return text[: cut if cut > 0 else limit - len(tail)].rstrip() + tail


def parent_note(summary: dict, plots: list[str]) -> str:
    """report.md with its plots shown and run ids linked; the per-length tables, which would not fit in
    MLflow's description, are each run's own description (one click from the Runs table)."""
    text = unfolded(report_md.markdown(summary, plots, links(summary), per_length=False,
                                       repro=repro.report_lines(summary, with_script=False)))
    return fit(text + f"\n{report_md.PER_LENGTH}\n\nEach run's table is its own description: follow its link in "
                      "the Runs table above (and all of them are in this run's artifact report.md).\n")


def unfolded(text: str) -> str:
    """report.md as MLflow can show it: its description renderer drops the <details> HTML (and would show every
    block open, past its 8000 characters), so each folded block is one line naming it, in the artifact report.md."""
    lines, depth = [], 0
    for line in text.splitlines():
        if line == "<details>":
            depth += 1
        elif line == "</details>":
            depth -= 1
        elif depth == 1 and line.startswith("<summary>") and line.endswith("</summary>"):
            lines.append(f"*{line[9:-10]}: folded, in this run's artifact report.md*")
        elif depth == 0:
            lines.append(line)
    return "\n".join(lines) + "\n"


def job_note(summary: dict, run: dict) -> str:
    link = links(summary)
    said = [f"Part of sweep `{summary['sweep_id']}`: the comparison is the description of its "
            f"[parent run]({link.run(summary['parent_run_id'])})."]
    reference = (run.get("reference") or {}).get("run_id")
    if reference:
        said.append(f"Judged against the [reference run]({link.run(reference)}).")
    return fit("\n".join([" ".join(said), "", *report_md.run_section(run, link, summary)]))


def describe(client, summary: dict, plots: list[str]) -> None:
    parent = summary["parent_run_id"]
    client.set_tag(parent, NOTE, parent_note(summary, plots))
    for run in summary["runs"]:
        client.set_tag(run["run_id"], NOTE, job_note(summary, run))
    measured_here = client.search_runs(
        [summary["experiment"]["id"]], max_results=100,
        filter_string=f"tags.`oneknob.role` = 'reference' and tags.`oneknob.sweep_id` = '{summary['sweep_id']}'")
    for reference in measured_here:
        if "mlflow.parentRunId" not in reference.data.tags:
            client.set_tag(reference.info.run_id, "mlflow.parentRunId", parent)


def where(summary: dict, tracking_uri: str | None, report: Path) -> list[str]:
    """The lines a sweep ends with: its report (and repro.py), the parent run's page in the MLflow UI (its
    description is the report, linking the runs' nll overlaid), and the SIMULATION line of the synthetic engine."""
    base = mlflow_ui.ui_base(tracking_uri)
    lines = [f"report: {report}"]
    if (report.parent / repro.SCRIPT).is_file():
        lines.append(f"repro: {report.parent / repro.SCRIPT} (vLLM alone; its last line says REPRODUCED or not)")
    if summary.get("parent_run_id"):
        how = "open"
        if base == mlflow_ui.LOCAL_UI:  # a local store: the UI runs on demand
            how = f"{commands.ui(tracking_uri)}, then open"
        page = mlflow_ui.run_url(base, None, summary["parent_run_id"])  # MLflow finds its experiment: a short line
        lines.append(f"MLflow ({how}): {page}")
    return lines + ([SIMULATION_LINE] if summary.get("engine") == "synthetic" else [])
