"""The seed's study end to end, through the real command line, on the synthetic engine.

One ablation sweep of experiments/mtp_prompt_logprobs.yaml is shared by the
module (cwd, sweep dir, MLflow store and point cache all in one tmp dir), and
every claim is checked where a user would look: the sweep's summary.json and
report.md, and the MLflow runs themselves.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import mlflow_client

from oneknob.config import knobs

ROOT = Path(__file__).resolve().parents[2]
STUDY = ["experiment=mtp_prompt_logprobs", "engine=synthetic"]


def cli(args: list[str], cwd: Path, command: str | None = None) -> subprocess.CompletedProcess:
    """`python run.py ARGS`, or `python -m oneknob COMMAND ARGS`."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"COLUMNS": "200"}
    command = [sys.executable, "-m", "oneknob", command] if command else [sys.executable, str(ROOT / "run.py")]
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def client_for(cwd: Path):
    return mlflow_client(cwd)


def job_runs(client, sweep_id: str) -> list:
    experiment = client.get_experiment_by_name("oneknob-synthetic")  # the synthetic engine's experiment
    return client.search_runs([experiment.experiment_id],
                              f"tags.`oneknob.role` = 'job' and tags.`oneknob.sweep_id` = '{sweep_id}'")


def all_runs(client) -> list:
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ablation")


@pytest.fixture(scope="module")
def sweep(workdir):
    sweep_dir = workdir / "sweep"
    proc = cli(["-m", "hydra/sweeper=ablation", *STUDY, f"hydra.sweep.dir={sweep_dir}"], workdir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((sweep_dir / "summary.json").read_text())
    return {"dir": sweep_dir, "summary": summary, "report": (sweep_dir / "report.md").read_text(),
            "runs": {run["name"]: run for run in summary["runs"]}, "stdout": proc.stdout,
            "client": client_for(workdir)}


def pairs(run: dict) -> list[tuple]:
    return [(t["lo"], t["hi"], t["direction"], t["resolved"]) for t in run["transitions"]]


SEED_SHAPE = "polluted->clean"


def test_boundary_of_every_variant(sweep):
    runs = sweep["runs"]
    assert list(runs) == ["baseline", "cudagraph.enforce_eager=true", "cudagraph.capture=256", "spec.k=0",
                          "spec.k=1", "sched.max_num_seqs=64", 'runner="v2"']
    assert pairs(runs["baseline"]) == [(512, 513, SEED_SHAPE, True)]
    assert pairs(runs["cudagraph.capture=256"]) == [(256, 257, SEED_SHAPE, True)]
    for clean in ("cudagraph.enforce_eager=true", "spec.k=0", 'runner="v2"'):
        assert pairs(runs[clean]) == [] and runs[clean]["shape"] == "all clean", clean
        assert runs[clean]["points"] and not any(p["polluted"] for p in runs[clean]["points"])
    # max_num_seqs x (K+1) drops to 256 while the capture size stays 512: the boundary stays too.
    assert pairs(runs["sched.max_num_seqs=64"]) == [(512, 513, SEED_SHAPE, True)]
    baseline = runs["baseline"]
    assert baseline["nll_polluted"] > baseline["nll_clean"] + 5  # polluted garbage vs clean text
    assert baseline["resolved"]["max_capture_size"] == 512 and baseline["resolved"]["spec_k"] == 3


def test_k0_side_effect_on_capture_is_found_and_pinned(sweep):
    k0 = sweep["runs"]["spec.k=0"]
    assert k0["pinned"] == {"cudagraph.capture": 512}
    assert k0["resolved"]["max_capture_size"] == 512 and k0["resolved"]["spec_k"] == 0
    assert "pinned cudagraph.capture=512" in k0["note"] and "max_capture_size 512 -> 256" in k0["note"]
    run = sweep["client"].get_run(k0["run_id"])
    assert json.loads(run.data.tags["oneknob.pinned"]) == {"cudagraph.capture": 512}
    # the variant's own resolved_diff.json records what moved, in MLflow
    path = sweep["client"].download_artifacts(k0["run_id"], "resolved_diff.json", str(sweep["dir"].parent))
    assert json.loads(Path(path).read_text())["pinned"] == {"cudagraph.capture": 512}


def test_one_engine_start_per_configuration_when_the_rules_predict_the_pin(workdir, sweep):
    """K=0's side effect (capture 512 -> 256) is predicted by the resolution rules, so its pinned engine starts
    directly: 7 configurations + the reference = 8 starts, counted from workers.jsonl (9 when K=0 started twice)."""
    starts = [json.loads(line) for line in (workdir / ".cache/oneknob/workers.jsonl").read_text().splitlines()]
    starts = [r for r in starts if r["event"] == "start"]
    assert [r["role"] for r in starts].count("reference") == 1
    assert len(starts) == len(sweep["runs"]) + 1 == 8
    k0 = [r for r in starts if r["role"] == "job" and r["knobs"].get("spec.k") == 0]
    assert len(k0) == 1 and k0[0]["knobs"]["cudagraph.capture"] == 512  # started pinned, never unpinned


def test_k0_side_effect_is_flagged_under_the_flag_policy(workdir):
    sweep_dir = workdir / "flag"
    proc = cli(["-m", "hydra/sweeper=ablation", "engine=synthetic", "+ablation.spec.k=[0]",
                "single_variable.side_effects=flag", "lengths=[256,512,513,1024]",
                f"hydra.sweep.dir={sweep_dir}"], workdir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((sweep_dir / "summary.json").read_text())
    k0 = next(run for run in summary["runs"] if run["knob"] == "spec.k")
    assert k0["status"] == "confounded" and k0["confounded"] and not k0["pinned"]
    assert k0["resolved"]["max_capture_size"] == 256 and "max_capture_size" in k0["side_effects"]
    assert any("spec.k=0" in note and "confounded" in note and "max_capture_size 512 -> 256" in note
               for note in summary["notes"])
    assert client_for(workdir).get_run(k0["run_id"]).data.tags["oneknob.confounded"] == "true"


def test_report_says_the_boundary_tracks_the_resolved_max_capture_size(sweep):
    summary = sweep["summary"]
    assert summary["tracks"]["cudagraph.capture"] == "max_capture_size"
    assert summary["tracks_detail"]["cudagraph.capture"]["values"] == [512, 256]
    assert summary["tracks_detail"]["cudagraph.capture"]["relation"] == "last_polluted"
    assert summary["overall"]["quantity"] == "max_capture_size" and summary["conflict"] is None
    assert set(summary["tracks"]) == {"cudagraph.enforce_eager", "cudagraph.capture", "spec.k",
                                      "sched.max_num_seqs", "runner"}
    claim = ("cudagraph.capture=256 moved it to 256|257; the boundary tracks the resolved max capture size in these "
             "runs (last polluted = it: 512 -> 256)")
    assert f"- {claim}\n" in sweep["report"]
    tested = next(c for c in summary["conclusions"] if c["run"] == "baseline")  # the terminal: the opening paragraph
    assert " ".join(tested["text"].split()) in " ".join(sweep["stdout"].split())  # wrapped at 120 columns


def test_the_seed_is_concluded_from_its_own_runs_with_no_follow_up(workdir, sweep):
    """capture=256 moved the capture size alone and the edge with it; K=1 and max_num_seqs=64 moved the other
    coincidences and the edge stayed: that is the test, so the default follow-up budget starts no engine."""
    assert not any(r["followup"] for r in sweep["summary"]["runs"])
    by_run = {c["run"]: c for c in sweep["summary"]["conclusions"]}
    baseline = by_run["baseline"]
    assert (baseline["transition"], baseline["tracks"], baseline["offset"]) == ("512|513", "max_capture_size", 0)
    assert baseline["evidence"][0] == "cudagraph.capture=256" and not baseline["untested"]
    assert {"seqs_x_query_len", "batched_tokens_per_query_len", "default_capture_ceiling"} <= set(
        baseline["ruled_out"])
    assert {"spec.k=1", "sched.max_num_seqs=64"} <= set(baseline["evidence"])
    # every resolved edge of every run is concluded
    assert {name: c["tracks"] for name, c in by_run.items()} == {
        "baseline": "max_capture_size", "cudagraph.capture=256": "max_capture_size",
        "spec.k=1": "max_capture_size", "sched.max_num_seqs=64": "max_capture_size"}
    assert "- baseline: 512|513 tracks the resolved max capture size with offset 0" in sweep["report"]


def test_confound_report_at_the_baseline_is_ambiguous_and_proposes_a_capture_change(sweep):
    confounds = sweep["summary"]["confounds"]
    assert confounds["at"] == "baseline" and [t["transition"] for t in confounds["transitions"]] == ["512|513"]
    assert {(m["quantity"], m["relation"]) for m in confounds["transitions"][0]["matches"]} >= {
        ("max_capture_size", "last_polluted"), ("seqs_x_query_len", "last_polluted"),
        ("batched_tokens_per_query_len", "last_polluted")}
    assert confounds["ambiguous"] is True
    assert confounds["suggestion"]["knob"] == "cudagraph.capture"
    assert confounds["suggestion"]["moves"] == "max_capture_size"
    # capture=256 (an alternative) and max_num_seqs=64 were run. The synthetic engine resolves by the
    # prediction rules, so "held" is no finding there (None); whether the boundary followed is.
    checked = {(c["knob"], c["value"]): c for c in confounds["checked"]}
    assert checked[("cudagraph.capture", 256)]["held"] is None and checked[("cudagraph.capture", 256)]["follows"]
    assert checked[("sched.max_num_seqs", 64)]["held"] is None
    assert not checked[("sched.max_num_seqs", 64)]["follows"]
    assert "this engine resolves by the same rules, so this is no test of them" in sweep["report"]
    assert "prediction held" not in sweep["report"]
    assert "- polluted->clean at 512|513: last polluted 512 = resolved max capture size, max_num_seqs x (K+1), " \
           "max_num_batched_tokens / (K+1), vLLM's default capture ceiling, a power of two; ambiguous" \
           in sweep["report"]
    # the suggested separating run is not proposed: the sweep's own capture=256 run already moved the capture size
    # alone and its other runs ruled the rest out
    assert ("next experiment: none needed: the runs of this sweep already tested it (512|513 tracks the resolved max "
            "capture size") in sweep["report"] and "set cudagraph.capture=384" not in sweep["report"]


def test_report_notes_pins_and_confounds_and_logs_on_the_parent_run(sweep):
    summary, client = sweep["summary"], sweep["client"]
    assert any(note.startswith("spec.k=0: pinned cudagraph.capture=512") for note in summary["notes"])
    assert summary["predictions"]["mismatches"] == {} and summary["predictions"]["simulated"]
    assert "- resolution rules: not tested here: this engine's resolved config is the rules' own prediction" \
        in sweep["report"] and "exactly as predicted" not in sweep["report"]
    assert summary["plots"] == ["nll_vs_length.png", "boundary_vs_knob.png"]
    for plot in summary["plots"]:
        assert (sweep["dir"] / plot).read_bytes()[:4] == b"\x89PNG"
        assert f"({plot})" in sweep["report"]
    logged = {a.path for a in client.list_artifacts(summary["parent_run_id"])}
    assert {"summary.json", "report.md", *summary["plots"]} <= logged


def test_the_sweeper_never_launches_a_job_that_differs_in_two_knobs(sweep):
    runs = job_runs(sweep["client"], sweep["summary"]["sweep_id"])
    assert len(runs) == 7
    params = {r.data.tags["oneknob.knob"]: r for r in runs}
    baseline = params.pop("baseline").data.params
    base_knobs = {k: v for k, v in baseline.items() if k.startswith("knob.")}
    for knob, run in params.items():
        pinned = json.loads(run.data.tags.get("oneknob.pinned") or "{}")
        requested = {k: v for k, v in run.data.params.items() if k.startswith("knob.")}
        differs = {k for k in base_knobs if requested[k] != base_knobs[k] and k[len("knob."):] not in pinned}
        assert differs == {f"knob.{knob}"}, (knob, differs)  # exactly its own knob: no variant is a no-op here
        for key, value in pinned.items():  # a pin restores what the baseline resolved to, field by field
            (field,) = {"cudagraph.capture": ["max_capture_size"], "sched.max_num_seqs": ["max_num_seqs"]}[key]
            assert str(value) == baseline[f"resolved.{field}"], (knob, key)
        # inside the engine too: only the fields the knob may move differ from the baseline's resolved config
        moved = {k[len("resolved."):] for k, v in run.data.params.items()
                 if k.startswith("resolved.") and k in baseline and v != baseline[k]}
        assert moved and moved <= set(knobs.knob(knob).moves), (knob, moved)


def test_cartesian_sweep_over_two_knobs_is_refused_and_records_nothing(workdir, sweep):
    before = len(all_runs(sweep["client"]))
    proc = cli(["-m", "engine=synthetic", "cudagraph.capture=256,512", "spec.k=0,3",
                f"hydra.sweep.dir={workdir / 'cartesian'}"], workdir)
    assert proc.returncode == 2
    output = proc.stdout + proc.stderr
    assert "varies 2 knobs" in output and "'+ablation.cudagraph.capture=[256,512]' '+ablation.spec.k=[0,3]'" in output
    assert len(all_runs(sweep["client"])) == before
    assert not (workdir / "cartesian").exists()


def test_dry_run_prints_the_plan_writes_plan_json_and_starts_nothing(tmp_path):
    proc = cli(["-m", "hydra/sweeper=ablation", *STUDY, "dry_run=true", f"hydra.sweep.dir={tmp_path / 's'}"],
               tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "7 job(s)" in output and "no engine is started" in output
    rows = {line.split("│")[1].strip(): line for line in output.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}  # (a wrapped cell continues on a blank row)
    assert set(rows) == {"baseline", "cudagraph.enforce_eager=true", "cudagraph.capture=256", "spec.k=0",
                         "spec.k=1", "sched.max_num_seqs=64", 'runner="v2"'}
    plan = json.loads((tmp_path / "s" / "plan.json").read_text())
    predicted = {job["name"]: job["predicted"] for job in plan["jobs"]}
    assert predicted["baseline"]["max_capture_size"] == 512
    assert predicted["spec.k=0"]["max_capture_size"] == 256  # K=0 alone moves the capture size
    assert predicted["cudagraph.enforce_eager=true"]["cudagraph_mode"] == "NONE"
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()
    assert not (tmp_path / ".cache" / "oneknob" / "workers.jsonl").exists()
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["plan.json"]


def test_comparison_is_rebuilt_from_mlflow_alone(workdir, sweep):
    """Delete the sweep directory: `python -m oneknob compare --sweep ID` gives the same table and files."""
    sweep_id = sweep["summary"]["sweep_id"]
    shutil.rmtree(sweep["dir"])
    proc = cli(["--sweep", sweep_id], workdir, command="compare")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((sweep["dir"] / "summary.json").read_text()) == sweep["summary"]
    assert (sweep["dir"] / "report.md").read_text() == sweep["report"]
    names = tuple(sweep["runs"])
    table = [line for line in proc.stdout.splitlines() if line.startswith(names) and " resolved: " not in line]
    assert len(table) == 7 and all(line in sweep["stdout"] for line in table)
    # the latest sweep is the default; --runs compares any set of runs without touching the parent's report
    latest = cli(["--out", str(workdir / "latest")], workdir, command="compare")
    assert latest.returncode == 0 and (workdir / "latest" / "summary.json").exists()
    runs = sweep["runs"]
    subset = cli(["--runs", runs["baseline"]["run_id"], runs["cudagraph.capture=256"]["run_id"],
                  "--out", str(workdir / "subset")], workdir, command="compare")
    assert subset.returncode == 0, subset.stderr[-3000:]
    picked = json.loads((workdir / "subset" / "summary.json").read_text())
    assert [r["name"] for r in picked["runs"]] == ["baseline", "cudagraph.capture=256"]
    assert picked["tracks"] == {"cudagraph.capture": "max_capture_size"}


def _run(name: str, knob: str | None, value, requested: dict, status: str, baseline: dict | None = None) -> dict:
    from oneknob.config import resolution
    from oneknob.plan import single_variable

    resolved = resolution.predict(requested, platform="cpu", max_num_batched_tokens=2048, default_runner="v1")
    check = single_variable.check(knob, baseline and baseline["resolved"], resolved, policy="pin", run_noops=False)
    assert check.status == status or knob is None
    points = [{"length": L, "nll": 3.0, "nll_ref": 3.0, "polluted": False, "polluted_samples": 0}
              for L in (256, 512, 1024)]
    return {"run_id": name, "name": name, "sweep_id": "s", "parent_run_id": None, "start_time": 0,
            "engine": "vllm", "knob": knob, "value": value, "status": status, "pinned": {}, "confounded": False,
            "check": check.as_dict(), "requested": requested, "resolved": resolved,
            "defaults": {"default_max_num_seqs": 256, "default_runner": "v1", "max_num_batched_tokens": 2048},
            "transitions": [], "samples": 1, "probes": 3, "search": {"max_probes": 64, "bisect": True},
            "points": points if status == "ok" else [], "error": None}


def test_on_cpu_the_report_says_graph_knobs_do_nothing_and_lists_the_noop(tmp_path):
    """No sweep needed: the analysis and rendering of a CPU study, from run records like MLflow's."""
    from oneknob.explain import analysis
    from oneknob.explain import report

    base = {"cudagraph.capture": None, "cudagraph.enforce_eager": False, "sched.max_num_seqs": 128,
            "spec.k": 3, "runner": "v1"}
    baseline = _run("baseline", None, None, base, "ok")
    runs = [baseline, _run("cudagraph.capture=256", "cudagraph.capture", 256, base | {"cudagraph.capture": 256},
                           "noop", baseline)]
    meta = {"sweep_id": "s", "parent_run_id": None, "sweep_dir": None, "command": None, "run_ids": None}
    summary = analysis.summarize(meta, runs)
    assert any("CPU" in note and "cudagraph_mode NONE" in note for note in summary["notes"])
    assert any(note.startswith("cudagraph.capture=256: no-op") and "no CUDA graph uses" in note
               for note in summary["notes"])
    assert summary["tracks"] == {"cudagraph.capture": None}
    assert summary["confounds"]["coinciding"] == [] and summary["predictions"]["mismatches"] == {}
    report.write(summary, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "no effect there" in text and "| noop |" in text and "none (all clean)" in text
    assert "- resolution rules: the engine resolved all 2 run(s) exactly as predicted" in text
