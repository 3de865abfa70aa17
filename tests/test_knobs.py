"""The knob registry: validation messages and the exact vLLM mapping (no engine)."""

import pytest

from oneknob import knobs


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
    script = ("import os, runpy, sys; sys.argv = ['oneknob.worker'];"
              "import oneknob.engines.synthetic as s;"
              "orig = s.SyntheticEngine.provenance;"
              "s.SyntheticEngine.provenance = lambda self: orig(self) | "
              "{'runner_env': os.environ.get('VLLM_USE_V2_MODEL_RUNNER')};"
              "runpy.run_module('oneknob.worker', run_name='__main__')")
    for runner, expected in ((None, None), ("v1", "0"), ("v2", "1")):
        spec["knobs"]["runner"] = runner
        done = subprocess.run([sys.executable, "-c", script], input=json.dumps({"op": "start", "spec": spec})
                              + "\n" + json.dumps({"op": "stop"}) + "\n", capture_output=True, text=True,
                              env=dict(os.environ, VLLM_USE_V2_MODEL_RUNNER="1"), timeout=60)
        ready = json.loads(done.stdout.splitlines()[0])
        assert ready["type"] == "ready", done.stdout + done.stderr
        assert ready["provenance"]["runner_env"] == expected
