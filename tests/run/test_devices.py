"""Devices (oneknob.run.devices, oneknob.study.side_by_side): every engine on devices of its own, a sweep's jobs
side by side, the same results as on one device.

The placement's rules are checked in-process against a fake nvidia-smi; the sweeps run the synthetic engine on
logical devices (devices=[0,1,2,3]: the workers' CUDA_VISIBLE_DEVICES is set and recorded, no GPU needed), with
engine.fault.start_delay_s standing for an engine start's time. workers.jsonl says which device each engine had
and when it started and stopped: no two may overlap on one device.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from helpers import engine_spans, mlflow_runs, most_at_once, overlapping, run_cli, start_cli, wait_for, worker_records
from oneknob.errors import ConfigError
from oneknob.run import devices, stopping

FAKE_NVIDIA_SMI = """#!/usr/bin/env python3
import sys
query = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--query-gpu=")), "index")
values = {{"index": str, "name": lambda i: "NVIDIA H100 80GB HBM3", "driver_version": lambda i: "550.54.15",
          "memory.total": lambda i: "81559", "compute_cap": lambda i: "9.0", "uuid": lambda i: f"GPU-{{i:08d}}"}}
for i in range({n}):
    print(", ".join(values[f](i) for f in query.split(",")))
"""


def fake_gpus(folder: Path, n: int) -> str:
    """A folder holding an nvidia-smi that lists n H100s (index and provenance's fields); its PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nvidia-smi").write_text(FAKE_NVIDIA_SMI.format(n=n))
    (folder / "nvidia-smi").chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


# -- the placement's rules ------------------------------------------------------------------------------------------

def test_auto_takes_every_gpu_nvidia_smi_lists_or_those_cuda_visible_devices_allows(tmp_path):
    path = fake_gpus(tmp_path / "bin", 8)
    every = devices.resolve("auto", platform="cuda", env={"PATH": path})
    assert every.devices == tuple("01234567") and every.sets == tuple((d,) for d in "01234567")
    limited = devices.resolve("auto", platform="cuda", env={"PATH": path, "CUDA_VISIBLE_DEVICES": "2,5,9"})
    assert limited.devices == ("2", "5")  # 9 is no GPU nvidia-smi lists
    assert devices.resolve(3, platform="cuda", env={"PATH": path}).devices == ("0", "1", "2")
    pairs = devices.resolve("auto", platform="cuda", per_engine=3, env={"PATH": path})
    assert pairs.sets == (("0", "1", "2"), ("3", "4", "5")) and "6,7 stay idle" in pairs.notes[0]
    assert devices.resolve("0,2", platform="cuda", env={"PATH": path}).devices == ("0", "2")  # as CUDA_V_D writes it


@pytest.mark.parametrize("value, said", [
    (9, "devices=9: only 8 GPU(s) visible here"),
    ([0, 8], "devices=[0,8]: 8 not among the GPUs visible here"),
    ([1, 1], "1 named twice"),
    (0, "devices=0: at least one device"),
    (True, "devices=true: not a device setting"),
    ("abc", "devices=abc: abc is not a GPU id"),  # CUDA would read no GPU at all from it
    ([-1], "devices=[-1]: -1 is not a GPU id"),
    ([1, "01"], "devices=[1,01]: 1 named twice"),
])
def test_a_placement_that_cannot_hold_is_refused_naming_the_value_and_the_fix(tmp_path, value, said):
    with pytest.raises(ConfigError, match="devices=") as refused:
        devices.resolve(value, platform="cuda", env={"PATH": fake_gpus(tmp_path / "bin", 8)})
    assert said in str(refused.value) and "devices=" in str(refused.value).split(";")[-1] + str(refused.value)
    with pytest.raises(ConfigError, match=r"model.tensor_parallel_size=4 needs 4 devices per engine, but "
                                          r"devices=\[0,1\] gives 2"):
        devices.resolve([0, 1], platform="cuda", per_engine=4, env={"PATH": fake_gpus(tmp_path / "bin", 8)})


def test_devices_is_one_placement_per_sweep_never_swept():
    from oneknob.plan import single_variable as sv

    with pytest.raises(sv.GuardError, match=r"devices=0,1: .* give the devices as one list: 'devices=\[0,1\]'"):
        sv.sweep_shape(["devices=0,1"])  # -m's comma list: a sweep over two placements, each job on its own


def test_without_gpus_one_device_as_before_and_logical_ones_for_the_simulation(tmp_path):
    bare = {"PATH": str(tmp_path)}  # no nvidia-smi
    one = devices.resolve("auto", platform="synthetic", env=bare)
    assert not one.placed and one.sets == ((),) and devices.env((), {}) == {}
    logical = devices.resolve(4, platform="synthetic", env=bare)
    assert logical.logical and logical.sets == (("0",), ("1",), ("2",), ("3",))
    assert devices.env(("2",), {}) == {"CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    cpu = devices.resolve([0, 1], platform="cpu", env={"PATH": fake_gpus(tmp_path / "bin", 8)})
    assert cpu.sets == ((),) and "vLLM's CPU build" in cpu.notes[0] and "stays one" in cpu.notes[0]


def test_a_slurm_job_records_what_slurm_gave_with_its_node():
    slurm = {"SLURM_JOB_ID": "41", "SLURMD_NODENAME": "gpu7", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert devices.of(None, slurm) == "gpu7:0,1"
    assert devices.of(None, slurm | {"SLURM_JOB_GPUS": "4,5"}) == "gpu7:0,1 (node's GPU 4,5)"  # renumbered for it
    assert devices.of(None, {"CUDA_VISIBLE_DEVICES": "3"}) == "3" and devices.of(None, {}) == devices.HOST
    assert devices.of(("2", "3"), slurm) == "2,3"  # placed by oneknob: its own sets


def test_the_pool_gives_each_set_to_one_holder_at_a_time_first_come_first_served():
    stopping.reset()
    pool = devices.Pool((("0",), ("1",)))
    held: dict[str, str] = {}
    order, clash = [], []

    def job(name: str) -> None:
        with pool.lease(name) as lease:
            device = lease.devices[0]
            if device in held:
                clash.append((name, held[device]))
            held[device] = name
            order.append(name)
            time.sleep(0.05)
            del held[device]

    threads = []
    for n in range(6):
        threads.append(threading.Thread(target=job, args=(f"job {n}",)))
        threads[-1].start()
        time.sleep(0.01)  # each one in line after the one before
    for thread in threads:
        thread.join(10)
    assert not clash and pool.most_at_once() == 2 and order == [f"job {n}" for n in range(6)]
    stopping.stop_all()  # a sweep's interrupt ends a wait for a set
    try:
        with pool.lease("a"), pool.lease("b"), pytest.raises(KeyboardInterrupt):
            pool.acquire("c")
    finally:
        stopping.reset()


# -- sweeps on logical devices --------------------------------------------------------------------------------------

STUDY = ("experiment=mtp_prompt_logprobs", "lengths=[128,256,512,513,1024]", "samples=1",
         "engine.fault.start_delay_s=1")


def _points(root: Path) -> dict[str, list]:
    """Every job's measured points (length, sample, NLL, verdicts), by run name, from its result."""
    sweep = next((root / "multirun").iterdir())
    found = {}
    for result in sweep.glob("*/result.json"):
        data = json.loads(result.read_text())
        found[data["name"]] = (data.get("transitions"), data.get("status"), sorted(
            (p["length"], p["sample"], round(p["nll"], 9), p["polluted"], p.get("nll_ref"))
            for p in (json.loads(line) for line in (result.parent / "journal.jsonl").read_text().splitlines())
            if p.get("kind") == "point"))
    return found


@pytest.mark.slow
def test_four_devices_run_the_study_side_by_side_with_the_one_device_results(tmp_path):
    rc, one = run_cli(tmp_path / "one", *STUDY, "devices=[0]", multirun=True)
    assert rc == 0, one
    # each request 0.1 s longer: the baseline's search outlasts the variants' engine starts
    rc, four = run_cli(tmp_path / "four", *STUDY, "devices=[0,1,2,3]", "engine.fault.delay_s=0.1", multirun=True)
    assert rc == 0, four
    assert _points(tmp_path / "one") == _points(tmp_path / "four") and len(_points(tmp_path / "four")) == 7
    # a variant measures its own grid while the baseline still measures, not after its transitions are known
    sweep = next((tmp_path / "four" / "multirun").iterdir())
    measured = {int(p.parent.name): [r["time"] for r in map(json.loads, p.read_text().splitlines())
                                     if r.get("kind") == "metrics"] for p in sweep.glob("*/journal.jsonl")}
    assert min(min(times) for index, times in measured.items() if index > 0) < max(measured[0]), measured

    for root, sets in ((tmp_path / "one", 1), (tmp_path / "four", 4)):
        spans = engine_spans(root)
        assert set(spans) == {str(d) for d in range(sets)}, spans  # every engine on a placed device
        assert not overlapping(spans)  # never two engines on one device
        assert most_at_once(spans) == sets  # as many at once as there are devices, no more
        assert len(worker_records(root, "start")) == 8  # the reference, the baseline, 6 variants (one pinned ahead)
    # the reference measured once, on a device of its own, while the first jobs' engines started
    four_starts = worker_records(tmp_path / "four", "start")
    reference = [r for r in four_starts if r["role"] == "reference"]
    assert len(reference) == 1 and all(r["device"] != reference[0]["device"] for r in four_starts[1:4])
    runs = mlflow_runs(tmp_path / "four", role="job")
    assert {r.data.tags["oneknob.device"] for r in runs} == {"0", "1", "2", "3"}
    assert [r.data.tags["oneknob.device"] for r in mlflow_runs(tmp_path / "four", role="reference")] == \
        [reference[0]["device"]]
    report = next((tmp_path / "four" / "multirun").glob("*/report.md")).read_text()
    assert report.count("; its engines on device(s) ") == 7, report
    header = next(line for line in report.splitlines() if line.startswith("- **reference**:"))
    assert header.endswith(f"` on device(s) {reference[0]['device']}"), header  # the reference's own set
    summary = json.loads(next((tmp_path / "four" / "multirun").glob("*/summary.json")).read_text())
    assert {r["device"] for r in summary["runs"]} == {"0", "1", "2", "3"}
    assert "engine ready in" in four and ", device 3)" in four, four
    placement = json.loads(next((tmp_path / "four" / "multirun").glob("*/placement.json")).read_text())
    assert placement["most_at_once"] == 4 and len(placement["leases"]) == 8
    # a job's set goes to the next job once its engines stopped, not after its results and MLflow bookkeeping
    ended = {json.loads((p.parent / "result.json").read_text())["name"]: r["time"]
             for p in sweep.glob("*/journal.jsonl") for r in map(json.loads, p.read_text().splitlines())
             if r.get("kind") == "end"}
    released = {lease["holder"]: lease["released"] for lease in placement["leases"]}
    assert len(ended) == 7 and all(released[name] < ended[name] for name in ended), (released, ended)


def test_the_dry_run_places_every_engine_on_the_gpus_nvidia_smi_lists(tmp_path):
    env = {"PATH": fake_gpus(tmp_path / "bin", 8)}
    rc, out = run_cli(tmp_path, "experiment=mtp_prompt_logprobs", "dry_run=true", multirun=True, env=env)
    assert rc == 0, out
    assert "devices: 8 device(s) (0,1,2,3,4,5,6,7: devices=auto: the 8 GPU(s) nvidia-smi lists)" in out, out
    assert "round 1: reference on device(s) 0" in out and "round 1: runner=\"v2\" on device(s) 7" in out, out
    plan = json.loads(next((tmp_path / "multirun").glob("*/plan.json")).read_text())
    assert plan["devices"]["devices"] == list("01234567")
    assert [e["devices"] for e in plan["devices"]["engines"]] == [[str(d)] for d in range(8)]
    rc, out = run_cli(tmp_path, "experiment=mtp_prompt_logprobs", "dry_run=true", "devices=9", multirun=True,
                      env=env)
    assert rc == 2 and "devices=9: only 8 GPU(s) visible here" in out, out


@pytest.mark.slow
def test_a_hung_engine_frees_its_device_and_sigterm_stops_every_engine_on_every_device(tmp_path):
    sweep = ("lengths=[200,300,600]", "samples=1", "search.suspects=false", "cudagraph.capture=256,384,512",
             "devices=[0,1]")
    # every job's engine hangs at 600 tokens: each fails after its request timeout, and its device runs the next
    rc, out = run_cli(tmp_path / "hung", *sweep, "engine.fault.hang_at_length=600", "engine.request_timeout_s=2",
                      "reference=null", multirun=True)
    assert rc == 1 and "3 of 3 job(s) failed" in out, out
    spans = engine_spans(tmp_path / "hung")
    assert sorted(len(found) for found in spans.values()) == [1, 2] and not overlapping(spans)

    # SIGTERM while three jobs' engines run on three devices, the baseline's hung at 600 (the variants wait for its
    # transitions): each engine ends, each run KILLED, and the rerun resumes from the points measured
    proc = start_cli(tmp_path / "term", *sweep[:-1], "devices=[0,1,2]", "engine.fault.hang_at_length=600",
                     "reference=null", multirun=True)
    try:
        wait_for(lambda: len(worker_records(tmp_path / "term", "start")) == 3 and any(
            "injected hang at length 600" in p.read_text(errors="replace")
            for p in (tmp_path / "term").glob("multirun/*/0/worker.log")), timeout=60, what="three engines")
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = (tmp_path / "term" / "cli.log").read_text()
    assert rc == 143 and "interrupted (SIGTERM)" in out and "Traceback" not in out, out
    started = worker_records(tmp_path / "term", "start")
    stopped = {r["pid"] for r in worker_records(tmp_path / "term", "stop")}
    assert {r["pid"] for r in started} <= stopped and {r["device"] for r in started} == {"0", "1", "2"}
    assert all(not Path(f"/proc/{r['pid']}").exists() for r in started)
    assert {r.info.status for r in mlflow_runs(tmp_path / "term", role="job")} == {"KILLED"}
    rc, out = run_cli(tmp_path / "term", *sweep, "reference=null", multirun=True)
    assert rc == 0 and "2 cached" in out, out  # the baseline's 200 and 300, measured before the hang
