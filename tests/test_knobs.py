"""The knob registry: validation messages and the exact vLLM mapping (no engine)."""

import pytest

from oneknob.config import knobs


@pytest.mark.parametrize("values,kwargs,env", [
    ({"cudagraph.capture": None, "cudagraph.enforce_eager": False, "sched.max_num_seqs": None,
      "spec.k": 0, "runner": None},
     {"enforce_eager": False}, {}),
    ({"cudagraph.capture": 256, "cudagraph.enforce_eager": False, "sched.max_num_seqs": 128,
      "spec.k": 3, "runner": "v1"},
     {"compilation_config": {"max_cudagraph_capture_size": 256}, "enforce_eager": False, "max_num_seqs": 128,
      "speculative_config": {"method": "mtp", "num_speculative_tokens": 3}},
     {"VLLM_USE_V2_MODEL_RUNNER": "0"}),
    ({"cudagraph.capture": None, "cudagraph.enforce_eager": True, "sched.max_num_seqs": 64,
      "spec.k": 1, "runner": "v2"},
     {"enforce_eager": True, "max_num_seqs": 64,
      "speculative_config": {"method": "mtp", "num_speculative_tokens": 1}},
     {"VLLM_USE_V2_MODEL_RUNNER": "1"}),
])
def test_engine_args_table(values, kwargs, env):
    args = knobs.engine_args(values, {"spec_method": "mtp"})
    assert args.kwargs == kwargs
    assert args.env == env


def test_spec_method_comes_from_settings():
    args = knobs.engine_args({"spec.k": 2}, {"spec_method": "ngram"})
    assert args.kwargs["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 2}


@pytest.mark.parametrize("key,value,message", [
    ("cudagraph.capture", 0, "cudagraph.capture=0: must be a positive integer"),
    ("cudagraph.capture", -5, "cudagraph.capture=-5: must be a positive integer"),
    ("sched.max_num_seqs", 0, "sched.max_num_seqs=0: must be a positive integer"),
    ("spec.k", -1, "spec.k=-1: the number of speculative tokens must be >= 0 (0 turns speculation off)"),
    ("runner", "v3", "runner=v3: must be v1, v2 or null"),
    ("cudagraph.enforce_eager", "yes", "cudagraph.enforce_eager=yes: must be true or false"),
])
def test_validation_names_key_value_and_fix(key, value, message):
    with pytest.raises(knobs.KnobError, match=message.replace("(", r"\(").replace(")", r"\)")):
        knobs.check(key, value)


def test_flatten_accepts_nested_and_dotted_forms():
    assert knobs.flatten({"cudagraph": {"capture": [256]}, "spec.k": [0, 1], "runner": ["v2"]}) == {
        "cudagraph.capture": [256], "spec.k": [0, 1], "runner": ["v2"]}
    with pytest.raises(knobs.KnobError, match="not a knob"):
        knobs.flatten({"cudagraph": {"captur": [1]}})


def test_pinning_knobs():
    assert knobs.pinning_knob("max_capture_size").key == "cudagraph.capture"
    assert knobs.pinning_knob("max_num_seqs").key == "sched.max_num_seqs"
    assert knobs.pinning_knob("max_num_batched_tokens") is None


def test_knob_owned_environment_is_cleared_when_null(tmp_path):
    """A VLLM_USE_V2_MODEL_RUNNER left in the shell must not decide runner=null."""
    import json
    import os
    import subprocess
    import sys

    spec = {"engine": "synthetic", "knobs": {"cudagraph.capture": None, "cudagraph.enforce_eager": False,
                                             "sched.max_num_seqs": None, "spec.k": 0, "runner": None},
            "settings": {"spec_method": "mtp"}, "model": {}, "options": {}, "seed": 0}
    script = ("import os, runpy, sys; sys.argv = ['oneknob.run.worker'];"
              "import oneknob.engines.synthetic as s;"
              "orig = s.SyntheticEngine.provenance;"
              "s.SyntheticEngine.provenance = lambda self: orig(self) | "
              "{'runner_env': os.environ.get('VLLM_USE_V2_MODEL_RUNNER')};"
              "runpy.run_module('oneknob.run.worker', run_name='__main__')")
    for runner, expected in ((None, None), ("v1", "0"), ("v2", "1")):
        spec["knobs"]["runner"] = runner
        done = subprocess.run([sys.executable, "-c", script], input=json.dumps({"op": "start", "spec": spec})
                              + "\n" + json.dumps({"op": "stop"}) + "\n", capture_output=True, text=True,
                              env=dict(os.environ, VLLM_USE_V2_MODEL_RUNNER="1"), timeout=60)
        ready = json.loads(done.stdout.splitlines()[0])
        assert ready["type"] == "ready", done.stdout + done.stderr
        assert ready["provenance"]["runner_env"] == expected


# -- the registry's rules, exactly (mutation testing: docs/MUTATION.md) ------------------------------------

def test_each_knob_names_its_group_and_name():
    assert [(k.group, k.name) for k in knobs.KNOBS.values()] == [
        ("cudagraph", "capture"), ("cudagraph", "enforce_eager"), ("sched", "max_num_seqs"), ("spec", "k"),
        (None, "runner"), ("vllm", "version"), ("vllm", "patch"), ("vllm", "commit")]
    assert knobs.owned_env() == ("VLLM_USE_V2_MODEL_RUNNER",)


@pytest.mark.parametrize("key,value,message", [
    ("cudagraph.capture", True, "cudagraph.capture=True: must be a positive integer, or null for the engine's default"),
    ("cudagraph.capture", 2.5, "cudagraph.capture=2.5: must be a positive integer, or null for the engine's default"),
    ("sched.max_num_seqs", "8", "sched.max_num_seqs=8: must be a positive integer, or null for the engine's default"),
    ("spec.k", True, "spec.k=True: the number of speculative tokens must be >= 0 (0 turns speculation off)"),
    ("spec.k", None, "spec.k=null: the number of speculative tokens must be >= 0 (0 turns speculation off)"),
    ("runner", "V1", "runner=V1: must be v1, v2 or null (null keeps the engine's default runner)"),
    ("vllm.version", "  ", "vllm.version=  : must be a non-empty string, or null (quote numbers: "
                           "'vllm.version=\"0.31.0\"')"),
    ("vllm.patch", 0.31, "vllm.patch=0.31: must be a non-empty string, or null (quote numbers: "
                         "'vllm.version=\"0.31.0\"')"),
])
def test_the_exact_refusal_of_each_kind_of_bad_value(key, value, message):
    with pytest.raises(knobs.KnobError) as refused:
        knobs.check(key, value)
    assert str(refused.value) == message


@pytest.mark.parametrize("key,value", [
    ("cudagraph.capture", None), ("cudagraph.capture", 1), ("sched.max_num_seqs", None), ("sched.max_num_seqs", 1),
    ("spec.k", 0), ("runner", None), ("runner", "v1"), ("runner", "v2"), ("vllm.version", None),
    ("vllm.version", "0.31.0"), ("vllm.patch", "fix.diff"), ("cudagraph.enforce_eager", True),
])
def test_valid_values_pass(key, value):
    knobs.check(key, value)
    knobs.check_all({key: value})


def test_an_unknown_key_is_refused_with_the_list_of_knobs():
    with pytest.raises(knobs.KnobError) as refused:
        knobs.knob("spec.kk")
    assert str(refused.value) == ("'spec.kk' is not a knob; the knobs are: cudagraph.capture, cudagraph.enforce_eager, "
                                  "sched.max_num_seqs, spec.k, runner, vllm.version, vllm.patch, vllm.commit, "
                                  "engine_args.<EngineArgs field> and env.VLLM_<NAME>")
    with pytest.raises(knobs.KnobError):
        knobs.check_all({"runner": "v1", "spec.kk": 1})
    with pytest.raises(knobs.KnobError):
        knobs.flatten({"nope": 1})
    with pytest.raises(knobs.KnobError):
        knobs.flatten({"samples": {"x": 1}})  # a mapping that is no knob group


def test_engine_args_defaults_and_what_each_knob_leaves_alone():
    assert knobs.engine_args({"spec.k": 1}).kwargs == {
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 1}}
    assert knobs.engine_args({"spec.k": 0}).kwargs == {}
    assert knobs.engine_args({"cudagraph.enforce_eager": 1}).kwargs == {"enforce_eager": True}
    assert knobs.engine_args({"vllm.version": "0.31.0", "vllm.patch": "x.diff"}).kwargs == {}
    assert knobs.engine_args({"runner": "v1"}).env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert knobs.engine_args({}).kwargs == {} and knobs.engine_args({}).env == {}
    # a capture size joins a compilation_config that is already there
    args = knobs.EngineArgs(kwargs={"compilation_config": {"mode": 3}})
    knobs.knob("cudagraph.capture").apply(256, args, {})
    assert args.kwargs == {"compilation_config": {"mode": 3, "max_cudagraph_capture_size": 256}}


def test_from_config_reads_every_knob_of_a_nested_config():
    nested = {"cudagraph": {"capture": 256, "enforce_eager": False}, "sched": {"max_num_seqs": 64},
              "spec": {"k": 1}, "runner": "v2", "vllm": {"version": None, "patch": None, "commit": None},
              "samples": 2}
    assert knobs.from_config(nested) == {"cudagraph.capture": 256, "cudagraph.enforce_eager": False,
                                         "sched.max_num_seqs": 64, "spec.k": 1, "runner": "v2",
                                         "vllm.version": None, "vllm.patch": None, "vllm.commit": None}
    assert knobs.flatten(None) == {} and knobs.flatten({"vllm": {"patch": "x"}}) == {"vllm.patch": "x"}


def test_which_knob_pins_which_field():
    assert [knobs.pinning_knob(f) and knobs.pinning_knob(f).key for f in knobs.RESOLVED_FIELDS] == [
        "cudagraph.capture", "cudagraph.capture", None, "sched.max_num_seqs", None, None, None, None, None, None,
        None]


def test_a_knob_group_given_a_plain_value_is_refused_naming_it():
    with pytest.raises(knobs.KnobError, match=r"^'cudagraph' is not a knob; the knobs are: cudagraph.capture"):
        knobs.flatten({"cudagraph": 5})
    with pytest.raises(knobs.KnobError, match=r"^'samples' is not a knob"):
        knobs.flatten({"samples": 2})
