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
                                  "engine_args.<EngineArgs field>, env.VLLM_<NAME> and model.override.<config.json "
                                  "path>")
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


# -- the knob families: engine_args.<field> and env.VLLM_<NAME> (mutation testing: docs/MUTATION.md) -------

def test_what_the_named_knobs_set_is_mapped_to_its_knob():
    assert knobs.named_kwargs() == {
        "compilation_config.max_cudagraph_capture_size": "cudagraph.capture",
        "enforce_eager": "cudagraph.enforce_eager",
        "max_num_seqs": "sched.max_num_seqs",
        "speculative_config.method": "spec.method",  # a setting, mapped by spec.k
        "speculative_config.num_speculative_tokens": "spec.k",
        "env.VLLM_USE_V2_MODEL_RUNNER": "runner",
    }


@pytest.mark.parametrize("key,family", [
    ("engine_args.enable_prefix_caching", True), ("env.VLLM_ATTENTION_BACKEND", True), ("engine_args._x1", True),
    ("engine_args.1x", False), ("engine_args.a.b", False), ("env.VLLM-X", False), ("env.", False),
    ("engine_argsX.x", False), ("spec.k", False), ("compilation_config.mode", False),
])
def test_which_keys_are_family_knobs(key, family):
    assert knobs.is_family(key) is family
    assert knobs.is_knob(key) is (family or key in knobs.KNOBS)


def test_an_engine_args_knob_is_its_field():
    k = knobs.knob("engine_args.enable_prefix_caching")
    assert (k.key, k.type, k.nullable, k.default, k.description, k.vllm, k.env) == (
        "engine_args.enable_prefix_caching", object, True, None, "vLLM EngineArgs.enable_prefix_caching",
        "enable_prefix_caching", ())
    assert k.moves == ("engine_args.enable_prefix_caching", "enable_prefix_caching", "*.enable_prefix_caching",
                       "enable_prefix_caching.*")
    assert k.owns("cache_config.enable_prefix_caching") and k.owns("enable_prefix_caching")
    assert not k.owns("max_num_seqs")
    assert k.group == "engine_args" and k.name == "enable_prefix_caching"


def test_an_env_knob_is_its_variable():
    k = knobs.knob("env.VLLM_ATTENTION_BACKEND")
    assert (k.key, k.type, k.nullable, k.default, k.description, k.vllm, k.moves, k.env) == (
        "env.VLLM_ATTENTION_BACKEND", object, True, None, "vLLM environment variable VLLM_ATTENTION_BACKEND",
        "VLLM_ATTENTION_BACKEND", ("env.VLLM_ATTENTION_BACKEND",), ("VLLM_ATTENTION_BACKEND",))
    assert k.check is knobs._check_env_value


@pytest.mark.parametrize("value,text", [(True, "1"), (False, "0"), (5, "5"), (0, "0"), (1.5, "1.5"),
                                        ("FLASH_ATTN", "FLASH_ATTN"), ("", "")])
def test_an_env_knob_sets_its_variable_as_text(value, text):
    args = knobs.engine_args({"env.VLLM_ATTENTION_BACKEND": value})
    assert args.env == {"VLLM_ATTENTION_BACKEND": text} and args.kwargs == {}


def test_a_null_env_knob_sets_nothing():
    assert knobs.engine_args({"env.VLLM_ATTENTION_BACKEND": None}).env == {}
    knobs.check("env.VLLM_ATTENTION_BACKEND", None)


@pytest.mark.parametrize("value", [None, True, 0, 2, 1.5, "x", ""])
def test_an_env_knob_takes_one_plain_value(value):
    knobs.check("env.VLLM_X", value)
    assert knobs._check_env_value(value) is None


@pytest.mark.parametrize("value,shown", [([1, 2], "[1, 2]"), ({"a": 1}, "{'a': 1}")])
def test_an_env_knob_refuses_a_list_or_mapping_naming_the_fix(value, shown):
    with pytest.raises(knobs.KnobError) as refused:
        knobs.check("env.VLLM_X", value)
    assert str(refused.value) == (f"env.VLLM_X={shown}: an environment variable takes one value (a number, "
                                  "true/false or a string), or null to unset it")


@pytest.mark.parametrize("value", [None, True, 3, 0.5, "auto", [1, 2], {"mode": 3}])
def test_an_engine_args_knob_takes_any_plain_value(value):
    knobs.check("engine_args.compilation_config", value)
    assert knobs._check_family_value(value) is None


def test_an_engine_args_knob_refuses_an_object_naming_the_fix():
    with pytest.raises(knobs.KnobError) as refused:
        knobs.check("engine_args.enable_prefix_caching", object)
    assert str(refused.value) == (f"engine_args.enable_prefix_caching={object}: must be a number, true/false, "
                                  "a string, a list, a mapping or null")
    assert knobs._check_family_value((1, 2)) == "must be a number, true/false, a string, a list, a mapping or null"


def test_a_mapping_key_a_named_knob_sets_is_refused_naming_that_knob():
    with pytest.raises(knobs.KnobError) as refused:
        knobs.check("engine_args.compilation_config", {"mode": 3, "max_cudagraph_capture_size": 8})
    assert str(refused.value) == (
        "engine_args.compilation_config={'mode': 3, 'max_cudagraph_capture_size': 8}: "
        "compilation_config.max_cudagraph_capture_size is cudagraph.capture's: set it with that named knob "
        "(one path per switch)")
    with pytest.raises(knobs.KnobError) as refused:
        knobs.check("engine_args.speculative_config", {"method": "ngram", "num_speculative_tokens": 2})
    assert str(refused.value).endswith(
        ": speculative_config.method is spec.method's; speculative_config.num_speculative_tokens is spec.k's: "
        "set them with spec.method and spec.k (one path per switch)")
    knobs.check("engine_args.speculative_config", "mtp")  # not a mapping: no keys to own


@pytest.mark.parametrize("key,owner", [("engine_args.max_num_seqs", "sched.max_num_seqs"),
                                       ("engine_args.enforce_eager", "cudagraph.enforce_eager"),
                                       ("env.VLLM_USE_V2_MODEL_RUNNER", "runner")])
def test_a_field_a_named_knob_sets_is_refused_under_its_family(key, owner):
    with pytest.raises(knobs.KnobError) as refused:
        knobs.knob(key)
    assert str(refused.value) == f"{key}: the named knob {owner} sets it; write {owner}=VALUE (one path per switch)"


def test_an_engine_args_knob_is_passed_to_llm():
    args = knobs.engine_args({"engine_args.enable_prefix_caching": False, "engine_args.block_size": 16,
                              "engine_args.max_model_len": None})
    assert args.kwargs == {"enable_prefix_caching": False, "block_size": 16} and args.env == {}
    # a mapping joins the keys a named knob set in the same kwarg
    args = knobs.engine_args({"cudagraph.capture": 256, "engine_args.compilation_config": {"mode": 3}})
    assert args.kwargs == {"compilation_config": {"max_cudagraph_capture_size": 256, "mode": 3}}
    args = knobs.engine_args({"engine_args.compilation_config": {"mode": 3}})
    assert args.kwargs == {"compilation_config": {"mode": 3}}
    args = knobs.EngineArgs(kwargs={"compilation_config": {"mode": 1}})
    knobs.knob("engine_args.compilation_config").apply(7, args, {})  # a plain value replaces it
    assert args.kwargs == {"compilation_config": 7}


def test_flatten_reads_family_mappings_and_dotted_family_keys():
    assert knobs.flatten({"engine_args": {"enable_prefix_caching": [True, False]}, "env": {"VLLM_X": "1"},
                          "engine_args.block_size": 16}) == {
        "engine_args.enable_prefix_caching": [True, False], "env.VLLM_X": "1", "engine_args.block_size": 16}
    with pytest.raises(knobs.KnobError) as refused:
        knobs.flatten({"samples": {"x": 1}})
    assert str(refused.value).startswith("'samples' is not a knob")
    with pytest.raises(knobs.KnobError, match=r"^engine_args.max_num_seqs: the named knob sched.max_num_seqs"):
        knobs.flatten({"engine_args": {"max_num_seqs": 8}})


_NAMED = {"cudagraph": {"capture": None, "enforce_eager": False}, "sched": {"max_num_seqs": None}, "spec": {"k": 0},
          "runner": None, "vllm": {"version": None, "patch": None, "commit": None}}
_NAMED_VALUES = {"cudagraph.capture": None, "cudagraph.enforce_eager": False, "sched.max_num_seqs": None,
                 "spec.k": 0, "runner": None, "vllm.version": None, "vllm.patch": None, "vllm.commit": None}


def test_from_config_reads_the_family_knobs_a_config_sets():
    cfg = _NAMED | {"engine_args": {"compilation_config": {"mode": 3}, "block_size": 16, "cuda_graph_sizes": [1, 2]},
                    "env": {"VLLM_X": "y"}}
    assert knobs.from_config(cfg) == _NAMED_VALUES | {
        "engine_args.compilation_config": {"mode": 3}, "engine_args.block_size": 16,
        "engine_args.cuda_graph_sizes": [1, 2], "env.VLLM_X": "y"}
    assert knobs.from_config(_NAMED | {"engine_args": {}, "env": None}) == _NAMED_VALUES
    with pytest.raises(knobs.KnobError, match=r"^engine_args.max_num_seqs: the named knob"):
        knobs.from_config(_NAMED | {"engine_args": {"max_num_seqs": 4}})


def test_from_config_turns_omegaconf_nodes_into_plain_values():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(_NAMED | {"size": 8, "engine_args": {"compilation_config": {"mode": 3, "size": "${size}"},
                                                                "cuda_graph_sizes": [1, "${size}"], "block_size": 16},
                                     "env": {"VLLM_X": 1}})
    values = knobs.from_config(cfg)
    assert type(values["engine_args.compilation_config"]) is dict
    assert values["engine_args.compilation_config"] == {"mode": 3, "size": 8}
    assert type(values["engine_args.cuda_graph_sizes"]) is list
    assert values["engine_args.cuda_graph_sizes"] == [1, 8]
    assert values["engine_args.block_size"] == 16 and values["env.VLLM_X"] == 1


def test_from_config_of_a_config_without_get_reads_the_named_knobs_only():
    class Indexed:  # indexing only, as a bare structured node
        def __init__(self, data):
            self.data = data

        def __getitem__(self, key):
            value = self.data[key]
            return Indexed(value) if isinstance(value, dict) else value

    assert knobs.from_config(Indexed(_NAMED | {"engine_args": {"block_size": 16}})) == _NAMED_VALUES


def test_family_values_are_the_family_knobs_only():
    assert knobs.family_values({"spec.k": 1, "engine_args.block_size": 16, "env.VLLM_X": "1", "runner": "v2"}) == {
        "engine_args.block_size": 16, "env.VLLM_X": "1"}
