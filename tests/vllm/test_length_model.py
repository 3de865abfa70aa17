"""A real vLLM CPU job judged by a transformers reference that is length-dependent by design (issue 22).

The model (oneknob.provision.length_model) uses longrope RoPE scaling with
rope_scaling.original_max_position_embeddings = L = 256: HF transformers picks short or long RoPE factors per
forward pass from the prompt's length, vLLM once per engine (long, as max_model_len 1024 > L). So the HF
reference's prefix check fails (a 128-token prompt scores differently from the first 128 tokens of a 512-token
one) and the reference is measured per length; the job is then polluted up to L and clean from L + 1, and the
edge coincides with the model's field. One follow-up (explain.followups) moves that field alone with
model.override.<path> (vLLM's hf_overrides, and the same override in the transformers reference): the edge moves
with it, so the report says the transition tracks the field, with offset 0. Two vLLM engine starts (the job's and
the follow-up's) plus the reference.
"""

from __future__ import annotations

import json
import re

import pytest
from helpers import IN_PROCESS, RUN_PY, mlflow_client, run_python

from oneknob.provision import length_model

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

FIELD = "model.rope_scaling.original_max_position_embeddings"


def test_a_transformers_reference_length_dependent_by_design_judges_every_length(tmp_path):
    model = length_model.build(tmp_path / "length-model", threshold=256)
    done = run_python(
        [str(RUN_PY), "-m", "engine=vllm", f"model.path={model}", "model.build=null",
         "model.max_model_len=1024", "spec.k=0", "sched.max_num_seqs=64", "reference_engine=transformers",
         "lengths=[128,384,512]", "samples=1", "oracles=[nll]", f"hydra.sweep.dir={tmp_path}/sweep",
         # the random model's NLL is ~11.6 nats, so the default 5 % relative tolerance (0.58 nats) would hide
         # the ~0.27-nat mean shift below L (per token up to 7 nats); vLLM and HF agree within 2e-5 above L
         "verdict.rtol_nll=0.001"],
        tmp_path, timeout=1500, env=IN_PROCESS)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    said = " ".join(out.split())
    assert f"it changes between 256 and 257: {FIELD} = 256" in said  # why the reference is measured per length
    assert "reference={" not in said  # no vLLM knobs for a transformers reference
    summary = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    run, followup = summary["runs"]
    assert [(t["lo"], t["hi"], t["direction"]) for t in run["transitions"]] == [(256, 257, "polluted->clean")]
    verdicts = {p["length"]: p["polluted"] for p in run["points"]}
    assert all(verdicts[L] for L in verdicts if L <= 256) and not any(verdicts[L] for L in verdicts if L > 256)
    # the edge coincides with the model's field; one follow-up moved that field alone (vLLM's hf_overrides and the
    # same override in the transformers reference) and the edge moved with it: a conclusion, not a coincidence
    override = f"model.override.{FIELD.removeprefix('model.')}"
    assert followup["followup"] and followup["name"] == f"follow-up {override}=192"
    assert followup["requested"][override] == 192 and followup["resolved"]["model_quantities"][FIELD] == 192
    assert [(t["lo"], t["hi"]) for t in followup["transitions"]] == [(192, 193)]
    assert followup["probes"] <= 4  # the predicted edge and the old one, and nothing else: the prediction held
    (conclusion,) = summary["conclusions"]
    assert (conclusion["tracks"], conclusion["offset"], conclusion["evidence"][0]) == (FIELD, 0, followup["name"])
    report = (tmp_path / "sweep" / "report.md").read_text()
    assert f"256|257 tracks {FIELD} with offset 0" in report
    assert f"follow-up 1/3: {override}=192 relative to the baseline: does 256|257 track {FIELD}?" in said
    # vLLM's own warning, without its process prefix, time and [file.py:line]: in the terminal and the report
    assert "Using LongRoPE scaling factors" in report
    assert re.search(r"engine warning: Using LongRoPE scaling factors", said), said[-3000:]
    assert "`reference_engine=transformers` (HF transformers, eager, the same checkpoint), measured per length" \
        in report
    client = mlflow_client(tmp_path)
    job, tagged = sorted((r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
                          if r.data.tags.get("oneknob.role") == "job"), key=lambda r: r.info.start_time)
    assert tagged.data.tags["oneknob.followup"] == "true"
    assert json.loads(tagged.data.tags["oneknob.followup_of"])["quantity"] == FIELD
    assert job.data.params[f"model_config.{FIELD.removeprefix('model.')}"] == "256"
