"""axis=batch on the real vLLM CPU build, the seed's baseline, CUDA graphs emulated (issue 25).

The probe (200 tokens) and one neighbour share a step: the emulated graph pool runs when the step's tokens fit the
resolved max capture size (512), whoever they belong to, so the probe is polluted while probe + neighbour <= 512
and clean from 513 tokens per step; the plugin's record of each step proves they were co-scheduled. One engine
start, on vLLM's defaults (torch.compile on), judged in absolute mode: the probe's mean NLL is 6.26-6.28 polluted
and 5.32 clean on the tiny model (measured against the eager K=0 reference), so verdict.max_nll=5.8 splits them;
a batch point against a reference is test_vllm_server's (through `vllm serve`).
"""

from __future__ import annotations

import json

import pytest
from helpers import RUN_PY, run_python


pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# vLLM's CPU build exactly as `make ablate` runs it: torch.compile on (the suite turns it off elsewhere,
# tests/conftest.py), its engine core and worker in processes of their own. The emulated graph pool wraps the
# compiled model here, and this job's is the suite's one compiled engine.
VLLM_DEFAULTS = {"TORCH_COMPILE_DISABLE": None}


def test_the_probe_is_polluted_while_its_step_fits_the_capture_size(tmp_path):
    done = run_python(
        [str(RUN_PY), "-m", "engine=vllm", "engine.emulate_cuda_graphs=true",
         "engine.max_num_batched_tokens=2048", "samples=1", "reference=null", "oracles=[nll]",
         "verdict.max_nll=5.8", "axis=batch",
         "batch.probe_length=200", "batch.neighbour_lengths=[0,300,400]", f"hydra.sweep.dir={tmp_path}/sweep"],
        tmp_path, timeout=1500, env=VLLM_DEFAULTS)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    summary = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    (run,) = summary["runs"]
    assert run["axis"] == "batch"
    assert [(t["lo"], t["hi"], t["direction"]) for t in run["transitions"]] == [(312, 313, "polluted->clean")]
    points = {p["length"]: p for p in run["points"]}
    assert points[312]["step_tokens"] == 512 and points[313]["step_tokens"] == 513  # one step each, as claimed
    assert all(p["co_scheduled"] for p in points.values()), run.get("schedule_labels")
    resolved = json.loads((tmp_path / "sweep" / "0" / "resolved_config.json").read_text())["vllm"]
    # vLLM's CPU default: the model compiled by Inductor
    assert (resolved["compilation_config.mode"], resolved["compilation_config.backend"]) == ("DYNAMO_TRACE_ONCE",
                                                                                             "inductor")
    report = (tmp_path / "sweep" / "report.md").read_text()
    assert ("312|313 neighbour tokens is 512|513 tokens per step (probe 200 + neighbours); the edge tracks tokens "
            "per step: last polluted 512 = resolved max capture size") in report
