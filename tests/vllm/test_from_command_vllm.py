"""from_command on the real vLLM CPU engine, emulated CUDA graphs, the tiny MTP model: the issue's line.

`vllm serve models/tiny-mtp --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}' --max-num-seqs
128 --max-num-batched-tokens 4096 --enable-prefix-caching`, read by vLLM 0.32.0's own parser. drop=each: resetting
speculative_config clears the corruption, the other flags do not (--max-num-seqs 128 is the CPU server's default:
listed, not ablated); then drop=minimal on the same cache returns speculative_config alone, reusing drop=each's
jobs. Three lengths around the seed's 512|513, one sample, absolute mode (no reference start): on this model the
polluted side's mean NLL is >= 6.15 and the clean side's <= 5.26 (tests/vllm/test_bisect_vllm.py), so
verdict.max_nll=5.7 splits them.
"""

from __future__ import annotations

import json
import time

import pytest
from helpers import IN_PROCESS, RUN_PY, run_python

from oneknob.config.schema import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

LINE = (f"vllm serve {REPO_ROOT / 'models' / 'tiny-mtp'} --speculative-config "
        "'{\"method\": \"mtp\", \"num_speculative_tokens\": 3}' --max-num-seqs 128 --max-num-batched-tokens 4096 "
        "--enable-prefix-caching")
COMMON = ["engine=vllm", "engine.emulate_cuda_graphs=true", "lengths=[256,512,600]", "samples=1", "reference=null",
          "oracles=[nll]", "verdict.max_nll=5.7", "search.suspects=false", "search.bisect=false"]


def test_the_reporters_line_reduces_to_speculative_config(tmp_path):
    started = time.time()
    done = run_python([str(RUN_PY), "-m", f"from_command={LINE}", "from_command.drop=each", *COMMON,
                       f"hydra.sweep.dir={tmp_path}/each"], tmp_path, timeout=1800, env=IN_PROCESS)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    each_s = time.time() - started
    found = json.loads((tmp_path / "each" / "summary.json").read_text())["from_command"]
    assert found["baseline"] == "polluted at 256,512"
    assert found["flags"]["max_num_seqs"]["status"] == "default"  # the CPU server's own 128
    assert found["each"]["speculative_config"] == "cleared"
    assert all(relation in ("unchanged", "no-op") for name, relation in found["each"].items()
               if name != "speculative_config"), found["each"]
    report = (tmp_path / "each" / "report.md").read_text()
    assert '| `--speculative-config` | {"method": "mtp", "num_speculative_tokens": 3} | null | cleared |' in report

    started = time.time()
    done = run_python([str(RUN_PY), "-m", f"from_command={LINE}", "from_command.drop=minimal", *COMMON,
                       f"hydra.sweep.dir={tmp_path}/minimal"], tmp_path, timeout=1800, env=IN_PROCESS)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    minimal_s = time.time() - started
    found = json.loads((tmp_path / "minimal" / "summary.json").read_text())["from_command"]
    assert found["minimal"] == ["speculative_config"], found["probes"]
    assert found["minimal_line"].endswith("--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 3}'")
    assert done.stderr.rstrip().splitlines()[-1] == f"minimal line: {found['minimal_line']}"  # the terminal's
    # every flag reset, then speculative_config alone: the rest are drop=each's jobs, from the cache
    assert found["engine_starts"] == 2 <= found["bound"]
    print(f"drop=each {each_s:.0f} s; drop=minimal {minimal_s:.0f} s, {found['jobs']} jobs, "
          f"{found['engine_starts']} engine starts: {found['probes']}")
