"""report.md, the plots and the MLflow descriptions, rendered from run records like compare.load_run's (no CLI,
no engine): the header a vLLM engineer pastes into an issue, the per-length tables, the labels of a simulation
and of emulated CUDA graphs, plots on one axes where a run without a transition is an absence."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from oneknob.explain import analysis
from oneknob.explain import mlflow_ui
from oneknob.explain import plots
from oneknob.explain import publish
from oneknob.explain import report
from oneknob.explain import report_md
from oneknob.record import tags
from oneknob.errors import Refused

LENGTHS = (256, 257, 512, 513, 1024)


def _resolved(capture: int, mode: str = "FULL_AND_PIECEWISE", k: int = 3, emulated: bool = False,
              platform: str = "cpu") -> dict:
    return {"max_capture_size": capture, "capture_sizes": [capture], "cudagraph_mode": mode, "spec_k": k,
            "max_num_seqs": 128, "max_num_batched_tokens": 2048, "spec_method": "mtp", "enforce_eager": False,
            "runner": "v1", "platform": platform, "cudagraph_emulated": emulated}


def _run(name: str, knob: str | None, value, polluted_upto: int | None, *, emulated: bool = False,
         split: int | None = None, engine: str = "vllm", hardware: dict | None = None, capture: int = 512) -> dict:
    """A measured run: polluted (NLL 4.0 against a reference of 3.0) at lengths <= polluted_upto, clean after;
    `split`: the length where only 1 of its 2 samples is polluted."""
    points = []
    for length in LENGTHS:
        bad = polluted_upto is not None and length <= polluted_upto
        points.append({"length": length, "nll": 4.0 if bad else 3.0, "nll_ref": 3.0,
                       "delta_nll": 1.0 if bad else 0.0, "polluted": bad,
                       "polluted_samples": (1 if length == split else 2) if bad else 0})
    transitions = []
    if polluted_upto is not None:
        hi = LENGTHS[LENGTHS.index(polluted_upto) + 1]
        transitions = [{"lo": polluted_upto, "hi": hi, "direction": "polluted->clean",
                        "resolved": hi == polluted_upto + 1, "polluted_samples": 1 if split == polluted_upto else 2,
                        "samples": 2}]
    requested = {"cudagraph.capture": None, "cudagraph.enforce_eager": False, "sched.max_num_seqs": 128,
                 "spec.k": 3, "runner": "v1"} | ({knob: value} if knob else {})
    return {"run_id": hashlib.md5(name.encode()).hexdigest(), "name": name, "sweep_id": "s1",
            "parent_run_id": "p" * 32, "start_time": 0, "engine": engine, "knob": knob, "value": value,
            "status": "ok", "check": {}, "pinned": {}, "confounded": False, "requested": requested,
            "resolved": _resolved(capture, emulated=emulated), "defaults": {}, "transitions": transitions,
            "samples": 2, "probes": 4, "search": {"max_probes": 64, "bisect": True, "budget_hit": False},
            "points": points, "error": None, "experiment_id": "7",
            "versions": {"vllm": "0.32.0", "torch": "2.13.0+cpu"},
            "provenance": {"engine": "vllm", "vllm": "0.32.0", "torch": "2.13.0+cpu", "cuda": None},
            "hardware": hardware or {"cpu": "Intel(R) Xeon(R) Processor", "machine": "x86_64"},
            "model": {"path": "/m/tiny-mtp", "fingerprint": "abcd1234"},
            "reference": {"knobs": {"cudagraph.enforce_eager": True, "spec.k": 0, "runner": None},
                          "run_id": "r" * 32},
            "verdict": {"tol_nll": 0.1, "rtol_nll": 0.05}, "corpus": {"source": "python-stdlib", "fingerprint": "c0"},
            "emulated": emulated, "git": {"commit": "0123456789abcdef", "dirty": False}, "tags": ["bisect-53488"]}


META = {"sweep_id": "s1", "parent_run_id": "p" * 32, "sweep_dir": None, "run_ids": None, "skipped": [],
        "command": "python run.py -m experiment=mtp_prompt_logprobs", "experiment": {"id": "7", "name": "oneknob"}}


def _summary(*runs: dict) -> dict:
    return analysis.summarize(dict(META), list(runs))


@pytest.fixture
def emulated():
    return _summary(_run("baseline", None, None, 512, emulated=True, split=256),
                    _run("cudagraph.capture=256", "cudagraph.capture", 256, 256, emulated=True, capture=256),
                    _run("cudagraph.enforce_eager=true", "cudagraph.enforce_eager", True, None))


def test_header_says_what_ran_where_and_how_to_reproduce_it(emulated):
    text = report_md.markdown(emulated, [])
    assert text.startswith("# oneknob: cudagraph.capture, cudagraph.enforce_eager (sweep `s1`)\n\n"
                           f"{report_md.EMULATED}\n\n")
    header = text.split("\n## Result")[0]
    for line in ("- **compared**: the baseline and 2 variant(s), each changing one knob: cudagraph.capture, "
                 "cudagraph.enforce_eager",
                 "- **engine**: vllm, emulated CUDA graphs (CPU)",
                 "- **versions**: vLLM 0.32.0, torch 2.13.0+cpu, CUDA none (CPU build)",
                 "- **device**: CPU: Intel(R) Xeon(R) Processor (x86_64); emulated CUDA graphs (CPU)",
                 "- **model**: `/m/tiny-mtp` (fingerprint `abcd1234`)",
                 f"- **reference**: `cudagraph.enforce_eager=true spec.k=0` (other knobs at the engine's defaults), "
                 f"measured once at the longest length, run `{'r' * 32}`",
                 "- **verdict**: polluted when \\|NLL - NLL ref\\| > 0.1 nats and > 5 % of NLL ref; a length is "
                 "polluted when any sample is",
                 "- **reproduce**: `python run.py -m experiment=mtp_prompt_logprobs` at oneknob `0123456789ab`",
                 f"- **MLflow**: experiment `oneknob`, parent run `{'p' * 32}`",
                 "- **tags**: bisect-53488"):
        assert f"\n{line}\n" in header, line
    assert "SIMULATION" not in text and "GPU:" not in text


def test_emulated_runs_are_labelled_in_their_rows_and_sections_and_never_as_a_gpu_result(emulated):
    text = report_md.markdown(emulated, [])
    row = next(line for line in text.splitlines() if line.startswith("| baseline |"))
    assert "| FULL_AND_PIECEWISE, emulated CUDA graphs (CPU) |" in row
    eager = next(line for line in text.splitlines() if line.startswith("| cudagraph.enforce_eager=true |"))
    assert "emulated" not in eager  # that run had no graphs to emulate
    assert f"Status ok, emulated CUDA graphs (CPU); MLflow run `{emulated['runs'][0]['run_id']}`." in text


def test_a_simulation_says_so_first():
    summary = _summary(_run("baseline", None, None, 512, engine="synthetic"))
    text = report_md.markdown(summary, [])
    assert text.split("\n")[2] == report_md.SIMULATION
    assert "- **engine**: synthetic: a SIMULATION of vLLM's rules (no model, no GPU)\n" in text
    assert "- **model**:" not in text  # no model ran


def test_a_gpu_run_names_the_gpu():
    gpu = {"gpu": "NVIDIA H200", "gpu_count": "1", "driver": "570.1", "memory_gib": "141", "compute_capability": "9.0"}
    text = report_md.markdown(_summary(_run("baseline", None, None, 512, hardware=gpu)), [])
    assert "- **device**: GPU: NVIDIA H200, 141 GiB, compute capability 9.0, driver 570.1\n" in text


def test_per_length_table_is_the_seeds_with_samples_aggregated(emulated):
    text = report_md.markdown(emulated, [])
    section = text.split("### baseline: 512|513 p->c\n")[1].split("\n### ")[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert table == ["| prompt tokens | mean NLL | NLL ref | delta | verdict |",
                     "|---:|---:|---:|---:|---|",
                     "| 256 | 4.000 | 3.000 | +1.000 | polluted in 1 of 2 samples |",
                     "| 257 | 4.000 | 3.000 | +1.000 | polluted |",
                     "| **512** | 4.000 | 3.000 | +1.000 | polluted |",
                     "| **513** | 3.000 | 3.000 | +0.000 | clean |",
                     "| 1024 | 3.000 | 3.000 | +0.000 | clean |"]
    assert "Versus the baseline: moved: 512|513 -> 256|257" in text


def test_comparison_and_confounds_appear_once(emulated):
    text = report_md.markdown(emulated, [])
    confounds = emulated["confounds"]["transitions"][0]["text"]
    assert text.count(confounds) == 1
    assert text.count("moved versus the baseline: cudagraph.capture=256") == 1
    assert text.count("cleared versus the baseline: cudagraph.enforce_eager=true") == 1
    assert "no exact claim" not in text  # enforce_eager's lone boundary: said by "cleared", not twice


def test_the_mlflow_description_is_the_report_with_links_and_fits(emulated):
    note = publish.parent_note(emulated, ["nll_vs_length.png"])
    plain = report_md.markdown(emulated, ["nll_vs_length.png"])
    route = mlflow_ui.run_route("7", emulated["runs"][0]["run_id"])
    assert f"[{emulated['runs'][0]['run_id']}]({route})" in note
    assert f"![nll_vs_length](get-artifact?path=nll_vs_length.png&run_uuid={'p' * 32})" in note
    unlinked = re.sub(r"\[([0-9a-f]{32})\]\(#/experiments/7/runs/\1\?workflowType=machine_learning\)", r"`\1`", note)
    unlinked = re.sub(r", \[nll against prompt length, the runs overlaid\]\(#/metric/[^)]*\)", "", unlinked)
    unlinked = unlinked.replace(f"get-artifact?path=nll_vs_length.png&run_uuid={'p' * 32}", "nll_vs_length.png")
    before, _ = plain.split(f"\n{report_md.PER_LENGTH}\n")
    assert unlinked == before + f"\n{report_md.PER_LENGTH}\n\nEach run's table is its own description: follow its " \
                                "link in the Runs table above (and all of them are in this run's artifact report.md).\n"
    job = publish.job_note(emulated, emulated["runs"][1])
    assert "| **256** | 4.000 | 3.000 | +1.000 | polluted |" in job and "[reference run](" in job
    assert len(note) <= publish.NOTE_LIMIT


def test_a_description_too_long_for_mlflow_is_cut_at_a_heading_and_says_so():
    text = "# t\n\n" + "".join(f"## part {i}\n\n{'x' * 900}\n\n" for i in range(12))
    cut = publish.fit(text)
    assert len(cut) <= publish.NOTE_LIMIT and cut.endswith(publish.CUT.format(limit=publish.NOTE_LIMIT))
    assert cut.rsplit("\n\n*Cut", 1)[0].endswith("x" * 900)  # whole sections only


def test_the_nll_plot_overlays_every_run_on_one_axes_with_its_transitions(emulated):
    fig = plots.nll_figure(emulated, tolerance=0.1)
    (ax,) = fig.axes
    curves = [line for line in ax.get_lines() if len(line.get_xdata()) == len(LENGTHS)]
    assert [c.get_label() for c in curves] == ["baseline: 512|513 p->c", "cudagraph.capture=256: 256|257 p->c",
                                               "cudagraph.enforce_eager=true: no transition"]
    assert list(curves[0].get_ydata()) == [1.0, 1.0, 1.0, 0.0, 0.0]  # delta NLL
    marks = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":")
    assert marks == [256.5, 512.5]  # one dotted line per transition, none for the flat run


def test_a_run_without_a_transition_is_no_point_in_the_boundary_plot(emulated):
    fig = plots.boundary_figure(emulated)
    (ax,) = fig.axes
    measured = next(line for line in ax.get_lines() if line.get_label().startswith("measured"))
    assert list(measured.get_xdata()) == [0, 1] and list(measured.get_ydata()) == [512, 256]
    assert all(0 not in list(line.get_ydata()) for line in ax.get_lines())  # no transition is never drawn as 0
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["baseline", "cudagraph.capture=256", "cudagraph.enforce_eager=true\n(no transition)"]


def test_write_renders_files_and_report_module_prints_nothing_else(tmp_path, emulated):
    written = report.write(emulated, tmp_path)
    assert [p.name for p in written] == ["summary.json", "report.md", "nll_vs_length.png", "boundary_vs_knob.png"]
    assert json.loads((tmp_path / "summary.json").read_text())["plots"] == ["nll_vs_length.png", "boundary_vs_knob.png"]
    assert (tmp_path / "report.md").read_text().endswith("| 1024 | 3.000 | 3.000 | +0.000 | clean |\n")


def test_user_tags_become_mlflow_tags_and_bad_names_are_refused():
    assert tags.user_tags(["bisect-53488", "owner=alice"]) == {
        "bisect-53488": "", "owner": "alice", "oneknob.tags": '["bisect-53488", "owner=alice"]'}
    # ':' is what Hydra's command line takes unquoted; the first separator splits, the value keeps the rest
    assert tags.user_tags(["owner:alice", "url:http://x=1"]) == {
        "owner": "alice", "url": "http://x=1", "oneknob.tags": '["owner:alice", "url:http://x=1"]'}
    assert tags.user_tags([]) == {}
    with pytest.raises(Refused, match=r"^tags=\[mlflow\.note\.content=x\]: names starting with mlflow\. or "):
        tags.user_tags(["mlflow.note.content=x"])
    with pytest.raises(Refused, match=r"^tags=\[a\|b\]: an MLflow tag name is 1 to 250"):
        tags.user_tags(["a|b"])
    assert tags.from_params({"resolved.cudagraph_emulated": True}) == {"oneknob.emulated": "true"}
    assert tags.from_params({"resolved.cudagraph_emulated": "false"}) == {}


def test_ui_addresses():
    assert mlflow_ui.ui_base("sqlite:////x/mlflow.db") == "http://127.0.0.1:5000"
    assert mlflow_ui.ui_base("http://10.0.0.1:5000/") == "http://10.0.0.1:5000"
    assert mlflow_ui.runs_url("http://h", "3") == "http://h/#/experiments/3/runs?workflowType=machine_learning"
    url = mlflow_ui.metric_url("http://h", "3", ["a", "b"])
    assert url.startswith("http://h/#/metric/nll?runs=%5B%22a%22%2C%20%22b%22%5D&metric=%22nll%22&experiments=")
    assert url.endswith("&workflowType=machine_learning")


def test_every_run_gets_the_commit_the_users_tags_and_the_tags_its_params_imply(tmp_path):
    from helpers import mlflow_client, seed_store

    from oneknob.record.journaled import JournaledTracker
    from oneknob.record.tracking import EXPERIMENT_KIND, TRAINING

    seed_store(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    client = mlflow_client(tmp_path)
    older = client.create_experiment("made-by-an-older-oneknob")
    tracker = JournaledTracker(tmp_path / "journal.jsonl", uri, "made-by-an-older-oneknob",
                               tags=tags.user_tags(["bisect-53488"]))
    assert client.get_experiment(older).tags[EXPERIMENT_KIND] == TRAINING
    run_id = tracker.start_run("baseline", {"oneknob.role": "job"})
    tracker.log_params(run_id, {"resolved.cudagraph_emulated": True, "knob.spec.k": 3})
    tracker.finish(run_id)
    found = client.get_run(run_id).data.tags
    assert found["mlflow.source.git.commit"] == tags.git()["mlflow.source.git.commit"]
    assert len(found["mlflow.source.git.commit"]) == 40
    assert (found["bisect-53488"], found["oneknob.tags"], found["oneknob.emulated"]) == ("", '["bisect-53488"]', "true")
    fresh = JournaledTracker(tmp_path / "journal2.jsonl", uri, "new-experiment")
    assert client.get_experiment(fresh.experiment_id).tags[EXPERIMENT_KIND] == TRAINING
