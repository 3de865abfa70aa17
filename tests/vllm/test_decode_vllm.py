"""A decode-only bug in a real vLLM build, found exactly by the decode oracles through the normal CLI (issue 38).

tests/data/decode-fault-from-300.diff is a deliberate bug written for this test: vLLM's V1 runner (which the
CPU runner inherits) samples every token at position >= 300 from its logits rolled by one, so the token flips
and its reported logprob is another token's. Prompt logprobs come from the prefill step's hidden states
(`_get_prompt_logprobs_dict`), so they stay bit-identical. A continuation of 16 tokens after a prompt of L
covers positions L..L+15: every L >= 285 is polluted in what it generates and clean in what it scores, and the
edge is exactly 284|285 with the first divergent position 300. Judged against transformers (the same
checkpoint, outside vLLM), as the issue's user did; the engine core in process (IN_PROCESS).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import IN_PROCESS, RUN_PY, run_python

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PATCH = Path(__file__).parents[1] / "data" / "decode-fault-from-300.diff"


def test_a_decode_only_bug_in_vllm_is_found_exactly_with_prompt_nll_clean(tmp_path):
    done = run_python(
        [str(RUN_PY), "-m", "engine=vllm", f"vllm.patch={PATCH}", "spec.k=0", "runner=v1",
         "reference_engine=transformers", "oracles=[greedy,nll,decode]", "lengths=[128,256,384,512]", "samples=1",
         "search.suspects=false", "explain.followups=0", f"hydra.sweep.dir={tmp_path}/sweep"],
        tmp_path, timeout=1500, env=IN_PROCESS)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    summary = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    (run,) = summary["runs"]
    assert run["oracles"]["nll"]["transitions"] == []  # prompt logprobs untouched
    assert not any(run["oracles"]["nll"]["verdicts"].values())
    for name in ("greedy", "decode"):
        (edge,) = run["oracles"][name]["transitions"]
        assert (edge["lo"], edge["hi"], edge["direction"]) == (284, 285, "clean->polluted"), run["oracles"][name]
        assert edge["first_position"] == 300
    assert run["shape"] != "all clean" and run["headline"].startswith("greedy/decode: clean->polluted at 284|285")
    decode = {int(L): values for L, values in run["decode"].items()}
    assert decode[284]["decode_max_delta"] < 0.05 < decode[285]["decode_max_delta"]  # nats, per generated token
    report = (tmp_path / "sweep" / "report.md").read_text()
    assert "first diverges at position 300" in report and "greedy/decode: 284\\|285 c->p" in report
