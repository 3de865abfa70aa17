"""bisect=true without a real engine: the search on positions, the synthetic max_num_seqs bisection (exact value,
within ceil(log2 N) + 2 engine starts counted from workers.jsonl, summary.json's answer, a rerun from the cache),
two releases with nothing between them (planned), and the refusals (exit 2, nothing started)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from helpers import mlflow_runs, run_cli, worker_records

from oneknob.verdict import search

SYNTHETIC = ["engine.fault.edge=seqs_x_query_len", "lengths=[256]", "samples=1", "search.suspects=false"]


# -- the search on an ordered axis ------------------------------------------------------------------

@pytest.mark.parametrize("size", [2, 3, 5, 8, 100, 256, 1000])
def test_first_change_costs_at_most_log2_plus_two(size):
    for flip in range(1, size):
        probed: list[int] = []

        def outcome(position, flip=flip, probed=probed):
            probed.append(position)
            return "b" if position >= flip else "a"

        found = search.find_boundaries([0, size - 1], outcome, outcomes=None, lowest=0, first_only=True)
        (first,) = found.transitions
        assert (first.lo, first.hi) == (flip - 1, flip)
        assert len(probed) <= math.ceil(math.log2(size)) + 2


def test_first_only_bisects_the_first_change_of_several_labels():
    labels = ["a"] * 10 + ["b"] * 5 + ["c"] * 10  # a non-monotone axis: three outcomes
    found = search.find_boundaries([0, 24], labels.__getitem__, outcomes=None, lowest=0, first_only=True)
    assert found.transitions[0].text == "9|10" and found.verdicts[0] == "a"


def test_lengths_keep_their_rules():
    with pytest.raises(ValueError, match="positive integers"):
        search.check_grid([0, 5])
    assert search.check_grid([0, 5], lowest=0) == [0, 5]
    with pytest.raises(ValueError, match="expected 'polluted' or 'clean'"):
        search.find_boundaries([1, 4], lambda L: "b")


# -- the synthetic engine through the CLI ------------------------------------------------------------

def _summary(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / name / "summary.json").read_text())


def test_max_num_seqs_range_finds_the_exact_value_within_the_start_bound(tmp_path):
    """seqs_x_query_len = max_num_seqs x 4 (K=3): polluted at 256 from max_num_seqs = 64 on, clean to 63."""
    code, out = run_cli(tmp_path, "sched.max_num_seqs=range(1,257)", "bisect=true", "bisect.criterion=polluted_at:256",
                        *SYNTHETIC, f"hydra.sweep.dir={tmp_path}/first", multirun=True)
    assert code == 0, out[-3000:]
    found = _summary(tmp_path, "first")["bisect"]
    bound = math.ceil(math.log2(256)) + 2
    job_starts = worker_records(tmp_path, role="job")
    assert (found["knob"], found["criterion"]) == ("sched.max_num_seqs", "polluted_at:256")
    assert (found["first_end"], found["last_same"], found["first_different"]) == (1, 63, 64)
    assert found["resolved"] and found["candidates"] == 256 and found["bound"] == bound
    assert found["jobs"] == len(job_starts) == found["engine_starts"] <= bound
    assert found["evidence"]["last_same"]["outcome"] == "clean"
    assert found["evidence"]["first_different"]["outcome"] == "polluted"
    assert found["evidence"]["first_different"]["resolved"]["max_num_seqs"] == 64
    assert "largest value still clean at 256: 63; from 64 polluted" in out
    report = (tmp_path / "first" / "report.md").read_text()
    assert "## Bisect" in report and "from 64 polluted" in report
    sweeps = mlflow_runs(tmp_path, role="sweep")
    assert json.loads(sweeps[0].data.tags["oneknob.bisect"])["first_different"] == 64
    assert json.loads(sweeps[0].data.tags["oneknob.followups"])["skipped"].startswith(
        "a bisect=true sweep runs no follow-ups")  # what the report says of every edge left untested
    assert len(mlflow_runs(tmp_path, role="job")) == found["jobs"]  # every probe is a job under the parent

    # a rerun measures nothing: every probe comes from the cache, no engine starts
    code, out = run_cli(tmp_path, "sched.max_num_seqs=range(1,257)", "bisect=true", "bisect.criterion=polluted_at:256",
                        *SYNTHETIC, f"hydra.sweep.dir={tmp_path}/again", multirun=True)
    assert code == 0, out[-3000:]
    again = _summary(tmp_path, "again")["bisect"]
    assert (again["last_same"], again["first_different"], again["engine_starts"]) == (63, 64, 0)
    assert len(worker_records(tmp_path, role="job")) == len(job_starts)


def test_a_list_is_searched_in_its_order_with_the_default_criterion(tmp_path):
    code, out = run_cli(tmp_path, "sched.max_num_seqs=8,16,32,64,128", "bisect=true", *SYNTHETIC,
                        f"hydra.sweep.dir={tmp_path}/list", multirun=True)
    assert code == 0, out[-3000:]
    found = _summary(tmp_path, "list")["bisect"]
    assert (found["criterion"], found["last_same"], found["first_different"]) == ("verdicts", 32, 64)
    assert found["evidence"]["first_different"]["outcome"] == "polluted at 256"
    assert found["engine_starts"] <= math.ceil(math.log2(5)) + 2


def test_the_transition_criterion_compares_where_the_boundary_lies(tmp_path):
    """polluted up to 4 x max_num_seqs: every value moves the transition, so the first different is the second."""
    code, out = run_cli(tmp_path, "sched.max_num_seqs=16,32,64", "bisect=true", "bisect.criterion=transition",
                        "engine.fault.edge=seqs_x_query_len", "lengths=[32,96,200]", "samples=1",
                        "search.suspects=false", f"hydra.sweep.dir={tmp_path}/moved", multirun=True)
    assert code == 0, out[-3000:]
    found = _summary(tmp_path, "moved")["bisect"]
    assert (found["last_same"], found["first_different"]) == (16, 32)
    assert found["evidence"]["last_same"]["outcome"] == "64|65 polluted->clean"
    assert found["evidence"]["first_different"]["outcome"] == "128|129 polluted->clean"
    assert found["jobs"] == 3  # the two ends, then the middle: adjacent to the first end


@pytest.mark.slow  # the plan makes the 0.31.0 environment and asks each release's vLLM to check it
def test_two_releases_have_nothing_between_them(tmp_path):
    """Planned only (the 0.31.0 build takes minutes to make here): two ends, no release between them."""
    code, out = run_cli(tmp_path, "vllm.version=0.31.0,0.32.0", "bisect=true", "dry_run=true", "lengths=[256]",
                        f"hydra.sweep.dir={tmp_path}/releases", multirun=True, engine="vllm", timeout=600)
    assert code == 0, out[-3000:]
    assert "bisect vllm.version over 2 values (0.31.0 .. 0.32.0)" in out and "no release between them" in out
    plan = json.loads((tmp_path / "releases" / "plan.json").read_text())
    assert [job["requested"]["vllm.version"] for job in plan["jobs"]] == ["0.31.0", "0.32.0"]
    assert not worker_records(tmp_path)


# -- refusals: exit 2, nothing started ----------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def small_checkout(tmp_path) -> tuple[Path, list[str]]:
    """A stand-in vLLM checkout: v0.32.0, a Python commit, a csrc/ commit."""
    repo = tmp_path / "vllm-src"
    (repo / "vllm").mkdir(parents=True)
    (repo / "vllm" / "__init__.py").write_text("")
    (repo / "pyproject.toml").write_text("[project]\nname = 'vllm'\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "release")
    _git(repo, "tag", "v0.32.0")
    (repo / "vllm" / "envs.py").write_text("# changed\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "python only")
    (repo / "csrc").mkdir()
    (repo / "csrc" / "cache.cu").write_text("// kernels\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "a kernel")
    return repo, _git(repo, "rev-list", "--reverse", "HEAD").split()


def _refused(tmp_path, *overrides, engine="synthetic"):
    code, out = run_cli(tmp_path, *overrides, f"hydra.sweep.dir={tmp_path}/refused", multirun=True,
                        engine=engine)
    assert code == 2, out[-3000:]
    assert not worker_records(tmp_path) and not (tmp_path / "refused").exists()
    assert not mlflow_runs(tmp_path)
    return out


def test_a_commit_touching_csrc_is_refused_before_anything_starts(tmp_path, small_checkout):
    repo, (release, python_only, kernel) = small_checkout
    out = _refused(tmp_path, f"vllm.commit={release}..{kernel}", f"vllm.source={repo}", "bisect=true", engine="vllm")
    assert f"vllm.commit={kernel[:12]}" in out and "csrc/cache.cu" in out and "vllm.build_from_source=true" in out


@pytest.mark.parametrize("case", ["two knobs", "no list", "criterion", "length", "range outside", "not git",
                                  "range without bisect"])
def test_bad_bisect_input_is_refused(tmp_path, small_checkout, case):
    repo, (release, python_only, kernel) = small_checkout
    overrides, expected = {
        "two knobs": (["sched.max_num_seqs=1,2", "spec.k=1,3", "bisect=true"], "varies 2 knobs"),
        "no list": (["bisect=true"], "bisect=true: no knob has several values to search"),
        "criterion": (["sched.max_num_seqs=1,2", "bisect=true", "bisect.criterion=bogus"],
                      "bisect.criterion=bogus: unknown"),
        "length": (["sched.max_num_seqs=1,2", "bisect=true", "bisect.criterion=polluted_at:300", "lengths=[256]"],
                   "polluted_at needs one of the study's lengths"),
        "range outside": ([f"vllm.commit={release}..deadbeef", f"vllm.source={repo}", "bisect=true"],
                          "vllm.commit=deadbeef"),
        "not git": ([f"vllm.commit={release}..{python_only}", f"vllm.source={repo / 'vllm'}", "bisect=true"],
                    "not a git checkout"),
        "range without bisect": ([f"vllm.commit={release}..{python_only}", f"vllm.source={repo}"],
                                 "a range of commits is searched, not run"),
    }[case]
    out = _refused(tmp_path, *overrides)
    assert expected in out


def test_bisect_without_m_is_refused(tmp_path):
    code, out = run_cli(tmp_path, "sched.max_num_seqs=8", "bisect=true")
    assert code == 2 and "add -m" in out, out[-2000:]
    assert not worker_records(tmp_path)


def test_a_commit_overlay_is_its_python_files_over_the_release(tmp_path, small_checkout):
    from oneknob.provision import commits

    repo, (release, python_only, kernel) = small_checkout
    site = tmp_path / "site"  # a release build's site-packages, as far as the overlay reads it
    (site / "vllm" / "sub").mkdir(parents=True)
    for name in ("__init__.py", "envs.py", "_C.abi3.so", "sub/x.py"):
        (site / "vllm" / name).write_text(f"release {name}\n")
    found = commits.check(str(repo), python_only)
    assert (found.release, found.files, found.compiled_files) == ("0.32.0", ("vllm/envs.py",), ())
    made = commits.ensure(str(repo), found, site, tmp_path / "cache", log=lambda text: None)
    assert made == tmp_path / "cache" / "commits" / f"0.32.0-{python_only}"
    assert commits.overlay_dir(tmp_path / "cache", python_only) == made
    envs, compiled = made / "vllm" / "envs.py", made / "vllm" / "_C.abi3.so"
    assert not envs.is_symlink() and envs.read_text() == "# changed\n"
    assert compiled.is_symlink() and compiled.read_text() == "release _C.abi3.so\n"
    assert (site / "vllm" / "envs.py").read_text() == "release envs.py\n"  # the release is never written to
    assert commits.commit_range(str(repo), f"{release}..{kernel}") == [release, python_only, kernel]
    info = commits.info(str(repo), python_only)
    assert (info["hash"], info["subject"]) == (python_only, "python only") and "1 file changed" in info["stat"]


def test_a_commit_of_the_installed_release_runs_on_this_interpreter_with_its_overlay_first(tmp_path, small_checkout):
    import sys

    from oneknob.engines.vllm.commit import commit_build, release_knobs

    repo, (release, python_only, kernel) = small_checkout
    settings = {"vllm_source": str(repo), "vllm_build_from_source": False}
    python, env = commit_build(python_only, settings, "cpu", str(tmp_path / "cache"), log=lambda text: None)
    overlay = tmp_path / "cache" / "commits" / f"0.32.0-{python_only}"
    assert python == sys.executable and env["PYTHONPATH"].split(":")[0] == str(overlay)
    assert (overlay / "vllm" / "envs.py").read_text() == "# changed\n"
    assert (overlay / "vllm" / "sampling_params.py").is_symlink()  # the installed release's own file
    knob_values = {"vllm.commit": python_only, "vllm.version": None, "vllm.patch": None}
    assert release_knobs(knob_values, str(tmp_path / "cache")) == {"vllm.commit": None, "vllm.version": None,
                                                                   "vllm.patch": None}
