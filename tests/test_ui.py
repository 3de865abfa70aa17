"""The MLflow UI shows a sweep's boundary shift: headless Chromium on a real tracking server.

Same flow as scripts/ui_screenshot.py (which made docs/ui_compare.png): a small
synthetic sweep against the server, then the metric view of its runs (nll and
nll_ref against the step, i.e. the prompt length). The rendered DOM must hold
the chart with one line per run and metric, and the screenshot must be a real
picture, not a blank page.
"""

import importlib.util
import re
import struct

import numpy as np
import pytest
from helpers import run_cli
from mlflow_server import experiment, mlflow_server  # noqa: F401  (fixtures)

from oneknob.config import REPO_ROOT

_spec = importlib.util.spec_from_file_location("ui_screenshot", REPO_ROOT / "scripts" / "ui_screenshot.py")
ui = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ui)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(ui.chromium() is None,
                       reason="chromium is not installed (apt-get install -y chromium): the UI check needs a browser"),
]


def test_comparison_view_draws_nll_against_prompt_length(tmp_path, mlflow_server, experiment):  # noqa: F811
    rc, out = run_cli(tmp_path, "lengths=[200,300,600]", "samples=1", "cudagraph.capture=256,512",
                      f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={experiment}", multirun=True)
    assert rc == 0, out
    experiment_id, _, run_ids = ui.sweep_runs(mlflow_server.uri, experiment)
    assert len(run_ids) == 2
    url = ui.compare_url(mlflow_server.uri, experiment_id, run_ids)

    dom = ui.rendered_dom(url)
    assert "Comparing 2 Runs" in dom, dom[-3000:]
    assert "main-svg" in dom and "scatterlayer" in dom, "no chart was drawn"
    legends = set(re.findall(r"cudagraph\.capture=(\d+) \((nll|nll_ref)\)", dom))
    assert legends == {(c, m) for c in ("256", "512") for m in ("nll", "nll_ref")}, legends
    assert ">Step<" in dom  # the x axis is the step, i.e. the prompt length

    png = ui.screenshot(url, tmp_path / "ui_compare.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (2000, 1000)
    import matplotlib.image

    pixels = matplotlib.image.imread(png)[..., :3]
    colors = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colors) > 200, f"{len(colors)} colours: a blank or error page, not the UI"
    chart = pixels[100:400, 500:1450]  # where the chart sits at 2000x1000
    assert (chart.std(axis=(0, 1)) > 0.05).all(), "the chart area is flat"
