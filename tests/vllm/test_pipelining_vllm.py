"""Requests sent ahead on the real vLLM CPU build: the worker hands the next one to the engine as soon as the
engine is done with the one before (VllmEngine.submit/collect), before it reads and sends that one's answer.

The engine must still hold one request at a time: oneknob's plugin records what every step scheduled, and no step
may hold two requests (two co-scheduled prompts change the step's token count, which is what the seed's bug and
axis=batch are about). The answers must be those of the same requests sent one at a time, bit for bit, the top-k
rows and a greedy continuation included. vLLM's engine core runs in a process of its own here (its default), the
only place the next request can overlap this process's reading of an answer.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from helpers import job_plan

from oneknob.run.executor import Worker

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

LENGTHS = (300, 64, 513, 129, 257, 200)


def _prompt(length: int) -> list[int]:
    return [(i * 31 + length) % 250 + 3 for i in range(length)]


def test_requests_sent_ahead_reach_the_engine_one_at_a_time_and_answer_as_sent_alone(tmp_path):
    plan = job_plan(tmp_path, engine="vllm")
    # the plugin's record of steps lands in the worker's TMPDIR: a short one of the test's own, as vLLM's IPC
    # sockets go there too and pytest's tmp_path under xdist is longer than a socket path may be (107 bytes)
    tmp = Path(tempfile.mkdtemp(prefix="ok-pipe-"))
    env = dict(os.environ, TMPDIR=str(tmp))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    worker = Worker(dict(plan.worker, knobs=plan.knobs), tmp_path / "worker.log", start_timeout_s=600,
                    request_timeout_s=300, env=env)
    try:
        worker.start()
        ahead = worker.score_all([_prompt(n) for n in LENGTHS], topk=2, greedy=3)
        alone = [worker.score(_prompt(n), topk=2, greedy=3) for n in LENGTHS]
        (steps_file,) = tmp.glob("oneknob-vllm-*/steps.jsonl")  # removed when the engine stops
        steps = [json.loads(line) for line in steps_file.read_text().splitlines() if line.strip()]
    finally:
        worker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    for n, a, b in zip(LENGTHS, ahead, alone):
        assert len(a["logprobs"]) == n - 1 and len(a["greedy"]) == 3
        assert (a["logprobs"], list(a["topk"]), a["greedy"], a["greedy_logprobs"]) == \
            (b["logprobs"], list(b["topk"]), b["greedy"], b["greedy_logprobs"]), n
    requests = {rid for step in steps for rid in step["scheduled"]}
    assert len(requests) >= 2 * len(LENGTHS)  # the engine's own warm-up may add its dummy requests
    together = [step["scheduled"] for step in steps if len(step["scheduled"]) > 1]
    assert not together, f"steps that held two requests: {together[:3]}"
