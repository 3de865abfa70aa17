"""The predicted resolved config against values read from vLLM 0.33 sources and the seed."""

from __future__ import annotations

import pytest

from oneknob.config import knobs
from oneknob.config.knobs import KnobError
from oneknob.errors import ConfigError
from oneknob.config.resolution import capture_grid, capture_sizes, device_named, predict

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
    with pytest.raises(ConfigError, match="engine.target_gpu=V100: not one device of oneknob.s table; "
                                          "give one of A100, L40S, H100"):
        device_named("V100")


def test_emulated_graphs_resolve_as_on_a_gpu_but_say_so():
    resolved = predict(SEED, platform="cpu", max_num_batched_tokens=2048, emulated=True)
    assert (resolved["max_capture_size"], resolved["cudagraph_mode"]) == (512, "FULL_AND_PIECEWISE")
    assert resolved["cudagraph_emulated"] and resolved["platform"] == "cpu"
    plain = predict(SEED, platform="cpu", max_num_batched_tokens=2048)
    assert (plain["cudagraph_mode"], plain["capture_sizes"], plain["cudagraph_emulated"]) == ("NONE", [], False)


# -- the rules' edges, worked out from the cited vLLM lines (mutation testing: docs/MUTATION.md) -----------

def test_capture_grid_at_its_edges():
    assert capture_grid(1) == [1] and capture_grid(3) == [1, 2] and capture_grid(8) == [1, 2, 4, 8]
    assert capture_grid(4) == [1, 2, 4] and capture_grid(7) == [1, 2, 4]
    assert capture_grid(255)[-2:] == [240, 248] and capture_grid(256)[-2:] == [248, 256]
    assert capture_grid(271)[-1] == 256 and capture_grid(272)[-1] == 272


@pytest.mark.parametrize("max_num_seqs,budget,ceiling,expected_max,off_grid", [
    (100, 8192, 512, 200, 100),  # K=0: max_num_seqs itself is captured (vllm.py:2471-2550): 100 between 96 and 104
    (300, 8192, 512, 512, 300),  # 300 between 288 and 304
    (600, 8192, 1024, 1024, 600),  # the ceiling is the device's
])
def test_without_speculation_max_num_seqs_itself_is_a_capture_size(max_num_seqs, budget, ceiling, expected_max,
                                                                   off_grid):
    sizes = capture_sizes(None, max_num_seqs=max_num_seqs, spec_k=0, max_num_batched_tokens=budget, ceiling=ceiling)
    assert sizes[-1] == expected_max and off_grid in sizes
    assert sizes == sorted(set(capture_grid(expected_max)) | {off_grid})


def test_decode_sizes_never_pass_the_token_budget_and_the_budget_is_captured():
    # max min(300 x 2, 512) = 512, capped at the 280-token budget; 300 is past it; 280 itself is captured
    assert capture_sizes(None, max_num_seqs=300, spec_k=0, max_num_batched_tokens=280)[-3:] == [256, 272, 280]
    assert capture_sizes(None, max_num_seqs=600, spec_k=0, max_num_batched_tokens=8192)[-1] == 512  # 600 > max
    assert 600 not in capture_sizes(None, max_num_seqs=600, spec_k=0, max_num_batched_tokens=8192)
    # an explicit maximum above the budget is capped at the budget, which is then captured too
    assert capture_sizes(1024, max_num_seqs=128, spec_k=0, max_num_batched_tokens=500)[-2:] == [496, 500]
    # a budget above the maximum is not captured
    assert capture_sizes(256, max_num_seqs=128, spec_k=0, max_num_batched_tokens=8192)[-1] == 256


def test_decode_sizes_with_speculation_use_the_request_count_grid():
    # K=1, max_num_seqs=20: max min(20 x 2 x 2, 512) = 80; request counts 1, 2, 4, 8, 16 and 20 -> 2 .. 40
    sizes = capture_sizes(None, max_num_seqs=20, spec_k=1, max_num_batched_tokens=8192)
    assert sizes == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80]  # 20 x 2 = 40 is on the grid already
    # K=2, max_num_seqs=20: max 120; 1..20 requests of 3 tokens add 3, 6, 12, 24, 48 and 60
    sizes = capture_sizes(None, max_num_seqs=20, spec_k=2, max_num_batched_tokens=8192)
    assert sizes == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 56, 60, 64, 72, 80, 88, 96, 104, 112, 120]
    # requests are counted up to the ceiling: 600 requests of 2 tokens, capped at 512 requests, past the max
    assert capture_sizes(None, max_num_seqs=600, spec_k=1, max_num_batched_tokens=8192)[-1] == 512


def test_v1_rounding_that_leaves_no_size_is_refused():
    with pytest.raises(ValueError) as refused:
        predict({"cudagraph.capture": 2, "spec.k": 3, "runner": "v1"})
    assert str(refused.value) == ("no CUDA-graph size is left after rounding to multiples of K+1=4 (largest size "
                                  "2); raise cudagraph.capture or lower spec.k")
    assert predict({"cudagraph.capture": 4, "spec.k": 3, "runner": "v1"})["capture_sizes"] == [4]
    # 10 truncates onto the grid as 8; 3, 6 and 9 round up from it, 9 is past 8
    assert predict({"cudagraph.capture": 10, "spec.k": 2, "runner": "v1"})["capture_sizes"] == [3, 6]
    # K=1: multiples of 2, so the sizes 1 is rounded away
    assert predict({"cudagraph.capture": 10, "spec.k": 1, "runner": "v1"})["capture_sizes"] == [2, 4, 8]
    # V1 rounds only with speculation
    assert predict({"cudagraph.capture": 10, "spec.k": 0, "runner": "v1"})["capture_sizes"] == [1, 2, 4, 8]


def test_device_tiers_at_their_memory_edges():
    from oneknob.config.resolution import Device

    assert Device("X", "cuda", (9, 0), 160).llm_defaults() == (16384, 1024)
    assert Device("X", "cuda", (9, 0), 159.9).llm_defaults() == (16384, 1024)  # >= 70 and no A100
    assert Device("X", "cuda", (9, 0), 70).llm_defaults() == (16384, 1024)
    assert Device("X", "cuda", (9, 0), 69.9).llm_defaults() == (8192, 256)
    assert Device("NVIDIA A100-SXM4-80GB", "cuda", (8, 0), 80).llm_defaults() == (8192, 256)
    assert Device("a100", "cuda", (8, 0), 200).llm_defaults() == (16384, 1024)  # 160 GiB and more: large
    assert Device("a100", "cuda", (8, 0), 160).llm_defaults() == (16384, 1024)
    assert Device("a100", "cuda", (8, 0), 159.9).llm_defaults() == (8192, 256)
    assert Device("GB10", "cuda", (12, 1), 200).llm_defaults() == (16384, 1024)
    assert Device("X", "cpu", None, 500).llm_defaults() == (4096, 256)
    assert Device("X", "cuda", None, 80).capture_ceiling == 512
    assert Device("X", "cuda", (10, 0), 80).capture_ceiling == 1024 and Device("X", "cuda", (9, 0)).capture_ceiling \
        == 512
    assert device_named("b200").name == "B200" and device_named("CPU").platform == "cpu"
    with pytest.raises(ConfigError) as refused:
        device_named("V100")
    assert str(refused.value) == ("engine.target_gpu=V100: not one device of oneknob's table; give one of A100, L40S, "
                                  "H100, H200, B200, B300, GB10, cpu (e.g. engine.target_gpu=H100)")


def test_a_defaulted_max_num_seqs_never_exceeds_the_token_budget_and_an_explicit_one_is_kept():
    assert predict({}, max_num_batched_tokens=200)["max_num_seqs"] == 200
    assert predict({"sched.max_num_seqs": 300}, max_num_batched_tokens=200)["max_num_seqs"] == 300
    assert predict({}, default_max_num_seqs=64)["max_num_seqs"] == 64
    assert predict({}, platform="cpu")["max_num_seqs"] == 256 and predict({}, platform="cpu")["max_capture_size"] \
        is None


def test_what_the_rules_say_of_speculation_the_runner_and_emulation():
    assert predict({"spec.k": 0}, spec_method="ngram")["spec_method"] is None
    assert predict({"runner": "v2"}, default_runner="v1")["runner"] == "v2"
    assert predict({}, emulated=True)["cudagraph_emulated"] is False  # a GPU's graphs are real
    eager = predict({"cudagraph.enforce_eager": True}, platform="cpu", emulated=True)
    assert (eager["cudagraph_mode"], eager["max_capture_size"], eager["capture_sizes"]) == ("NONE", 0, [])
    assert eager["cudagraph_emulated"] is True
    with pytest.raises(ValueError) as refused:
        predict({}, platform="tpu")
    assert str(refused.value) == "platform='tpu': unknown platform; use one of cuda, cpu, synthetic"


def test_graphs_on_needs_a_graph_mode_and_a_size():
    from oneknob.config.resolution import graphs_on

    assert graphs_on({"cudagraph_mode": "FULL_AND_PIECEWISE", "capture_sizes": [1]})
    assert not graphs_on({"cudagraph_mode": "FULL_AND_PIECEWISE", "capture_sizes": []})
    assert not graphs_on({"cudagraph_mode": "NONE", "capture_sizes": [1]})
    assert not graphs_on({"capture_sizes": [1]}) and not graphs_on({})


def test_the_engine_args_family_knob_sets_the_token_budget_of_the_prediction():
    seed = {"sched.max_num_seqs": 128, "spec.k": 3}
    assert predict(seed, max_num_batched_tokens=2048)["max_num_batched_tokens"] == 2048
    found = predict(seed | {"engine_args.max_num_batched_tokens": 1024}, max_num_batched_tokens=2048)
    assert found["max_num_batched_tokens"] == 1024
    assert predict(seed | {"engine_args.max_num_batched_tokens": None}, max_num_batched_tokens=2048)[
        "max_num_batched_tokens"] == 2048


# `vllm serve` (UsageContext.OPENAI_API_SERVER) per device: the same get_batch_defaults table of
# vllm/engine/arg_utils.py as LLM's, with a smaller token budget below 160 GiB and half of both on CPU.
@pytest.mark.parametrize("device,batched_tokens,max_num_seqs", [
    ("A100", 2048, 256), ("L40S", 2048, 256), ("H100", 8192, 1024), ("H200", 8192, 1024),
    ("B200", 16384, 1024), ("B300", 16384, 1024), ("GB10", 2048, 256), ("cpu", 2048, 128),
])
def test_the_server_engine_plans_with_the_defaults_of_vllm_serve(device, batched_tokens, max_num_seqs):
    """The vllm_server engine predicts with what `vllm serve` picks when neither max_num_batched_tokens nor
    max_num_seqs is set on the target device, not with the offline `LLM` class's larger budget."""
    from oneknob.engines.vllm.server import VllmServerFacts

    assert device_named(device).server_defaults() == (batched_tokens, max_num_seqs)
    planned = VllmServerFacts().defaults({"target_gpu": device})
    assert (planned["max_num_batched_tokens"], planned["default_max_num_seqs"]) == (batched_tokens, max_num_seqs)


def test_server_tiers_at_their_memory_edges():
    """`vllm serve`'s tiers switch where LLM's do: 160 GiB and more (even an A100) -> 16384 tokens, 1024 seqs;
    70 GiB and more but no A100 -> 8192, 1024; less -> 2048, 256; CPU 2048, 128 whatever the memory."""
    from oneknob.config.resolution import Device

    assert Device("X", "cuda", (9, 0), 160).server_defaults() == (16384, 1024)
    assert Device("X", "cuda", (9, 0), 159.9).server_defaults() == (8192, 1024)
    assert Device("X", "cuda", (9, 0), 70).server_defaults() == (8192, 1024)
    assert Device("X", "cuda", (9, 0), 69.9).server_defaults() == (2048, 256)
    assert Device("a100", "cuda", (8, 0), 160).server_defaults() == (16384, 1024)
    assert Device("NVIDIA A100-SXM4-80GB", "cuda", (8, 0), 80).server_defaults() == (2048, 256)
    assert Device("X", "cpu", None, 500).server_defaults() == (2048, 128)
