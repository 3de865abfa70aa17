"""Screenshot the MLflow UI pages of a sweep with headless Chromium (the pictures in docs/).

    python scripts/ui_screenshot.py --tracking-uri http://127.0.0.1:5000 --docs   # docs/ui_runs.png, ui_compare.png
    python scripts/ui_screenshot.py --tracking-uri http://127.0.0.1:5000 --page compare --out shot.png
    python scripts/ui_screenshot.py --tracking-uri http://127.0.0.1:5000 --sweep 3f2a9c1d0e4b --print-url

Pages (oneknob.explain.mlflow_ui): `runs`, the experiment's runs table, where the UI
lands; `compare`, the metric view of the sweep's job runs (nll against the
step, i.e. the prompt length, one line per run: the URL a sweep prints at its
end); `report`, the parent run's page, whose description is the report. Needs a
running tracking server (make server / make ui) and Debian's `chromium`
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

from oneknob.explain import mlflow_ui

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


def _experiment_ids(uri: str, experiment: str | None) -> list[str]:
    if experiment is not None:
        return [_api(uri, "experiments/get-by-name", experiment_name=experiment)["experiment"]["experiment_id"]]
    found = _api(uri, "experiments/search", {"max_results": 1000}).get("experiments", [])
    return [e["experiment_id"] for e in found]


def sweep_runs(uri: str, experiment: str | None = None, sweep_id: str | None = None) -> tuple[str, str, list[str]]:
    """(experiment id, sweep id, job run ids) of a sweep; the latest sweep (of any experiment when experiment
    is None) when sweep_id is None."""
    return sweep_parent(uri, experiment, sweep_id)[:3]


def sweep_parent(uri: str, experiment: str | None = None,
                 sweep_id: str | None = None) -> tuple[str, str, list[str], str]:
    """(experiment id, sweep id, job run ids, parent run id) of a sweep."""
    where = "tags.`oneknob.role` = 'sweep'" + (f" and tags.`oneknob.sweep_id` = '{sweep_id}'" if sweep_id else "")
    parents = _api(uri, "runs/search", {"experiment_ids": _experiment_ids(uri, experiment), "max_results": 1,
                                        "filter": where, "order_by": ["attributes.start_time DESC"]}).get("runs", [])
    if not parents:
        raise SystemExit(f"no sweep {sweep_id or ''} in {experiment or 'any experiment'} at {uri}: run one with "
                         f"tracking.uri={uri}")
    parent = parents[0]
    experiment_id = parent["info"]["experiment_id"]
    sweep_id = {t["key"]: t["value"] for t in parent["data"]["tags"]}["oneknob.sweep_id"]
    jobs_of_sweep = f"tags.`oneknob.role` = 'job' and tags.`oneknob.sweep_id` = '{sweep_id}'"
    runs = _api(uri, "runs/search", {"experiment_ids": [experiment_id], "max_results": 1000, "filter": jobs_of_sweep,
                                     "order_by": ["attributes.start_time ASC"]}).get("runs", [])
    if not runs:
        raise SystemExit(f"sweep {sweep_id} has no job runs at {uri}")
    return experiment_id, sweep_id, [r["info"]["run_id"] for r in runs], parent["info"]["run_id"]


def compare_url(uri: str, experiment_id: str, run_ids: list[str], metrics: tuple[str, ...] = ("nll",)) -> str:
    """The overlaid metric view of these runs: the page a sweep's last line names."""
    return mlflow_ui.metric_url(uri.rstrip("/"), experiment_id, run_ids, metrics)


def page_url(page: str, uri: str, experiment: str | None = None, sweep_id: str | None = None,
             metrics: tuple[str, ...] = ("nll",)) -> str:
    experiment_id, _, run_ids, parent = sweep_parent(uri, experiment, sweep_id)
    base = uri.rstrip("/")
    return {"runs": lambda: mlflow_ui.runs_url(base, experiment_id),
            "compare": lambda: compare_url(base, experiment_id, run_ids, metrics),
            "report": lambda: mlflow_ui.run_url(base, experiment_id, parent)}[page]()


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


PAGES = ("runs", "compare", "report")
DOCS = {"runs": "docs/ui_runs.png", "compare": "docs/ui_compare.png"}  # the report page opens collapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", required=True, help="the tracking server, e.g. http://127.0.0.1:5000")
    parser.add_argument("--experiment", help="default: the latest sweep of any experiment")
    parser.add_argument("--sweep", help="sweep id (default: the latest sweep)")
    parser.add_argument("--page", choices=PAGES, default="compare")
    parser.add_argument("--metrics", nargs="+", default=["nll"])
    parser.add_argument("--out", help="the PNG (default: docs/ui_<page>.png)")
    parser.add_argument("--docs", action="store_true", help="the pictures in docs/: ui_runs.png and ui_compare.png")
    parser.add_argument("--size", default="2000x1000", help="window WIDTHxHEIGHT")
    parser.add_argument("--print-url", action="store_true", help="print the page's URL and take no screenshot")
    args = parser.parse_args(argv)
    pages = list(DOCS) if args.docs else [args.page]
    width, height = (int(x) for x in args.size.split("x"))
    for page in pages:
        url = page_url(page, args.tracking_uri, args.experiment, args.sweep, tuple(args.metrics))
        if args.print_url:
            print(url)
            continue
        out = screenshot(url, Path(args.out if args.out and not args.docs else DOCS.get(page, f"docs/ui_{page}.png")),
                         width=width, height=height)
        print(f"{page}: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
