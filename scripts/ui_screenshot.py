"""Screenshot MLflow's comparison of a sweep's runs (nll vs prompt length) with headless Chromium.

    python scripts/ui_screenshot.py --tracking-uri http://127.0.0.1:5000 --out docs/ui_compare.png
    python scripts/ui_screenshot.py --tracking-uri http://127.0.0.1:5000 --sweep 3f2a9c1d0e4b --print-url

The page is MLflow's metric view of the sweep's job runs, the one the "Compare"
button of the experiment page leads to when you click a metric: one line per
run and metric, the step (the prompt length) on the x axis. Needs a running
tracking server (make server / make ui) and Debian's `chromium`
(apt-get install chromium). The UI is a JavaScript app, so Chromium is given a
virtual-time budget to fetch the runs and draw the chart before the shot.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _api(uri: str, path: str, body: dict | None = None, **query) -> dict:
    url = f"{uri.rstrip('/')}/api/2.0/mlflow/{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def sweep_runs(uri: str, experiment: str, sweep_id: str | None = None) -> tuple[str, str, list[str]]:
    """(experiment id, sweep id, job run ids) of a sweep; the latest sweep when sweep_id is None."""
    experiment_id = _api(uri, "experiments/get-by-name", experiment_name=experiment)["experiment"]["experiment_id"]
    if sweep_id is None:
        parents = _api(uri, "runs/search", {"experiment_ids": [experiment_id], "max_results": 1,
                                            "filter": "tags.`oneknob.role` = 'sweep'",
                                            "order_by": ["attributes.start_time DESC"]}).get("runs", [])
        if not parents:
            raise SystemExit(f"no sweep in experiment {experiment} at {uri}: run one with tracking.uri={uri}")
        tags = {t["key"]: t["value"] for t in parents[0]["data"]["tags"]}
        sweep_id = tags["oneknob.sweep_id"]
    jobs_of_sweep = f"tags.`oneknob.role` = 'job' and tags.`oneknob.sweep_id` = '{sweep_id}'"
    runs = _api(uri, "runs/search", {"experiment_ids": [experiment_id], "max_results": 1000, "filter": jobs_of_sweep,
                                     "order_by": ["attributes.run_name ASC"]}).get("runs", [])
    if not runs:
        raise SystemExit(f"sweep {sweep_id} has no job runs in experiment {experiment} at {uri}")
    return experiment_id, sweep_id, [r["info"]["run_id"] for r in runs]


def compare_url(uri: str, experiment_id: str, run_ids: list[str], metrics: tuple[str, ...] = ("nll", "nll_ref")) -> str:
    """MLflow 3's metric page for several runs (Utils.getMetricPageRoute in the UI's sources)."""
    query = {"runs": json.dumps(run_ids), "metric": json.dumps(metrics[0]), "experiments": json.dumps([experiment_id]),
             "plot_metric_keys": json.dumps(list(metrics)), "plot_layout": "{}", "x_axis": "step",
             "y_axis_scale": "linear", "line_smoothness": "1", "show_point": "true", "deselected_curves": "[]",
             "last_linear_y_axis_range": "[]"}
    encoded = "&".join(f"{k}={urllib.parse.quote(v, safe='')}" for k, v in query.items())
    return f"{uri.rstrip('/')}/#/metric/{urllib.parse.quote(metrics[0])}?{encoded}"


def _chromium(url: str, *args: str, width: int, height: int, budget_ms: int, timeout_s: float):
    browser = chromium()
    if browser is None:
        raise SystemExit("chromium is not installed: apt-get install -y chromium")
    with tempfile.TemporaryDirectory(prefix="oneknob-chromium-") as profile:  # a fresh profile each time
        return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                               f"--window-size={width},{height}", f"--virtual-time-budget={budget_ms}", *args, url],
                              capture_output=True, text=True, timeout=timeout_s)


def screenshot(url: str, out: Path, *, width: int = 2000, height: int = 1000, budget_ms: int = 20000,
               timeout_s: float = 120) -> Path:
    """A PNG of the page once the app has drawn it (budget_ms of virtual time: fetches, then rendering)."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    done = _chromium(url, f"--screenshot={out}", width=width, height=height, budget_ms=budget_ms,
                     timeout_s=timeout_s)
    if not out.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return out


def rendered_dom(url: str, *, width: int = 2000, height: int = 1000, budget_ms: int = 20000,
                 timeout_s: float = 120) -> str:
    """The page's DOM after the same wait as screenshot(): what the picture shows, as text to check."""
    done = _chromium(url, "--dump-dom", width=width, height=height, budget_ms=budget_ms, timeout_s=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"chromium --dump-dom exited {done.returncode}:\n{done.stderr[-2000:]}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", required=True, help="the tracking server, e.g. http://127.0.0.1:5000")
    parser.add_argument("--experiment", default="oneknob")
    parser.add_argument("--sweep", help="sweep id (default: the latest sweep of the experiment)")
    parser.add_argument("--metrics", nargs="+", default=["nll", "nll_ref"])
    parser.add_argument("--out", default="docs/ui_compare.png")
    parser.add_argument("--size", default="2000x1000", help="window WIDTHxHEIGHT")
    parser.add_argument("--print-url", action="store_true", help="print the page's URL and take no screenshot")
    args = parser.parse_args(argv)
    experiment_id, sweep_id, run_ids = sweep_runs(args.tracking_uri, args.experiment, args.sweep)
    url = compare_url(args.tracking_uri, experiment_id, run_ids, tuple(args.metrics))
    if args.print_url:
        print(url)
        return 0
    width, height = (int(x) for x in args.size.split("x"))
    out = screenshot(url, Path(args.out), width=width, height=height)
    print(f"sweep {sweep_id}: {len(run_ids)} run(s) -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
