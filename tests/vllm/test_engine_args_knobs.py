"""Issue 23: any vLLM EngineArgs field or VLLM_* variable is a knob, checked by vLLM itself before anything starts.

The synthetic-engine tests are fast. The vLLM ones run oneknob.engines.vllm.standalone.introspect in the CPU build's
interpreter (~15-30 s each cold: `import vllm`), so they share one cache directory (describe and validate
results are cached per build and per configuration) and run in order.
"""

import json
import os

import pytest
from helpers import IN_PROCESS, mlflow_runs, own_user_cache, run_cli, worker_records

from oneknob.config import knobs
from oneknob.engines.vllm.engine import VllmEngine
from oneknob.plan import single_variable as sv


def test_family_knobs_are_knobs_and_map_to_llm_kwargs_and_env():
    assert knobs.is_knob("engine_args.block_size") and knobs.is_knob("env.VLLM_CPU_KVCACHE_SPACE")
    assert not knobs.is_knob("engine_args.not-an-identifier") and not knobs.is_knob("other.block_size")
    args = knobs.engine_args({"cudagraph.capture": 256, "engine_args.block_size": 16,
                              "engine_args.compilation_config": {"mode": 0}, "env.VLLM_CPU_KVCACHE_SPACE": 1})
    assert args.kwargs == {"compilation_config": {"max_cudagraph_capture_size": 256, "mode": 0}, "block_size": 16}
    assert args.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    with pytest.raises(knobs.KnobError, match="the named knob sched.max_num_seqs sets it"):
        knobs.knob("engine_args.max_num_seqs")
    with pytest.raises(knobs.KnobError, match="the named knob runner sets it"):
        knobs.knob("env.VLLM_USE_V2_MODEL_RUNNER")


def test_worker_kwargs_carry_engine_args_and_refuse_what_oneknob_sets():
    spec = {"knobs": {"spec.k": 0, "engine_args.enable_prefix_caching": False, "env.VLLM_X": "y"},
            "settings": {"spec_method": "mtp"}, "seed": 3,
            "model": {"path": "/m", "dtype": "auto", "max_model_len": 64}, "options": {"max_num_batched_tokens": 32}}
    kwargs, env = VllmEngine().llm_kwargs(spec)
    assert kwargs["enable_prefix_caching"] is False and kwargs["seed"] == 3 and env == {"VLLM_X": "y"}
    spec["knobs"]["engine_args.max_num_batched_tokens"] = 256  # engine.* is a default: engine_args wins
    assert VllmEngine().llm_kwargs(spec)[0]["max_num_batched_tokens"] == 256
    spec["knobs"]["engine_args.seed"] = 1
    with pytest.raises(ValueError, match="engine_args.seed: oneknob sets seed itself"):
        VllmEngine().llm_kwargs(spec)


def test_command_line_families_get_force_add_and_user_prefixes_stay_refused():
    assert sv.force_add_families(["engine_args.block_size=16,32", "env.VLLM_A=1", "spec.k=1"]) == \
        ["++engine_args.block_size=16,32", "++env.VLLM_A=1", "spec.k=1"]
    shape = sv.sweep_shape(["engine_args.block_size=16,32", "samples=1"])
    assert shape.knob == "engine_args.block_size" and shape.values == ["16", "32"]
    with pytest.raises(sv.GuardError, match="'\\+\\+' on engine_args.block_size is refused"):
        sv.check_prefixes(sv.parse(["++engine_args.block_size=16"]))
    with pytest.raises(sv.GuardError, match="varies 2 knobs"):
        sv.sweep_shape(["engine_args.block_size=16,32", "spec.k=0,1"])


def test_family_knob_sweep_is_a_one_knob_study_recorded_in_mlflow(tmp_path):
    rc, out = run_cli(tmp_path, "engine_args.enable_prefix_caching=true,false", "samples=1", "lengths=[128,256]",
                      multirun=True)
    assert rc == 0, out
    jobs = sorted(mlflow_runs(tmp_path, role="job"), key=lambda r: r.data.tags["oneknob.knob"])
    assert [r.data.tags["oneknob.knob"] for r in jobs] == ["baseline", "engine_args.enable_prefix_caching"]
    assert [r.data.params["knob.engine_args.enable_prefix_caching"] for r in jobs] == ["true", "false"]
    variant = jobs[1]
    assert variant.data.tags["oneknob.value"] == "false"
    # the engine recorded the kwarg as given, and the single-variable diff saw the knob move (not a no-op)
    assert variant.data.params["resolved.engine_args.enable_prefix_caching"] == "false"
    # the synthetic fault model ignores prefix caching
    assert "engine_args.enable_prefix_caching=false left the verdicts unchanged" in " ".join(out.split())
    check = json.loads(variant.data.tags["oneknob.check"])
    assert check["status"] == "ok" and check["diff"] == {"engine_args.enable_prefix_caching": [True, False]}


def test_a_family_knobs_diff_covers_vllms_whole_resolved_config():
    base = {"max_num_batched_tokens": 2048, "engine_args.max_num_batched_tokens": 2048,
            "vllm": {"scheduler_config.max_num_batched_tokens": 2048, "scheduler_config.encoder_cache_size": 2048,
                     "cache_config.block_size": 128}}
    variant = {"max_num_batched_tokens": 256, "engine_args.max_num_batched_tokens": 256,
               "vllm": {"scheduler_config.max_num_batched_tokens": 256, "scheduler_config.encoder_cache_size": 256,
                        "cache_config.block_size": 128}}
    found = sv.check("engine_args.max_num_batched_tokens", base, variant, policy="pin", run_noops=False)
    assert found.status == "confounded" and found.side_effects == ["scheduler_config.encoder_cache_size"]
    assert "no knob sets scheduler_config.encoder_cache_size: flagged" in found.note
    assert "scheduler_config.max_num_batched_tokens" in found.diff  # its own field: moved, not a side effect
    same = sv.check("engine_args.block_size", base, base | {"engine_args.block_size": 16}, policy="pin",
                    run_noops=False)
    assert same.status == "ok" and same.side_effects == []
    # a named knob's diff stays on oneknob's summary fields
    assert "scheduler_config.encoder_cache_size" not in sv.diff(base, variant)


# -- vLLM's own checks (the CPU build in .venv) ---------------------------------------------------

same_worker = pytest.mark.xdist_group("vllm-checks")  # make test runs these on one worker: they share the cache


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("vllm-check-cache")


def _refused(tmp_path, shared_cache, *overrides):
    # the machine's cache of vLLM's checks (~/.cache/oneknob) is the group's own too: these tests count checks
    rc, out = run_cli(tmp_path, "engine=vllm", "spec.k=1", f"paths.cache={shared_cache}", *overrides,
                      "cudagraph.capture=256,512", multirun=True, engine=None, timeout=400,
                      env=own_user_cache(shared_cache))
    assert rc == 2, out
    assert "nothing was started and no run was recorded" in out and "Traceback" not in out
    assert worker_records(tmp_path) == [], "an engine was started"
    assert mlflow_runs(tmp_path) == [], "a run was recorded"
    return " ".join(out.split())


@pytest.mark.slow
@pytest.mark.vllm
@same_worker
def test_spec_method_bogus_is_refused_by_vllm_itself(tmp_path, shared_cache):
    out = _refused(tmp_path, shared_cache, "spec.method=bogus")
    assert "spec.method=bogus: vLLM 0.32.0 refuses it: 1 validation error for SpeculativeConfig: Input should " \
           "be 'ngram'" in out, out
    # no check process: the baseline's worker checks the sweep's two configurations and the reference's (K=0,
    # runner null: another VLLM_* environment, which vLLM's import does not read, checked in a fork of the worker)
    assert out.count("vLLM checks") == 1 and "vLLM checks 3 configuration(s) in the job's worker" in out, out
    assert "one process" not in out and "a second process" not in out
    cached = [json.loads(path.read_text()) for path in (shared_cache / "vllm-validate").glob("*.json")]
    assert sorted(entry["ok"] for entry in cached) == [False, False, True]  # the reference (K=0) has no drafter
    (tmp_path / "again").mkdir()
    again = _refused(tmp_path / "again", shared_cache, "spec.method=bogus")
    assert "vLLM checks" not in again and "spec.method=bogus: vLLM 0.32.0 refuses it" in again  # from the cache


@pytest.mark.slow
@pytest.mark.vllm
@same_worker
@pytest.mark.parametrize("override, expected", [
    ("engine_args.enable_prefix_cachng=true",
     "engine_args.enable_prefix_cachng=true: not a field of vLLM's EngineArgs in vLLM 0.32.0; did you mean "
     "engine_args.enable_prefix_caching"),
    ("env.VLLM_USE_V2_MODEL_RUNER=1", "env.VLLM_USE_V2_MODEL_RUNER=1: not a variable vllm.envs knows in vLLM "
                                      "0.32.0; did you mean env.VLLM_USE_V2_MODEL_RUNNER"),
])
def test_unknown_family_names_get_did_you_mean_from_the_build(tmp_path, shared_cache, override, expected):
    assert expected in _refused(tmp_path, shared_cache, "spec.method=mtp", override)


@pytest.mark.slow
@pytest.mark.vllm
@same_worker
def test_a_value_vllm_rejects_is_refused_under_its_family_knob(tmp_path, shared_cache):
    # with a variable vLLM's import reads (VLLM_LOG_BATCHSIZE_INTERVAL): the baseline's worker imported vLLM with
    # it, so the reference, which does not set it, is checked by a process of its own (a reference of this test's
    # own: the cache of the group's checks holds the default one)
    out = _refused(tmp_path, shared_cache, "engine_args.max_num_batched_tokens=256",
                   "engine_args.enable_chunked_prefill=false", "env.VLLM_LOG_BATCHSIZE_INTERVAL=5",
                   "+reference.sched.max_num_seqs=8")
    assert "engine_args.max_num_batched_tokens=256: vLLM 0.32.0 refuses it:" in out
    assert "max_num_batched_tokens (256) is smaller than max_model_len (2048)" in out
    assert "vLLM checks 3 configuration(s) in the job's worker" in out, out
    assert "reading VLLM_LOG_BATCHSIZE_INTERVAL, which 1 other environment(s) set otherwise: one process checks " \
           "them" in out, out


@pytest.mark.slow
@pytest.mark.vllm
@same_worker
def test_help_engine_args_lists_the_installed_builds_fields(tmp_path, shared_cache):

    from helpers import cli_command, run_python

    for family, expected in (("engine_args", ["the 256 EngineArgs fields of vLLM 0.32.0",
                                              "engine_args.enable_prefix_caching  (bool | None, default null)",
                                              "engine_args.max_num_seqs  (int | None, default null) "
                                              "[use sched.max_num_seqs]", "[oneknob sets it: model.path]"]),
                             ("env", ["VLLM_* variables vllm.envs 0.32.0 knows", "env.VLLM_CPU_KVCACHE_SPACE  ("])):
        command = cli_command("--help", family, f"paths.cache={shared_cache}", engine=None)
        done = run_python(command[1:], tmp_path, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        for text in expected:
            assert text in done.stdout, f"{text!r} not in {done.stdout[:2000]}"


@pytest.mark.slow
@pytest.mark.vllm
def test_a_chunk_budget_sweep_on_vllm_flags_what_vllm_derived_from_it(tmp_path):
    """The issue's example: the variant's diff covers vLLM's whole resolved config (the plugin's read-back), so
    what vLLM derived from the chunk budget (encoder cache, compile ranges) is found without a list of ours. Two
    engine starts: the verdicts do not matter here, so no reference (absolute mode)."""
    rc, out = run_cli(tmp_path, "engine_args.max_num_batched_tokens=2048,256", "samples=1", "lengths=[64,300]",
                      "spec.k=0", "reference=null", "oracles=[nll]", multirun=True, engine="vllm", timeout=900,
                      env=IN_PROCESS)
    assert rc == 0, out
    jobs = {r.data.tags["oneknob.knob"]: r for r in mlflow_runs(tmp_path, role="job")}
    check = json.loads(jobs["engine_args.max_num_batched_tokens"].data.tags["oneknob.check"])
    assert check["status"] == "confounded", check
    assert "scheduler_config.encoder_cache_size" in check["side_effects"]
    assert "scheduler_config.max_num_batched_tokens" in check["diff"]  # its own field moved, not a side effect
    assert "scheduler_config.max_num_batched_tokens" not in check["side_effects"]
    (resolved,) = [json.loads(p.read_text()) for p in tmp_path.glob("multirun/*/1/resolved_config.json")]
    assert resolved["vllm"]["scheduler_config.max_num_batched_tokens"] == 256 and len(resolved["vllm"]) > 500
    assert "resolved differently from the resolution rules" not in out


def test_vllms_verdict_on_a_configuration_is_kept_for_every_study_on_the_machine(tmp_path, monkeypatch):
    """vllm_validate's two levels: the study's paths.cache, then ~/.cache/oneknob/vllm-checks, keyed by the build,
    the kwargs, the model and the environment vLLM reads. A stand-in interpreter counts the checks it ran."""
    from oneknob.engines.vllm import validate as vllm_validate

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    calls = tmp_path / "calls"
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\ncat > /dev/null\necho run >> " + str(calls) + "\n"
                      "echo '{\"ok\": true, \"vllm_version\": \"9.9\", \"groups\": [{\"results\": [{\"ok\": true, "
                      "\"resolved\": {\"scheduler_config.max_num_seqs\": 7}}]}]}'\n")
    python.chmod(0o755)

    def item(**env):
        return {"python": str(python), "env": {"PATH": os.environ["PATH"], **env}, "kwargs": {"model": "m/x"},
                "knob_env": {}, "knobs": {}, "settings": {}, "build": "b", "fingerprint": "f"}

    def checked(root, **env) -> int:
        before = len(calls.read_text().splitlines()) if calls.exists() else 0
        (result,) = vllm_validate.validate([item(**env)], str(root), log=lambda *_: None)
        assert result["resolved"] == {"scheduler_config.max_num_seqs": 7} and result["vllm_version"] == "9.9"
        return (len(calls.read_text().splitlines()) if calls.exists() else 0) - before

    assert checked(tmp_path / "a") == 1
    assert checked(tmp_path / "a") == 0  # the study's own cache
    assert checked(tmp_path / "b") == 0  # another study: the machine's, copied into the study's cache
    assert len(list((tmp_path / "b" / "vllm-validate").glob("*.json"))) == 1
    assert checked(tmp_path / "b", VLLM_CPU_KVCACHE_SPACE="2") == 1  # vLLM reads it: another configuration
    assert checked(tmp_path / "c", UNRELATED="1") == 0  # nothing vLLM reads


@pytest.mark.slow
@pytest.mark.vllm
@same_worker
def test_runner_v1_on_a_vllm_that_refuses_it_is_refused_quoting_vllm_with_oneknobs_fix(tmp_path, shared_cache):
    """vLLM 0.34.0 removed Model Runner V1: its validate_environ (called by create_engine_config) refuses
    VLLM_USE_V2_MODEL_RUNNER=0. The CPU build patched to do the same (vllm.patch=, tests/data) makes runner=v1
    refused by vLLM's own config check before any engine starts, under the runner knob, with oneknob's fix."""
    patch = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "reject-v1-runner-like-0.34.diff")
    out = _refused(tmp_path, shared_cache, f"vllm.patch={patch}", "runner=v1")
    assert "runner=v1: vLLM 0.32.0 refuses it: VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported: Model Runner V1 " \
           "has been removed. Unset this variable." in out, out
    assert "Fix: runner=null runs this build's own default runner (Model Runner V2 where V1 is gone); runner=v1 " \
           "needs a vLLM that still has Model Runner V1: vllm.version=0.33.0" in out, out
