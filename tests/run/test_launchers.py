"""Sweeps through hydra-submitit-launcher: jobs in processes of their own, one tracking server.

The oneknob presets extend the plugin's configs (conf/hydra/launcher/):
`local_procs` (submitit_local: every job its own process, as many at once as `devices` has sets) and
`slurm_gpu` (submitit_slurm: one array task and one GPU per job). A local
sweep runs end to end against a real mlflow server; Slurm is checked up to the
sbatch script it would submit (a fake sbatch on PATH records it and refuses).
"""

import json
import pickle
import textwrap

import pytest
from helpers import engine_spans, most_at_once, overlapping, run_cli
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from mlflow_server import experiment, mlflow_server  # noqa: F401  (fixtures)

import oneknob.config.schema  # noqa: F401  (registers the schema)
from oneknob.config.schema import REPO_ROOT

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install hydra-submitit-launcher")


def launcher_config(*overrides):
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(REPO_ROOT / "conf"), version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=True).hydra.launcher
    finally:
        GlobalHydra.instance().clear()


def test_presets_extend_the_plugin_configs():
    slurm = launcher_config("hydra/launcher=slurm_gpu", "hydra.launcher.partition=gpu",
                            "hydra.launcher.account=proj", "hydra.launcher.timeout_min=30",
                            "hydra.launcher.array_parallelism=2")
    assert slurm._target_.endswith("SlurmLauncher")
    assert (slurm.gpus_per_node, slurm.tasks_per_node, slurm.partition, slurm.account, slurm.timeout_min,
            slurm.array_parallelism) == (1, 1, "gpu", "proj", 30, 2)
    # an engine that spans several GPUs (the preset's tensor_parallel_size) gets them all in its task
    assert launcher_config("hydra/launcher=slurm_gpu", "model=qwen3_next_80b").gpus_per_node == 2
    assert launcher_config("hydra/launcher=slurm_gpu", "model=deepseek_v3").gpus_per_node == 8
    local = launcher_config("hydra/launcher=local_procs")
    assert local._target_.endswith("LocalLauncher") and local.gpus_per_node == 0


@pytest.mark.slow
def test_local_processes_nest_under_one_parent_and_a_failing_job_fails_alone(
        tmp_path, mlflow_server, experiment):  # noqa: F811
    # Every job probes the grid 200, 300, 600, then bisects its own verdict change: only the
    # capture=256 job ever asks for 257 tokens, so the injected crash hits that job alone.
    # on two (logical) devices: oneknob places the jobs' engines, never two on one device (oneknob.run.devices)
    rc, out = run_cli(tmp_path, "hydra/launcher=local_procs", "lengths=[200,300,600]", "samples=1",
                      "search.suspects=false", "engine.fault.crash_at_length=257", "cudagraph.capture=256,384,512",
                      "devices=[0,1]", "engine.fault.start_delay_s=1",
                      f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={experiment}", multirun=True)
    assert rc == 1, out  # README: 1 when some job failed
    assert "1 of 3 job(s) failed" in out and "cudagraph.capture=256" in out, out

    runs = mlflow_server.runs(experiment)
    parents = [r for r in runs if r["tags"].get("oneknob.role") == "sweep"]
    jobs = {int(r["params"]["knob.cudagraph.capture"]): r for r in runs if r["tags"].get("oneknob.role") == "job"}
    assert len(parents) == 1 and parents[0]["status"] == "FAILED"
    assert sorted(jobs) == [256, 384, 512]
    assert {r["tags"]["mlflow.parentRunId"] for r in jobs.values()} == {parents[0]["id"]}
    assert jobs[256]["status"] == "FAILED" and jobs[256]["tags"]["oneknob.status"] == "failed"
    for capture in (384, 512):
        assert jobs[capture]["status"] == "FINISHED"
        assert jobs[capture]["metrics"]["boundary_last_polluted"] == capture

    spans = engine_spans(tmp_path)  # the reference and three jobs, crashed one included, on devices 0 and 1
    assert set(spans) == {"0", "1"} and sum(map(len, spans.values())) == 4, spans
    # never more engines than sets; the two sets held side by side (a job's process start, ~45 s on 2 busy cores,
    # holds its set too, so whether two engines are up at one instant is the machine's timing, not oneknob's)
    assert not overlapping(spans) and most_at_once(spans) <= 2, spans
    placed = json.loads(next((tmp_path / "multirun").iterdir()).joinpath("placement.json").read_text())
    assert placed["most_at_once"] == 2, placed

    # each job in a process of its own, through submitit
    sweep_dir = next((tmp_path / "multirun").iterdir())
    results = sorted(sweep_dir.glob(".submitit/*/*_result.pkl"))
    assert len(results) == 3, results
    assert all(pickle.loads(p.read_bytes())[0] == "success" for p in results)

    # one reference and one point cache for all jobs (same paths.cache)
    references = [r for r in runs if r["tags"].get("oneknob.role") == "reference"]
    assert len(references) == 1
    assert len(list((tmp_path / ".cache/oneknob/references").glob("*/long-*.json"))) == 1
    assert len(list((tmp_path / ".cache/oneknob/points").iterdir())) == 3

    # the comparison ran once all jobs had ended, from MLflow, and saw them all
    summary = json.loads((sweep_dir / "summary.json").read_text())
    seen = {r["run_id"]: r["status"] for r in summary["runs"]}
    assert seen == {jobs[256]["id"]: "failed", jobs[384]["id"]: "ok", jobs[512]["id"]: "ok"}
    files = mlflow_server.api("artifacts/list", run_id=parents[0]["id"]).get("files", [])
    assert {"summary.json", "report.md"} <= {f["path"] for f in files}


FAKE_SBATCH = """\
#!/bin/bash
# Records the script oneknob's sweep would submit, then refuses it like a cluster would.
cp "$1" "{capture}"
echo "sbatch: error: Batch job submission failed: stopped by the test" >&2
exit 1
"""


def test_slurm_preset_submits_one_gpu_per_array_task(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    capture = tmp_path / "submitted.sh"
    (fake_bin / "sbatch").write_text(FAKE_SBATCH.format(capture=capture))
    (fake_bin / "srun").write_text("#!/bin/bash\nexit 1\n")
    for tool in fake_bin.iterdir():
        tool.chmod(0o755)
    # site settings the documented way: a `local` config (here on an extra search path)
    site = tmp_path / "site" / "local"
    site.mkdir(parents=True)
    (site / "default.yaml").write_text(textwrap.dedent("""\
        # @package _global_
        defaults:
          - override /hydra/launcher: slurm_gpu
        hydra:
          launcher:
            partition: gpu-a100
            account: proj-42
        """))
    import os

    rc, out = run_cli(tmp_path, f"hydra.searchpath=[file://{tmp_path / 'site'}]", "hydra.launcher.timeout_min=30",
                      "hydra.launcher.array_parallelism=1", "lengths=[200,300]", "samples=1",
                      "cudagraph.capture=256,512", multirun=True,
                      env={"PATH": f"{fake_bin}:{os.environ['PATH']}"})
    assert rc == 1, out  # the launcher's failure fails the sweep, after it started: not a refusal (2)
    assert "the launcher failed" in out, out
    script = capture.read_text()
    for line in ("#SBATCH --gpus-per-node=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=gpu-a100",
                 "#SBATCH --account=proj-42", "#SBATCH --time=30",
                 "#SBATCH --cpus-per-task=8"):
        assert line in script, f"{line} not in:\n{script}"
    # the baseline is submitted first and alone (the variants are diffed against it): it was refused,
    # so the variant was never submitted
    assert "#SBATCH --array" not in script or "#SBATCH --array=0-0" in script, script

    from helpers import mlflow_runs

    parents = mlflow_runs(tmp_path, role="sweep")
    assert len(parents) == 1 and parents[0].info.status == "FAILED"  # not left RUNNING
    assert mlflow_runs(tmp_path, role="job") == []
