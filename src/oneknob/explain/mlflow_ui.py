"""Addresses of MLflow UI pages: what a sweep prints at its end and what its MLflow notes link to.

The UI is MLflow's own: `make ui` serves the local store on http://127.0.0.1:5000, and a tracking server
(`tracking.uri=http://...`) serves its own. Its pages are hash routes of MLflow 3's single-page app;
`workflowType=machine_learning` opens MLflow's "model training" side (runs, metrics) rather than its GenAI
side (traces), which is where MLflow 3.17 lands otherwise, whatever the experiment's kind tag says.

    runs_url(base, experiment_id)                     the experiment's runs table
    run_url(base, experiment_id, run_id)              one run's page (its description: the report);
                                                      experiment_id None: MLflow finds it from the run
    metric_url(base, experiment_id, run_ids)          nll against the step (= prompt length), runs overlaid
"""

from __future__ import annotations

import json
import urllib.parse

LOCAL_UI = "http://127.0.0.1:5000"  # make ui
TRAINING = "workflowType=machine_learning"


def ui_base(tracking_uri: str | None) -> str:
    """The UI that shows this store: the server itself for an http(s) store, else `make ui`'s address."""
    if tracking_uri and tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return LOCAL_UI


def runs_url(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs?{TRAINING}"


def run_route(experiment_id: str | None, run_id: str) -> str:
    """A run's page, relative: what a link inside an MLflow note needs. Without the experiment (a one-job run
    whose uploader has yet to make it, oneknob.record.trail) MLflow's /runs/<id> route finds it."""
    if experiment_id is None:
        return f"#/runs/{run_id}?{TRAINING}"
    return f"#/experiments/{experiment_id}/runs/{run_id}?{TRAINING}"


def run_url(base: str, experiment_id: str | None, run_id: str) -> str:
    return f"{base}/{run_route(experiment_id, run_id)}"


def artifact_route(run_id: str, path: str) -> str:
    """A run's artifact as the UI serves it, relative: an image inside an MLflow note."""
    return f"get-artifact?path={urllib.parse.quote(path)}&run_uuid={run_id}"


def metric_route(experiment_id: str, run_ids: list[str], metrics: tuple[str, ...] = ("nll",)) -> str:
    """MLflow 3's metric page for several runs (Utils.getMetricPageRoute in the UI's sources; it parses
    every one of these keys, and `runs` must come first)."""
    query = {"runs": json.dumps(run_ids), "metric": json.dumps(metrics[0]), "experiments": json.dumps([experiment_id]),
             "plot_metric_keys": json.dumps(list(metrics)), "plot_layout": "{}", "x_axis": "step",
             "y_axis_scale": "linear", "line_smoothness": "1", "show_point": "true", "deselected_curves": "[]",
             "last_linear_y_axis_range": "[]"}
    encoded = "&".join(f"{k}={urllib.parse.quote(v, safe='')}" for k, v in query.items())
    return f"#/metric/{urllib.parse.quote(metrics[0])}?{encoded}&{TRAINING}"


def metric_url(base: str, experiment_id: str, run_ids: list[str], metrics: tuple[str, ...] = ("nll",)) -> str:
    return f"{base}/{metric_route(experiment_id, run_ids, metrics)}"
