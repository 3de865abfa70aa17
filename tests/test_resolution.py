"""The predicted resolved config against values read from vLLM 0.33 sources and the seed."""

from __future__ import annotations

import pytest

from oneknob import knobs
from oneknob.knobs import KnobError
from oneknob.errors import ConfigError
from oneknob.resolution import capture_grid, capture_sizes, device_named, predict

SEED = {"sched.max_num_seqs": 128, "spec.k": 3}


@pytest.mark.parametrize(
    ("knob_values", "max_num_batched_tokens", "expected_max"),
    [
        ({"sched.max_num_seqs": 128, "spec.k": 0}, 2048, 256),  # seed's non-speculative row
        ({"sched.max_num_seqs": 128, "spec.k": 3}, 2048, 512),  # seed's speculative rows
        ({**SEED, "cudagraph.capture": 256}, 2048, 256),  # seed's knob experiment
        ({**SEED, "cudagraph.capture": 300}, 2048, 288),  # off-grid: truncated onto the grid
        ({"sched.max_num_seqs": 16, "spec.k": 0}, None, 32),  # 16 * 1 * 2
        ({"sched.max_num_seqs": 128, "spec.k": 3}, 384, 384),  # capped by the token budget
        ({"sched.max_num_seqs": 128, "spec.k": 3}, 300, 300),  # the budget itself is captured
        ({"cudagraph.capture": 1024}, 8192, 1024),  # explicit max above the default ceiling
    ],
)
def test_max_capture_size(knob_values, max_num_batched_tokens, expected_max):
    resolved = predict(knob_values, max_num_batched_tokens=max_num_batched_tokens)
    assert resolved["max_capture_size"] == expected_max
    assert resolved["capture_sizes"][-1] == expected_max
    assert resolved["cudagraph_mode"] == "FULL_AND_PIECEWISE"


def test_resolved_config_has_the_documented_shape():
    resolved = predict(SEED, max_num_batched_tokens=2048)
    assert set(resolved) == set(knobs.RESOLVED_FIELDS) - {"build"} | {"platform"}  # the build is the engine's
    assert resolved == {
        **resolved,
        "max_num_seqs": 128,
        "max_num_batched_tokens": 2048,
        "spec_method": "mtp",
        "spec_k": 3,
        "enforce_eager": False,
        "runner": "v2",
        "platform": "cuda",
        "cudagraph_emulated": False,
    }


def test_capture_grid():
    assert capture_grid(512) == [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
    assert capture_grid(6) == [1, 2, 4]
    assert capture_grid(300)[-1] == 288


def test_seed_capture_sizes_are_the_plain_grid():
    assert capture_sizes(None, max_num_seqs=128, spec_k=3, max_num_batched_tokens=2048) == capture_grid(512)


def test_k2_default_adds_off_grid_decode_sizes():
    sizes = capture_sizes(None, max_num_seqs=128, spec_k=2, max_num_batched_tokens=8192)
    assert 264 in sizes and 3 in sizes  # 88 and 1 requests of 3 tokens
    assert sizes[-1] == 512


def test_explicit_max_gets_no_decode_sizes():
    sizes = capture_sizes(256, max_num_seqs=128, spec_k=2, max_num_batched_tokens=8192)
    assert sizes == capture_grid(256)


def test_v1_runner_rounds_sizes_to_multiples_of_k_plus_1():
    resolved = predict({"sched.max_num_seqs": 128, "spec.k": 2, "runner": "v1"}, max_num_batched_tokens=8192)
    assert all(size % 3 == 0 for size in resolved["capture_sizes"])
    assert resolved["max_capture_size"] == 498  # 496 -> 498; 512 -> 513 is past the maximum, dropped
    v2 = predict({"sched.max_num_seqs": 128, "spec.k": 2, "runner": "v2"}, max_num_batched_tokens=8192)
    assert v2["max_capture_size"] == 512
    seed_v1 = predict({**SEED, "runner": "v1"}, max_num_batched_tokens=2048)
    assert seed_v1["max_capture_size"] == 512  # every size >= 4 is already a multiple of 4


@pytest.mark.parametrize("capture", [None, 256])
def test_enforce_eager_means_no_graphs(capture):
    resolved = predict(
        {**SEED, "cudagraph.enforce_eager": True, "cudagraph.capture": capture}, max_num_batched_tokens=2048
    )
    assert resolved["cudagraph_mode"] == "NONE"
    assert resolved["capture_sizes"] == []
    assert resolved["max_capture_size"] == 0  # vllm/config/vllm.py:2008
    assert resolved["enforce_eager"] is True


@pytest.mark.parametrize(("capture", "expected_max"), [(None, None), (300, 300)])
def test_cpu_has_no_graphs_and_keeps_the_capture_knob_as_given(capture, expected_max):
    resolved = predict({"cudagraph.capture": capture}, platform="cpu")
    assert resolved["cudagraph_mode"] == "NONE"
    assert resolved["capture_sizes"] == []
    assert resolved["max_capture_size"] == expected_max
    assert resolved["max_num_batched_tokens"] == 4096
    assert resolved["platform"] == "cpu"


def test_synthetic_platform_resolves_like_cuda():
    synthetic = predict(SEED, platform="synthetic", max_num_batched_tokens=2048)
    cuda = predict(SEED, platform="cuda", max_num_batched_tokens=2048)
    assert {**synthetic, "platform": "cuda"} == cuda


def test_defaults():
    resolved = predict({})
    assert resolved["max_num_seqs"] == 256 and resolved["max_num_batched_tokens"] == 8192
    assert resolved["spec_k"] == 0 and resolved["spec_method"] is None
    assert resolved["max_capture_size"] == 512  # min(256 * 1 * 2, 512)
    assert predict({}, default_max_num_seqs=1024, max_num_batched_tokens=512)["max_num_seqs"] == 512
    assert predict({}, default_runner="v1")["runner"] == "v1"
    assert predict({"runner": "v1"})["runner"] == "v1"
    assert predict({"spec.k": 1}, spec_method="ngram")["spec_method"] == "ngram"


def test_bad_values_are_refused():
    with pytest.raises(KnobError, match="spec.k=-1"):
        predict({"spec.k": -1})
    with pytest.raises(KnobError, match="is not a knob"):
        predict({"cudagraph.size": 5})
    with pytest.raises(ValueError, match="platform='tpu'"):
        predict({}, platform="tpu")


# vLLM 0.33.0 per device: config/vllm.py:2463-2465 (the capture ceiling), engine/arg_utils.py:2972-3027
# (LLM's defaults by GPU memory; A100 and GB10 stay on the small tier).
@pytest.mark.parametrize("device,ceiling,batched_tokens,max_num_seqs", [
    ("A100", 512, 8192, 256), ("L40S", 512, 8192, 256), ("H100", 512, 16384, 1024), ("H200", 512, 16384, 1024),
    ("B200", 1024, 16384, 1024), ("B300", 1024, 16384, 1024), ("GB10", 512, 8192, 256), ("cpu", 512, 4096, 256),
])
def test_device_defaults(device, ceiling, batched_tokens, max_num_seqs):
    found = device_named(device.lower())
    assert (found.capture_ceiling, *found.llm_defaults()) == (ceiling, batched_tokens, max_num_seqs)


@pytest.mark.parametrize("device,expected_max", [("B200", 1024), ("H200", 512), ("A100", 512)])
def test_the_seed_baseline_per_device(device, expected_max):
    """K=3, max_num_seqs=128, the seed's 2048-token budget: min(128 x 4 x 2, ceiling) = 1024 on a B200 only."""
    found = device_named(device)
    resolved = predict(SEED, max_num_batched_tokens=2048, capture_ceiling=found.capture_ceiling)
    assert resolved["max_capture_size"] == expected_max
    # K=1 moves it back to 512 on a B200 (128 x 2 x 2), and leaves it at 512 elsewhere
    k1 = predict({**SEED, "spec.k": 1}, max_num_batched_tokens=2048, capture_ceiling=found.capture_ceiling)
    assert k1["max_capture_size"] == 512


def test_an_unknown_device_is_refused_naming_the_table():
    with pytest.raises(ConfigError, match="engine.target_gpu=V100: no such device.*A100, L40S, H100"):
        device_named("V100")


def test_emulated_graphs_resolve_as_on_a_gpu_but_say_so():
    resolved = predict(SEED, platform="cpu", max_num_batched_tokens=2048, emulated=True)
    assert (resolved["max_capture_size"], resolved["cudagraph_mode"]) == (512, "FULL_AND_PIECEWISE")
    assert resolved["cudagraph_emulated"] and resolved["platform"] == "cpu"
    plain = predict(SEED, platform="cpu", max_num_batched_tokens=2048)
    assert (plain["cudagraph_mode"], plain["capture_sizes"], plain["cudagraph_emulated"]) == ("NONE", [], False)
