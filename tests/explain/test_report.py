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
from oneknob.explain import repro
from oneknob.record import tags
from oneknob.errors import Refused

LENGTHS = (256, 257, 512, 513, 1024)


def _resolved(capture: int, mode: str = "FULL_AND_PIECEWISE", k: int = 3, emulated: bool = False,
              platform: str = "cpu") -> dict:
    return {"max_capture_size": capture, "capture_sizes": [capture], "cudagraph_mode": mode, "spec_k": k,
            "max_num_seqs": 128, "max_num_batched_tokens": 2048, "spec_method": "mtp", "enforce_eager": False,
            "runner": "v1", "platform": platform, "cudagraph_emulated": emulated}


def _kwargs(requested: dict) -> dict:
    """What VllmEngine.llm_kwargs makes of these knobs (as a run records it in provenance.llm_kwargs)."""
    from oneknob.config import knobs

    made = knobs.engine_args(requested, {"spec_method": "mtp"}).kwargs
    return {"model": "/m/tiny-mtp", "dtype": "float32", "max_model_len": 2048, "seed": 0,
            "gpu_memory_utilization": 0.2, "max_num_batched_tokens": 2048} | made


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
            "provenance": {"engine": "vllm", "vllm": "0.32.0", "torch": "2.13.0+cpu", "cuda": None,
                           "llm_kwargs": _kwargs(requested)},
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
    assert text.startswith("# 512|513 tracks the resolved max capture size; cudagraph.capture=256 moves it "
                           "to 256|257; cudagraph.enforce_eager=true clears it\n\n"
                           f"{report_md.EMULATED}\n\nThe baseline is polluted at 256..512 tokens and clean at "
                           "513..1024: the boundary is 512|513. ")
    header = text.split("\n## What each knob did")[0]
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
    assert text.count("\n- cudagraph.capture=256 moved it to 256|257; the boundary tracks the resolved max "
                      "capture size in these runs (last polluted = it: 512 -> 256)\n") == 1
    assert text.count("\n- cudagraph.enforce_eager=true cleared it\n") == 1
    assert "no exact claim" not in text and "no claim" not in text  # a cleared boundary is said as such


def test_the_mlflow_description_is_the_report_with_links_and_fits(emulated):
    note = publish.parent_note(emulated, ["nll_vs_length.png"])
    plain = report_md.markdown(emulated, ["nll_vs_length.png"], repro=repro.report_lines(emulated, with_script=False))
    route = mlflow_ui.run_route("7", emulated["runs"][0]["run_id"])
    assert f"[{emulated['runs'][0]['run_id']}]({route})" in note
    assert f"![nll_vs_length](get-artifact?path=nll_vs_length.png&run_uuid={'p' * 32})" in note
    unlinked = re.sub(r"\[([0-9a-f]{32})\]\(#/experiments/7/runs/\1\?workflowType=machine_learning\)", r"`\1`", note)
    unlinked = re.sub(r", \[nll against prompt length, the runs overlaid\]\(#/metric/[^)]*\)", "", unlinked)
    unlinked = unlinked.replace(f"get-artifact?path=nll_vs_length.png&run_uuid={'p' * 32}", "nll_vs_length.png")
    before, _ = plain.split(f"\n{report_md.PER_LENGTH}\n")
    # MLflow shows <details> open: each folded block is there, its summary a bold line
    assert unlinked == publish.unfolded(before) + f"\n{report_md.PER_LENGTH}\n\nEach run's table is its own " \
        "description: follow its link in the Runs table above (and all of them are in this run's artifact report.md).\n"
    assert "<details>" not in note
    assert "\n*Transitions of each run, in words: folded, in this run's artifact report.md*\n" in note
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
    assert [p.name for p in written] == ["summary.json", "report.md", "nll_vs_length.png", "boundary_vs_knob.png",
                                         "repro.py"]  # no repro_prompts.json: no sweep dir with plans here
    assert json.loads((tmp_path / "summary.json").read_text())["plots"] == ["nll_vs_length.png", "boundary_vs_knob.png"]
    assert (tmp_path / "report.md").read_text().endswith("| 1024 | 3.000 | 3.000 | +0.000 | clean |\n\n</details>\n")


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


# -- the answer first (issue 60) ------------------------------------------------------------------------------------


def _first_paragraph(text: str) -> str:
    """What a reader sees under the title and the banners: the first paragraph that is no blockquote."""
    return next(p for p in text.split("\n\n")[1:] if not p.startswith(">"))


def test_the_report_opens_with_the_finding_where_the_baseline_is_polluted_and_what_each_knob_did(emulated):
    """Without a tested explanation (summary["conclusions"] empty: no run one knob apart tested it), what the
    boundary coincides with, said as such."""
    text = report_md.markdown(emulated | {"conclusions": []}, [])
    title = text.splitlines()[0]
    assert title == ("# 512|513 coincides with the resolved max capture size; cudagraph.capture=256 moves it to "
                     "256|257; cudagraph.enforce_eager=true clears it")
    first = _first_paragraph(text)
    assert first.startswith("The baseline is polluted at 256..512 tokens and clean at 513..1024: the boundary is "
                            "512|513. cudagraph.capture=256 moved it to 256|257; cudagraph.enforce_eager=true cleared "
                            "it. 512|513 coincides with the resolved max capture size in every run of "
                            "cudagraph.capture (last polluted = it: 512 -> 256)")
    assert " tracks " not in title + first  # untested: said as a coincidence
    assert text.index(first) < text.index("- **compared**")  # the answer before any metadata


def test_claims_per_knob_are_true_to_the_runs_and_never_chain_runs_of_different_knobs():
    summary = _summary(_run("baseline", None, None, 512), _run("spec.k=0", "spec.k", 0, None),
                       _run("spec.k=1", "spec.k", 1, 512),
                       _run("cudagraph.capture=256", "cudagraph.capture", 256, 256, capture=256))
    text = report_md.markdown(summary, [])
    knobs = text.split("## What each knob did\n\n")[1].split("\n\n")[0].splitlines()
    assert knobs[:2] == ["- spec.k=0 cleared it; spec.k=1 left it at 512|513",
                         "- cudagraph.capture=256 moved it to 256|257; the boundary tracks the resolved max "
                         "capture size in these runs (last polluted = it: 512 -> 256)"]
    assert "no claim" not in text and "all measured runs together" not in text  # two knobs: never one chain
    assert ("cudagraph.capture=256 moved it to 256|257; spec.k=0 cleared it; spec.k=1 left it at 512|513."
            in _first_paragraph(text))


def test_one_precision_per_quantity_nll_to_3_decimals_changes_to_2_significant_figures(emulated):
    runs = emulated["runs"]
    for run in runs:  # NLLs that no fixed format would round alike
        for point in run["points"]:
            point["nll"] += 0.0123456
    text = report_md.markdown(analysis.summarize(dict(META), runs), [])
    assert not re.search(r"\b\d+\.\d{4,}\b", text), re.search(r"\b\d+\.\d{4,}\b", text)  # no 4th decimal anywhere
    percents = re.findall(r"[+-]?\d+(?:\.\d+)? %", text.split("## Runs")[1])
    assert percents and all(len(re.sub(r"\D", "", p).lstrip("0")) <= 2 for p in percents), percents


def test_internal_quantity_ids_are_shown_by_their_labels():
    run = _run("baseline", None, None, 512)
    run["suspects"] = {"255": ["grid_stride_edge - 1"], "129": ["sched.max_num_seqs + 1"],
                       "511": ["max_capture_size - 1", "seqs_x_query_len - 1"]}
    text = report_md.markdown(_summary(run), [])
    for internal in ("grid_stride_edge", "seqs_x_query_len", "max_capture_size -"):
        assert internal not in text, internal
    assert ("255 (capture-grid stride edge (steps of 8 below it, 16 from it) - 1), 129 (sched.max_num_seqs + 1), "
            "511 (resolved max capture size - 1, max_num_seqs x (K+1) - 1)") in text


def test_detail_is_folded_and_what_stays_open_fits_a_screen(emulated):
    text = report_md.markdown(emulated, ["nll_vs_length.png"], repro=repro.report_lines(emulated))
    shown = report_md.open_lines(text)
    assert len(shown) <= 80, len(shown)
    folded = text.split("\n## Per prompt length\n")[1]
    assert folded.count("<details>") == folded.count("</details>") == 3  # each run's table, closed
    assert "<summary>baseline: 512|513 p->c (5 lengths)</summary>" in folded
    assert not any(line.startswith("| prompt tokens") for line in shown)
    assert not any(line.startswith("Suspect lengths") for line in shown)


# a follow-up run and the tested explanation the lead's analysis adds (issue 59), in the summary's shape
CONCLUSION = {"run": "baseline", "oracle": None, "transition": "512|513", "relation": "last_polluted",
              "tracks": "max_capture_size", "label": "resolved max capture size", "offset": 0,
              "ruled_out": ["seqs_x_query_len", "batched_tokens_per_query_len"], "untestable": ["grid_stride_edge"],
              "untested": [{"quantity": "default_capture_ceiling", "why": "no knob moves it on this device"}],
              "evidence": ["baseline", "follow-up cudagraph.capture=256"],
              "text": "512|513 tracks the resolved max capture size (offset 0): cudagraph.capture=256 moved it to "
                      "256|257; ruled out: max_num_seqs x (K+1) (sched.max_num_seqs=64), max_num_batched_tokens / "
                      "(K+1) (spec.k=1)"}


def _with_conclusions(summary: dict) -> dict:
    found = json.loads(json.dumps(summary))
    follow = json.loads(json.dumps(next(r for r in found["runs"] if r["name"] == "cudagraph.capture=256")))
    follow.update(name="follow-up cudagraph.capture=256", run_id="f" * 32, followup=True,  # study.followups' name
                  followup_of={"run": "baseline", "knob": "cudagraph.capture", "value": 256, "transition": "512|513",
                               "oracle": None, "quantity": "max_capture_size", "label": "resolved max capture size",
                               "relation": "last_polluted", "offset": 0, "edge": [512, 513], "predicted": [256, 257]})
    found["runs"].append(follow)
    baseline = found["runs"][0]
    baseline["explained"][0]["tested"] = {"tracks": "max_capture_size", "offset": 0,
                                          "ruled_out": ["seqs_x_query_len"], "untestable": ["grid_stride_edge"],
                                          "evidence": ["baseline", "follow-up cudagraph.capture=256"]}
    return found | {"conclusions": [CONCLUSION]}


def test_a_tested_explanation_is_said_as_tracks_with_what_it_ruled_out_and_could_not_test(emulated):
    text = report_md.markdown(_with_conclusions(emulated), [])
    assert text.startswith("# 512|513 tracks the resolved max capture size; cudagraph.capture=256 moves it to 256|257; "
                           "cudagraph.enforce_eager=true clears it\n")
    assert CONCLUSION["text"] in _first_paragraph(text)
    tested = text.split("## Tested explanations\n\n")[1].split("</details>")[0].split("\n\n")[1].splitlines()
    assert tested == [f"- baseline: {CONCLUSION['text']}",
                      "  - untested: vLLM's default capture ceiling: no knob moves it on this device",
                      "  - no knob moves capture-grid stride edge (steps of 8 below it, 16 from it) alone: not "
                      "testable here",
                      "  - evidence: baseline, follow-up cudagraph.capture=256"]
    assert ("Tested: 512|513 tracks the resolved max capture size (offset 0); ruled out: max_num_seqs x (K+1); not "
            "testable here: capture-grid stride edge (steps of 8 below it, 16 from it) (runs baseline, "
            "follow-up cudagraph.capture=256).") in text
    for internal in ("seqs_x_query_len", "grid_stride_edge", "default_capture_ceiling", "batched_tokens_per"):
        assert internal not in text, internal
    # the follow-up as what it is, once: one knob from the run it tests, what it predicted and found; no variant
    knobs = text.split("## What each knob did\n\n")[1].split("\n\n")[0].splitlines()
    assert ("- follow-up cudagraph.capture=256 (one knob from baseline; does 512|513 track the resolved max capture "
            "size? it predicts 256|257): found 256|257, as predicted") in knobs
    assert text.count("it predicts 256|257") == 1
    assert "- **compared**: the baseline and 2 variant(s), each changing one knob: cudagraph.capture, " \
           "cudagraph.enforce_eager; and 1 follow-up run(s) the explanation added, each one knob from the run it " \
           "tests: cudagraph.capture=256 from baseline" in text
    assert "| follow-up cudagraph.capture=256 | 256\\|257 p->c | moved |" in text
    assert "Follow-up X: a run the explanation added, the baseline with X" in text  # the table's legend


def test_a_follow_up_sweep_whose_tests_all_failed_says_so_first_and_per_follow_up(monkeypatch):
    """Every follow-up left the edge where it was: the title says the edge tracks none of what was tested (no
    'the baseline: polluted at'), each follow-up's line says what it predicted and that the edge stayed, and the
    terminal names a follow-up's knob even where no resolved column shows it."""
    baseline = _run("baseline", None, None, 512)
    follow = _run("follow-up model.override.chunk=400", "model.override.chunk", 400, 512) | {
        "followup": True, "followup_of": {"run": "baseline", "knob": "model.override.chunk", "value": 400,
                                          "transition": "512|513", "oracle": None, "quantity": "model.chunk",
                                          "label": "model.chunk", "offset": 0, "predicted": [400, 401]}}
    wide = _run("follow-up engine_args.max_num_batched_tokens=1536", "engine_args.max_num_batched_tokens", 1536,
                512) | {"followup": True, "followup_of": follow["followup_of"] | {
                    "knob": "engine_args.max_num_batched_tokens", "value": 1536}}
    summary = _summary(baseline, _run("runner=\"v2\"", "runner", "v2", None), follow, wide)
    summary["conclusions"] = [{"run": "baseline", "oracle": None, "transition": "512|513", "tracks": None,
                               "label": None, "offset": None, "ruled_out": ["model.chunk"], "untestable": [],
                               "untested": [], "evidence": ["follow-up model.override.chunk=400"],
                               "text": "512|513 does not track model.chunk (follow-up model.override.chunk=400 moved "
                                       "it 512 -> 400; the edge stayed)"}]
    text = report_md.markdown(summary, [])
    assert text.splitlines()[0] == '# 512|513 does not track model.chunk; runner="v2" clears it'
    assert ("- follow-up model.override.chunk=400 (one knob from baseline; does 512|513 track model.chunk? it "
            "predicts 400|401): left it at 512|513, not the predicted 400|401") in text
    assert "- **compared**: the baseline and 1 variant(s), each changing one knob: runner; and 2 follow-up" in text
    row = next(r for r in report_md.rows(summary) if r["cells"]["run"].startswith("follow-up"))
    assert report._differs(row) == "chunk 400"
    from oneknob.console import WrappingConsole

    monkeypatch.delenv("COLUMNS", raising=False)
    console = WrappingConsole(width=200, record=True, highlight=False, soft_wrap=True)  # make_console's, in a pipe
    report.print_table(summary, console)
    lines = console.export_text().splitlines()
    assert all(len(line) <= 120 for line in lines), [line for line in lines if len(line) > 120]
    follow_up_row = next(line for line in lines if line.startswith("follow-up"))
    assert "chunk 400" in follow_up_row and "unchanged" in follow_up_row and "(follow-up of" not in follow_up_row
    assert any(line.startswith("follow-up X: a run the explanation added, the baseline with X") for line in lines)
    # a long name breaks at its space, never inside its knob, and the table stays within 120 columns
    assert any(line.startswith("engine_args.max_num_batched_tokens=1536 ") for line in lines), lines


def test_a_title_without_any_coincidence_names_the_edge_not_the_baseline():
    summary = _summary(_run("baseline", None, None, 512))
    summary["confounds"]["coinciding"], summary["tracks_detail"] = [], {}  # an edge no candidate equals
    assert report_md.markdown(summary, []).splitlines()[0] == "# 512|513 equals no candidate quantity"


# -- repro.py (issue 60): the script from the runs' records, in-process; tests/vllm/test_vllm_cli.py runs one ----------


def _script_namespace(text: str) -> dict:
    namespace = {"__name__": "repro", "__file__": "/nonexistent/repro.py"}
    exec(compile(text, "repro.py", "exec"), namespace)  # noqa: S102 (the script under test; its main is guarded)
    return namespace


def test_repro_builds_the_polluted_and_the_clean_run_from_their_recorded_arguments(emulated):
    text, why = repro.script(emulated)
    assert why == "" and text.endswith('if __name__ == "__main__":\n    sys.exit(main(sys.argv[1:], score))\n')
    imported = set(re.findall(r"^(?:from|import) (\w+)", text, re.M))
    assert imported <= {"__future__", "json", "os", "subprocess", "sys", "pathlib", "vllm", "importlib"}, imported
    assert "oneknob" not in "".join(re.findall(r"^\s*(?:from|import) .*$", text, re.M))
    found = _script_namespace(text)
    runs = {r["name"]: r for r in emulated["runs"]}
    assert found["CONFIGS"]["polluted"]["llm"] == runs["baseline"]["provenance"]["llm_kwargs"]
    assert found["CONFIGS"]["clean"]["llm"] == runs["cudagraph.capture=256"]["provenance"]["llm_kwargs"]
    assert found["CONFIGS"]["polluted"]["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}  # runner=v1, set before import
    reference = found["CONFIGS"]["reference"]  # the study's reference: the baseline's kwargs, the knobs' replaced
    assert reference["llm"] == {"model": "/m/tiny-mtp", "dtype": "float32", "max_model_len": 2048, "seed": 0,
                                "gpu_memory_utilization": 0.2, "max_num_batched_tokens": 2048, "enforce_eager": True}
    assert reference["unset"] == ["VLLM_USE_V2_MODEL_RUNNER"]
    assert (found["SIDES"], found["TOLERANCE"]) == ({"polluted": 512, "clean": 513}, {"nll": 0.1, "rtol": 0.05})
    assert found["EMULATION"] == {"ONEKNOB_VLLM_PLUGIN": '{"emulate_cuda_graphs": true}'}  # CPU: the emulation
    assert "needs oneknob installed beside vLLM" in text


def test_repro_says_reproduced_only_when_the_polluted_side_differs_and_the_clean_side_agrees(emulated, capsys):
    found = _script_namespace(repro.script(emulated)[0])
    judge = found["judge"]
    polluted = {"512": [6.16, 5.2], "513": [5.22, 5.1]}
    clean = {"512": [5.23, 5.2], "513": [5.22, 5.1]}
    assert judge({"polluted": polluted, "clean": clean}, ["polluted", "clean"])  # one sample differs at 512
    assert not judge({"reference": clean, "clean": clean}, ["reference", "clean"])  # two clean configurations
    assert not judge({"polluted": {"512": [6.16], "513": [6.0]}, "clean": {"512": [5.23], "513": [5.22]}},
                     ["polluted", "clean"])  # the clean side differs too: not the study's boundary
    assert not judge({"polluted": {"512": [5.30], "513": [5.22]}, "clean": {"512": [5.23], "513": [5.22]}},
                     ["polluted", "clean"])  # within 0.1 nats
    out = capsys.readouterr().out
    assert " 5.680 " in out  # the mean over the samples (6.16 and 5.2), to 3 decimals


def test_repro_on_a_gpu_needs_nothing_of_oneknob_and_a_server_study_is_vllm_serve_and_http(emulated):
    gpu = json.loads(json.dumps(emulated))
    for run in gpu["runs"]:
        run["resolved"]["platform"], run["emulated"], run["resolved"]["cudagraph_emulated"] = "cuda", False, False
    found = _script_namespace(repro.script(gpu)[0])
    assert found["EMULATION"] == {} and found["emulation_ready"]() is None
    served = json.loads(json.dumps(gpu)) | {"engine": "vllm_server"}
    text = repro.script(served)[0]
    compile(text, "repro.py", "exec")
    assert ("    clean: VLLM_USE_V2_MODEL_RUNNER=0 vllm serve /m/tiny-mtp --dtype float32 --max-model-len 2048 "
            "--seed 0 --gpu-memory-utilization 0.2 --max-num-batched-tokens 2048 --compilation-config "
            """'{"max_cudagraph_capture_size": 256}' --no-enforce-eager --max-num-seqs 128""") in text
    assert "POST /v1/completions" in text and "urllib.request" in text and "from vllm import" not in text
    assert _script_namespace(text)["CONFIGS"]["clean"]["serve"][:2] == ["--model", "/m/tiny-mtp"]


def test_a_synthetic_sweep_writes_no_repro_and_says_why(tmp_path):
    summary = _summary(_run("baseline", None, None, 512, engine="synthetic"))
    written = report.write(summary, tmp_path)
    assert not (tmp_path / "repro.py").exists() and all(p.name != "repro.py" for p in written)
    text = (tmp_path / "report.md").read_text()
    assert "\nNo repro.py: engine=synthetic ran no vLLM (a simulation of its rules)" in text


def test_repro_prompts_come_from_the_sweeps_plans(tmp_path, emulated):
    (tmp_path / "plans").mkdir()
    ids = list(range(2000))
    (tmp_path / "plans" / "0.json").write_text(json.dumps({"corpus": {"fingerprint": "c0",
                                                                      "samples": [ids, ids[::-1], ids]}}))
    found = repro.prompts(emulated, tmp_path)
    assert found == {"corpus": "c0", "samples": [ids[:513], ids[::-1][:513]]}  # 2 samples, up to the longer side
    assert repro.prompts(emulated, tmp_path / "gone") is None


def test_a_title_names_the_oracle_whose_edge_a_follow_up_tested(emulated):
    summary = _with_conclusions(emulated)
    summary["conclusions"] = [CONCLUSION | {"oracle": "greedy"}]
    assert report_md.markdown(summary, []).startswith("# greedy's 512|513 tracks the resolved max capture size; ")


def _three_oracles(run: dict) -> dict:
    """nll and topk judge the run as its combined verdict does; greedy (the generation) is clean everywhere, as in
    the seed's bug (tests/vllm/test_vllm_cli.py's oracles=[nll,topk,greedy])."""
    verdicts = {p["length"]: p["polluted"] for p in run["points"]}
    return run | {"oracles": {"nll": {"verdicts": dict(verdicts), "transitions": run["transitions"]},
                              "topk": {"verdicts": dict(verdicts), "transitions": run["transitions"]},
                              "greedy": {"verdicts": {length: False for length in verdicts}, "transitions": []}}}


def test_oracles_that_agree_are_said_once_and_a_clean_oracle_in_one_line():
    """Where greedy disagrees with nll and topk, the report said everything nll found again for topk (claims,
    "no claim" for a knob whose run cleared it, what each variant did, the coincidences, each run's "Tested:") and
    proposed an experiment the sweep had already run. Now: nll and topk are the combined verdict, said once;
    greedy in one line."""
    summary = _summary(_three_oracles(_run("baseline", None, None, 512)),
                       _three_oracles(_run("cudagraph.capture=256", "cudagraph.capture", 256, 256, capture=256)),
                       _three_oracles(_run("cudagraph.enforce_eager=true", "cudagraph.enforce_eager", True, None)))
    text = report_md.markdown(summary, [])
    assert not [line for line in text.splitlines() if line.startswith(("- nll", "- topk", "  - nll", "  - topk"))]
    assert "no claim" not in text
    assert "\n- greedy: clean at every length of every run\n" in text
    assert text.count("- greedy:") == 2  # that line, and its coincidences: none
    for line in (line for line in text.splitlines() if line.startswith("Tested: ")):
        clauses = line.removeprefix("Tested: ").split("; ")
        assert len(clauses) == len(set(clauses)), line
    assert "(2)</summary>" in text  # the tested explanations: one per run, not one per oracle


def test_no_next_experiment_is_proposed_that_the_sweeps_runs_already_tested():
    """make demo's coincidences: "next experiment: set cudagraph.capture=384 ... would mean it tracks the resolved
    max capture size" under a title saying the runs had tested just that (capture=256 moved the edge, the other
    quantities ruled out). The suggestion as analysis made it there (this grid has no room for its 384|385)."""
    summary = _summary(_run("baseline", None, None, 512),
                       _run("cudagraph.capture=256", "cudagraph.capture", 256, 256, capture=256),
                       _run("sched.max_num_seqs=64", "sched.max_num_seqs", 64, 512))
    kept = {"seqs_x_query_len": 512, "batched_tokens_per_query_len": 512, "default_capture_ceiling": 512}
    summary["confounds"]["suggestion"] = {
        "knob": "cudagraph.capture", "value": 384, "moves": "max_capture_size", "relation": "last_polluted",
        "predicted": {"max_capture_size": 384, **kept}, "baseline": {"max_capture_size": 512, **kept},
        "text": "set cudagraph.capture=384: predicted resolved max capture size 512 -> 384"}
    text = report_md.markdown(summary, [])
    assert "- next experiment: none needed: the runs of this sweep already tested it (512|513 tracks the resolved " \
           "max capture size; see Tested explanations)" in text
    assert "next experiment: set" not in text
    summary["conclusions"] = [c for c in summary["conclusions"] if c["run"] != "baseline"]  # untested: proposed
    assert "- next experiment: set cudagraph.capture=384" in report_md.markdown(summary, [])
