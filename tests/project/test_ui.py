"""The MLflow UI as a user meets it after a sweep, in a real browser: headless Chromium on a real tracking server.

Same flow as scripts/ui_screenshot.py (which made docs/ui_runs.png and docs/ui_compare.png): a small
synthetic sweep against the server, then the three pages the sweep's output and descriptions lead to: the
experiment's runs table (not MLflow's GenAI overview), the URL the sweep prints at its end (nll against the
step, i.e. the prompt length, every run overlaid), and the parent run's page, whose description is the report
with its plots. The rendered DOM must hold what the picture shows, and the screenshot must be a real picture.
"""

import importlib.util
import re
import struct

import numpy as np
import pytest
from helpers import run_cli
from mlflow_server import experiment, mlflow_server  # noqa: F401  (fixtures)

from oneknob.explain import mlflow_ui
from oneknob.config.schema import REPO_ROOT

_spec = importlib.util.spec_from_file_location("ui_screenshot", REPO_ROOT / "scripts" / "ui_screenshot.py")
ui = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ui)

pytestmark = pytest.mark.slow  # make test installs chromium first (make test-deps); never skipped


@pytest.fixture(scope="module", autouse=True)
def browser():
    if ui.chromium() is None:
        pytest.fail("chromium is not installed: `make test-deps` (or apt-get install -y chromium) installs it")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, mlflow_server):  # noqa: F811
    tmp_path = tmp_path_factory.mktemp("ui")
    name = "ui-check"
    rc, out = run_cli(tmp_path, "lengths=[200,300,600]", "samples=1", "cudagraph.capture=256,512",
                      f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={name}", multirun=True)
    assert rc == 0, out
    experiment_id, sweep_id, run_ids, parent = ui.sweep_parent(mlflow_server.uri, name)
    return {"out": out, "experiment_id": experiment_id, "run_ids": run_ids, "parent": parent, "tmp": tmp_path}


def _picture(png) -> np.ndarray:
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (2000, 1000)
    import matplotlib.image

    pixels = matplotlib.image.imread(png)[..., :3]
    colors = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colors) > 200, f"{len(colors)} colours: a blank or error page, not the UI"
    return pixels


def test_the_experiment_opens_on_its_runs_table(sweep, mlflow_server):  # noqa: F811
    url = mlflow_ui.runs_url(mlflow_server.uri, sweep["experiment_id"])
    dom = ui.rendered_dom(url)
    assert ">Run Name<" in dom and "sweep cudagraph.capture" in dom, dom[-3000:]
    assert "No data available for the selected time range" not in dom  # the GenAI overview's empty charts
    _picture(ui.screenshot(url, sweep["tmp"] / "ui_runs.png"))


def test_a_run_page_addressed_by_its_id_alone_finds_its_experiment(sweep, mlflow_server):  # noqa: F811
    """What a one-job run prints while its uploader has yet to make the experiment (oneknob.record.trail)."""
    url = mlflow_ui.run_url(mlflow_server.uri, None, sweep["parent"])
    assert url == f"{mlflow_server.uri}/#/runs/{sweep['parent']}?workflowType=machine_learning"
    dom = ui.rendered_dom(url)
    assert f"<title>Run {sweep['parent']} - MLflow</title>" in dom, dom[-3000:]
    assert "sweep cudagraph.capture" in dom, dom[-3000:]  # the run's name, on its page
    assert f"#/experiments/{sweep['experiment_id']}/runs" in dom, dom[-3000:]  # its experiment, found and linked


def test_the_parent_run_the_sweep_ends_with_links_nll_against_prompt_length_overlaid(sweep, mlflow_server):  # noqa: F811
    """The sweep's last MLflow line is its parent run's page (a short line); the report there links the runs' nll
    against prompt length, overlaid."""
    printed = re.search(r"^MLflow \(open\): (\S+)$", sweep["out"], re.M)
    assert printed and printed.group(1) == mlflow_ui.run_url(mlflow_server.uri, None, sweep["parent"]), sweep["out"]
    url = mlflow_ui.metric_url(mlflow_server.uri, sweep["experiment_id"], sweep["run_ids"])
    from mlflow.tracking import MlflowClient

    note = MlflowClient(mlflow_server.uri).get_run(sweep["parent"]).data.tags["mlflow.note.content"]
    assert f"[nll against prompt length, the runs overlaid]({url[len(mlflow_server.uri) + 1:]})" in note
    dom = ui.rendered_dom(url)
    assert "Comparing 2 Runs" in dom, dom[-3000:]
    assert "main-svg" in dom and "scatterlayer" in dom, "no chart was drawn"
    assert set(re.findall(r"(baseline|cudagraph\.capture=\d+) \(nll\)", dom)) == {"baseline", "cudagraph.capture=512"}
    assert ">Step<" in dom  # the x axis is the step, i.e. the prompt length
    pixels = _picture(ui.screenshot(url, sweep["tmp"] / "ui_compare.png"))
    chart = pixels[100:400, 500:1450]  # where the chart sits at 2000x1000
    assert (chart.std(axis=(0, 1)) > 0.05).all(), "the chart area is flat"


def test_the_parent_run_page_shows_the_report_with_its_plots(sweep, mlflow_server):  # noqa: F811
    url = mlflow_ui.run_url(mlflow_server.uri, sweep["experiment_id"], sweep["parent"])
    dom = ui.rendered_dom(url)
    (report,) = sweep["tmp"].glob("multirun/*/report.md")
    title = report.read_text().splitlines()[0].removeprefix("# ")  # the finding
    assert f"<h1>{title}</h1>" in dom and "moves it to 512|513" in title, dom[-3000:]
    assert "<strong>SIMULATION.</strong>" in dom
    assert f'<img src="get-artifact?path=nll_vs_length.png&amp;run_uuid={sweep["parent"]}"' in dom
    _picture(ui.screenshot(url, sweep["tmp"] / "ui_report.png"))
