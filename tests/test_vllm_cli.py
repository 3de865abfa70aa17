"""The real vLLM CPU engine through the real CLI, on the tiny local MTP model.

Slow (each engine start is 30-60 s on 2 cores), few, and part of `make test`.
"""

import csv
import json
import math
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from oneknob.config import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

LENGTHS = [32, 100, 257]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One sweep: the reference (eager, K=0) plus jobs with K=0 and K=3 (MTP), both eager."""
    tmp = tmp_path_factory.mktemp("vllm")
    command = [sys.executable, str(REPO_ROOT / "run.py"), "-m", "engine=vllm", "model=tiny",
               "spec.k=0,3", "cudagraph.enforce_eager=true", f"lengths=[{','.join(map(str, LENGTHS))}]",
               "samples=2", f"hydra.sweep.dir={tmp}/sweep"]
    done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    client = MlflowClient(f"sqlite:///{tmp}/mlruns/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("oneknob").experiment_id])
    return tmp, client, runs


def _jobs(runs):
    return {int(r.data.params["knob.spec.k"]): r for r in runs if r.data.tags.get("oneknob.role") == "job"}


def test_points_are_finite_and_score_l_minus_one_positions(sweep):
    tmp, client, runs = sweep
    jobs = _jobs(runs)
    assert set(jobs) == {0, 3}
    for run in jobs.values():
        assert run.info.status == "FINISHED"
        job_dir = json.loads((tmp / "sweep" / _job_dir_name(tmp, run) / "result.json").read_text())["job_dir"]
        rows = list(csv.DictReader(open(f"{job_dir}/points.csv")))
        assert sorted({int(r["length"]) for r in rows}) == LENGTHS
        assert len(rows) == len(LENGTHS) * 2
        for row in rows:
            assert int(row["scored"]) == int(row["length"]) - 1
            assert math.isfinite(float(row["nll"])) and float(row["nll"]) > 0
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "nll"))
        assert steps == LENGTHS


def _job_dir_name(tmp, run):
    for job_dir in (tmp / "sweep").iterdir():
        result = job_dir / "result.json"
        if result.exists() and json.loads(result.read_text())["run_id"] == run.info.run_id:
            return job_dir.name
    raise AssertionError(f"no job dir for run {run.info.run_id}")


def test_resolved_config_and_provenance_are_recorded(sweep):
    _, _, runs = sweep
    for k, run in _jobs(runs).items():
        params = run.data.params
        assert params["resolved.platform"] == "cpu"
        assert params["resolved.cudagraph_mode"] == "NONE"
        assert params["resolved.enforce_eager"] == "true"
        assert params["resolved.spec_k"] == str(k)
        assert params["resolved.spec_method"] == ("mtp" if k else "null")
        assert params["resolved.max_num_seqs"] == "128"
        assert params["version.vllm"] == "0.32.0" and params["version.torch"].startswith("2.13.0")
        assert params["provenance.vllm"] == "0.32.0"
        assert "VLLM_USE_V2_MODEL_RUNNER" in params["provenance.env"]
        assert params["hardware.cpu"]
        assert len(params["model.fingerprint"]) == 16 and len(params["corpus.fingerprint"]) == 16


def test_reference_prefix_property(sweep):
    """Reference logprobs from one max-length request equal a direct request at L, at every
    position, within vLLM's prompt-logprob tolerance (atol = rtol = 2e-2)."""
    tmp, client, runs = sweep
    (reference_file,) = (tmp / ".cache/oneknob/references").glob("*.json")
    reference = json.loads(reference_file.read_text())
    assert reference["max_length"] == max(LENGTHS)
    direct = None
    for meta in (tmp / ".cache/oneknob/points").glob("*/meta.json"):
        if json.loads(meta.read_text())["key"]["spec"]["knobs"]["spec.k"] == 0:
            direct = [json.loads(line) for line in (meta.parent / "points.jsonl").read_text().splitlines()]
    assert direct, "no cached points of the K=0 job"
    checked = 0
    for point in direct:
        prefix = reference["logprobs"][point["sample"]][: point["length"] - 1]
        assert len(point["logprobs"]) == len(prefix) == point["length"] - 1
        for got, want in zip(point["logprobs"], prefix):
            assert abs(got - want) <= 2e-2 + 2e-2 * abs(want)
            checked += 1
    assert checked == sum(length - 1 for length in LENGTHS) * 2
    run = _jobs(runs)[0]
    nll = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "nll")}
    nll_ref = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "nll_ref")}
    for length in LENGTHS:
        assert abs(nll[length] - nll_ref[length]) <= 2e-2 + 2e-2 * abs(nll_ref[length])


def test_mtp_speculation_leaves_prompt_logprobs_clean_on_cpu(sweep):
    """K=3 with the MTP drafter against the eager K=0 reference: every length clean."""
    _, client, runs = sweep
    run = _jobs(runs)[3]
    assert run.data.params["resolved.spec_k"] == "3"
    assert all(m.value == 0.0 for m in client.get_metric_history(run.info.run_id, "polluted"))
    assert "boundary_last_polluted" not in run.data.metrics
