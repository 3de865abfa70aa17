"""Issue 39: a field of the model's config.json as a knob, `model.override.<path>=VALUE`.

The pure parts (the check against config.json, vLLM's hf_overrides, the next experiment's choice), refusals through
the CLI, one synthetic sweep end to end (the ambiguous case: the baseline's 256|257 is both 2 x max_num_seqs x (K+1)
and a model field; the proposed model-field run is then run and followed), and one short real-vLLM sweep.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from helpers import IN_PROCESS, mlflow_runs, run_cli

from oneknob.config import knobs, model_override, resolution
from oneknob.engines.vllm.engine import VllmEngine
from oneknob.engines.vllm.server import server_flags
from oneknob.explain import confounds
from oneknob.plan import single_variable as sv
from oneknob.provision import provenance

FIELD = "rope_scaling.original_max_position_embeddings"
KNOB = f"model.override.{FIELD}"
CONFIG = {"model_type": "qwen2", "max_position_embeddings": 4096, "rope_theta": 10000.0, "tie_word_embeddings": False,
          "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
          "sliding_window": None, "architectures": ["MiMoForCausalLM"]}


def test_the_path_must_exist_in_config_json_and_the_value_must_have_its_type():
    where = "the config.json of m"
    assert model_override.problem(CONFIG, FIELD, 300, where) is None
    assert model_override.problem(CONFIG, "rope_theta", 20000, where) is None  # an integer for a float field
    assert model_override.problem(CONFIG, "sliding_window", 512, where) is None  # a null field takes anything
    assert model_override.problem(CONFIG, "max_position_embeddings", None, where) is None  # null: no override
    assert model_override.problem(CONFIG, "rope_scaling.original_max_position_embedding", 300, where) == (
        "model.override.rope_scaling.original_max_position_embedding=300: the config.json of m has no field "
        "rope_scaling.original_max_position_embedding; did you mean "
        "model.override.rope_scaling.original_max_position_embeddings?")
    assert model_override.problem(CONFIG, "max_position_embeddings", 2048.5, where) == (
        "model.override.max_position_embeddings=2048.5: max_position_embeddings is an integer in the config.json "
        "of m (4096), so it takes an integer, not a number; e.g. model.override.max_position_embeddings=4096 is the "
        "checkpoint's own value (null: no override)")
    assert "takes true or false, not an integer" in model_override.problem(CONFIG, "tie_word_embeddings", 1, where)
    assert "takes an integer, not true or false" in model_override.problem(CONFIG, "max_position_embeddings", True,
                                                                          where)
    assert model_override.problem(CONFIG, "rope_scaling", 2, where).endswith(
        "rope_scaling is a mapping in the config.json of m; override one of its fields: "
        "model.override.rope_scaling.rope_type, model.override.rope_scaling.factor, "
        "model.override.rope_scaling.original_max_position_embeddings")
    assert "rope_theta is a number in the config.json of m (10000.0), not a mapping with fields; set " \
           "model.override.rope_theta itself" in model_override.problem(CONFIG, "rope_theta.x", 1, where)
    assert "is not on this machine" in model_override.problem(None, "max_position_embeddings", 1, "org/model")


def test_vllm_gets_a_nested_field_with_its_siblings_and_every_reader_the_same_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    spec = {"knobs": {"spec.k": 0, KNOB: 300, "model.override.max_position_embeddings": None},
            "settings": {"spec_method": "mtp"}, "model": {"path": str(tmp_path), "dtype": "auto", "max_model_len": 64}}
    kwargs, _ = VllmEngine().llm_kwargs(spec)
    # vLLM sets a mapping it is given as a whole: the field goes with its siblings; a null override is none
    assert kwargs["hf_overrides"] == {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 300}}
    flags = server_flags(kwargs)  # vllm serve: the same mapping as JSON
    assert flags[flags.index("--hf-overrides") + 1] == json.dumps(kwargs["hf_overrides"], sort_keys=True)
    assert "hf_overrides" not in VllmEngine().llm_kwargs(dict(spec, knobs={"spec.k": 0}))[0]
    # the model's length fields (candidates, suspect lengths) and its fingerprint follow the override
    after = model_override.applied(CONFIG, model_override.of(spec["knobs"]))
    assert after["rope_scaling"]["original_max_position_embeddings"] == 300 and CONFIG["rope_scaling"][
        "original_max_position_embeddings"] == 256  # a copy: the checkpoint's config is never changed
    base = provenance.model_fingerprint(str(tmp_path))
    assert provenance.model_fingerprint(str(tmp_path), {FIELD: 300}) == f"{base}+{model_override.digest({FIELD: 300})}"
    assert provenance.model_fingerprint(str(tmp_path), {FIELD: 300}) != provenance.model_fingerprint(
        str(tmp_path), {FIELD: 400})


def test_it_is_a_family_knob_on_the_command_line_and_in_ablation_blocks():
    assert knobs.is_knob(KNOB) and not knobs.is_knob("model.override.a-b") and not knobs.is_knob("model.path")
    assert sv.force_add_families([f"{KNOB}=300,400", "model.max_model_len=4096"]) == [
        f"++{KNOB}=300,400", "model.max_model_len=4096"]
    shape = sv.sweep_shape([f"{KNOB}=300,400", "samples=1"])
    assert shape.knob == KNOB and shape.values == ["300", "400"]
    with pytest.raises(sv.GuardError, match="varies 2 knobs"):
        sv.sweep_shape([f"{KNOB}=300,400", "spec.k=0,1"])
    with pytest.raises(sv.GuardError, match=f"'\\+' on {KNOB} is refused"):
        sv.check_prefixes(sv.parse([f"+{KNOB}=300"]))
    # the guard's own suggestion for two knobs ('+ablation.<key>=[...]') nests them: both forms flatten alike
    assert knobs.flatten({"model": {"override": {"rope_scaling": {"original_max_position_embeddings": [300]}}}}) \
        == knobs.flatten({KNOB: [300]}) == {KNOB: [300]}
    with pytest.raises(knobs.KnobError, match="'model.path' is not a knob"):
        knobs.flatten({"model": {"path": "x"}})
    with pytest.raises(knobs.KnobError, match="engine_args.hf_overrides=.*model.override.<path>=VALUE"):
        knobs.check("engine_args.hf_overrides", {"max_position_embeddings": 1})


def test_the_reference_runs_the_jobs_model_overrides():
    from omegaconf import OmegaConf

    from oneknob.plan import checks

    cfg = OmegaConf.create({"reference": {"cudagraph": {"enforce_eager": True}, "spec": {"k": 0}},
                            "reference_engine": "vllm"})
    job = {k.key: k.default for k in knobs.KNOBS.values()} | {KNOB: 300, "model.override.max_position_embeddings": None}
    reference = checks.reference_knobs(cfg, job)
    assert reference[KNOB] == 300 and "model.override.max_position_embeddings" not in reference
    assert reference["spec.k"] == 0 and reference["cudagraph.enforce_eager"] is True


@pytest.mark.slow  # torch and transformers imported in the test process (8-60 s here, with the machine's load)
def test_transformers_scores_the_overridden_config(tmp_path):
    """The reference outside vLLM builds the checkpoint from its config.json with the field changed."""
    from oneknob.config.schema import REPO_ROOT
    from oneknob.engines.transformers import TransformersEngine

    engine = TransformersEngine()
    engine.start({"knobs": {"model.override.max_position_embeddings": 3000}, "seed": 0,
                  "model": {"path": str(REPO_ROOT / "models" / "tiny-mtp"), "dtype": "float32"}})
    assert engine.model.config.max_position_embeddings == 3000
    assert engine.resolved_config()["model_config.max_position_embeddings"] == 3000
    assert len(engine.score(list(range(1, 9)))["logprobs"]) == 7
    engine.close()


# -- the next experiment: a model field is a knob a suggestion may turn ------------------------------------------

predict = functools.partial(resolution.predict, max_num_batched_tokens=2048)
AMBIGUOUS = {"sched.max_num_seqs": 32, "spec.k": 3, "cudagraph.capture": 512}  # 2 x 32 x 4 = 256, capture pinned


def _with_model(value: int) -> dict:
    return predict(AMBIGUOUS) | {"model_quantities": {f"model.{FIELD}": value, "model.max_position_embeddings": 4096}}


def test_a_coinciding_model_field_is_moved_by_its_own_knob_before_the_scheduler():
    down = {"lo": 256, "hi": 257, "direction": "polluted->clean", "resolved": True}
    report = confounds.confound_report(AMBIGUOUS, _with_model(256), [down], predict)
    assert report["ambiguous"]
    suggestion = report["suggestion"]
    # both the model field and max_num_seqs move exactly one coinciding candidate: the model field's knob moves
    # nothing in the engine, so it comes first; max_num_seqs stays an alternative
    assert (suggestion["knob"], suggestion["value"], suggestion["moves"]) == (KNOB, 192, f"model.{FIELD}")
    assert suggestion["predicted"] == {"twice_seqs_x_query_len": 256, "grid_stride_edge": 256, f"model.{FIELD}": 192}
    assert ("sched.max_num_seqs", 24, "twice_seqs_x_query_len") in [
        (a["knob"], a["value"], a["moves"]) for a in suggestion["alternatives"]]
    assert suggestion["text"].startswith(f"set {KNOB}=192: predicted model.{FIELD} 256 -> 192, while 2 x "
                                         "max_num_seqs x (K+1) (256)")
    # a model field that does not coincide is no candidate: the scheduler knob is proposed, as before
    other = confounds.confound_report(AMBIGUOUS, _with_model(300), [down], predict)["suggestion"]
    assert other["knob"] == "sched.max_num_seqs" and other["moves"] == "twice_seqs_x_query_len"
    # where the capture size coincides too, moving it stays the first choice
    free = {"sched.max_num_seqs": 32, "spec.k": 3}
    capture = confounds.confound_report(free, predict(free) | {"model_quantities": {f"model.{FIELD}": 256}},
                                        [down], predict)["suggestion"]
    assert capture["knob"] == "cudagraph.capture" and KNOB in [a["knob"] for a in capture["alternatives"]]


# -- through the CLI -----------------------------------------------------------------------------------------------

SIMULATED = "+engine.fault.model_config={rope_scaling:{original_max_position_embeddings:256}," \
            "max_position_embeddings:4096}"


@pytest.mark.parametrize("engine, overrides, expected", [
    ("vllm", ["model.override.max_position_embedding=3000"],
     "model.override.max_position_embedding=3000: the config.json of {models}/tiny-mtp has no field "
     "max_position_embedding; did you mean model.override.max_position_embeddings?"),
    ("vllm", ["model.override.max_position_embeddings=3000.5"],
     "model.override.max_position_embeddings=3000.5: max_position_embeddings is an integer in the config.json of "
     "{models}/tiny-mtp (4096), so it takes an integer, not a number"),
    ("synthetic", [SIMULATED, f"{KNOB}=big,300"],
     f"{KNOB}=\"big\": rope_scaling.original_max_position_embeddings is an integer in engine.fault.model_config (the "
     "synthetic engine's simulated config.json) (256), so it takes an integer, not a string"),
    ("synthetic", ["model.override.max_position_embeddings=3000"],
     "model.override.max_position_embeddings=3000: engine.fault.model_config (the synthetic engine's simulated "
     "config.json) has no field max_position_embeddings; it declares no field"),
    ("synthetic", [SIMULATED, "engine.fault.edge=model.rope_scaling.factor"],
     "engine.fault.edge=model.rope_scaling.factor: not a quantity of the resolved config or a length field of "
     "engine.fault.model_config"),
])
def test_bad_overrides_are_refused_before_any_engine(tmp_path, engine, overrides, expected):
    from oneknob.config.schema import REPO_ROOT

    rc, out = run_cli(tmp_path, *overrides, "samples=1", "lengths=[128]", multirun=True, engine=engine)
    assert rc == 2, out
    flat = " ".join(out.split())
    assert expected.format(models=REPO_ROOT / "models") in flat
    assert "nothing was started" in flat or "no run was recorded" in flat
    assert not list(Path(tmp_path).glob("**/worker.log"))


def test_a_model_field_sweep_on_the_synthetic_engine_end_to_end(tmp_path):
    """The ambiguous baseline (256|257 = 2 x max_num_seqs x (K+1) = a model field), swept with the value the next
    experiment proposes: the simulated fault follows the model field, so the variant flips at 192|193, the claim
    says it tracks that field, and the report checks the proposal it made against the run."""
    rc, out = run_cli(tmp_path, SIMULATED, f"engine.fault.edge=model.{FIELD}", "sched.max_num_seqs=32",
                      "cudagraph.capture=512", f"{KNOB}=null,192", "lengths=[128,256,384]", "samples=1",
                      multirun=True)
    assert rc == 0, out
    (path,) = Path(tmp_path).glob("multirun/*/summary.json")
    summary, report = json.loads(path.read_text()), (path.parent / "report.md").read_text()
    runs = {r["name"]: r for r in summary["runs"]}
    base, variant = runs["baseline"], runs[f"{KNOB}=192"]
    assert [(t["lo"], t["hi"]) for t in base["transitions"]] == [(256, 257)]
    assert [(t["lo"], t["hi"]) for t in variant["transitions"]] == [(192, 193)]
    assert variant["check"]["status"] == "ok"  # the override moved its own field, nothing else
    # the suspect lengths and the candidate follow the overridden value
    assert {"191", "192", "193"} <= set(variant["suspects"]) and "192" not in base["suspects"]
    assert variant["resolved"]["model_quantities"][f"model.{FIELD}"] == 192
    assert base["resolved"]["model_quantities"][f"model.{FIELD}"] == 256
    # the fingerprint and the reference follow the job's model
    assert base["model"]["fingerprint"] == "synthetic" and variant["model"]["fingerprint"].startswith("synthetic+")
    assert KNOB not in base["reference"]["knobs"] and variant["reference"]["knobs"][KNOB] == 192
    assert base["reference"]["run_id"] != variant["reference"]["run_id"]
    assert "each job's reference with that job's model.override.* fields" in report
    # the baseline's ambiguity, the proposed model-field run, and that run checked
    suggestion = summary["confounds"]["suggestion"]
    assert summary["confounds"]["ambiguous"] and (suggestion["knob"], suggestion["value"]) == (KNOB, 192)
    assert report.startswith(f"# 256|257 tracks model.{FIELD}; {KNOB}=192 moves it to 192|193")
    assert (f"- next experiment: none needed: the runs of this sweep already tested it (256|257 tracks model.{FIELD}"
            in report)  # the proposal was this sweep's own variant
    (checked,) = summary["confounds"]["checked"]
    assert checked["kind"] == "suggestion" and checked["follows"] and checked["resolved"] == 192
    assert summary["tracks_detail"][KNOB]["quantity"] == f"model.{FIELD}"
    (job,) = [r for r in mlflow_runs(tmp_path, role="job") if r.data.tags["oneknob.knob"] == KNOB]
    assert job.data.params[f"knob.{KNOB}"] == "192" and job.data.params[f"model_config.{FIELD}"] == "192"


@pytest.mark.slow
@pytest.mark.vllm
def test_a_model_field_sweep_on_vllm(tmp_path):
    """vLLM's CPU build, the tiny model, 2 jobs, one length, no reference (the verdicts are not the point): vLLM
    gets max_position_embeddings through hf_overrides, and its own resolved config (the plugin's read-back of the
    model's config as vLLM holds it) shows it; the diff owns it, so the variant is no side effect and no no-op."""
    rc, out = run_cli(tmp_path, "model.override.max_position_embeddings=null,3000", "samples=1", "lengths=[64]",
                      "spec.k=0", "reference=null", "oracles=[nll]", multirun=True, engine="vllm", timeout=900,
                      env=IN_PROCESS)
    assert rc == 0, out
    jobs = {r.data.tags["oneknob.knob"]: r for r in mlflow_runs(tmp_path, role="job")}
    base, variant = jobs["baseline"], jobs["model.override.max_position_embeddings"]
    assert variant.data.params["knob.model.override.max_position_embeddings"] == "3000"
    assert (base.data.params["model_config.max_position_embeddings"],
            variant.data.params["model_config.max_position_embeddings"]) == ("4096", "3000")
    assert variant.data.params["model.fingerprint"].startswith(base.data.params["model.fingerprint"] + "+")
    resolved = {i: json.loads(p.read_text())["vllm"] for i in (0, 1)
                for p in tmp_path.glob(f"multirun/*/{i}/resolved_config.json")}
    assert resolved[0]["model_config.hf_config.max_position_embeddings"] == 4096
    assert resolved[1]["model_config.hf_config.max_position_embeddings"] == 3000
    assert resolved[1]["model_config.hf_overrides"] == {"max_position_embeddings": 3000}
    check = json.loads(variant.data.tags["oneknob.check"])
    assert check["status"] == "ok", check
    assert check["diff"]["model_config.hf_config.max_position_embeddings"] == [4096, 3000]
    # a position limit far past the prompt changes no logprob: the same NLL to the bit
    assert base.data.metrics["nll"] == variant.data.metrics["nll"]
