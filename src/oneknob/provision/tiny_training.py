"""The tiny model's network and its training: architecture, tokenizer, training loop, checkpoint tensors.

A MiMo-style body (Qwen2 blocks) with one MTP layer, in plain torch with vLLM's semantics, a byte-level BPE
tokenizer, and the training that makes NLL fall with context and the drafts mostly accepted. The recipe's
constants live here; oneknob.provision.tiny_model builds, fingerprints and guards the checkpoint directory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

SEED = 0
EOS = "<|endoftext|>"

# The architecture (vLLM-CPU rejects head_dim 16; 64 works).
CONFIG = {
    "architectures": ["MiMoForCausalLM"],
    "model_type": "qwen2",  # transformers has no "mimo" type; Qwen2Config keeps the extra field
    "num_nextn_predict_layers": 1,
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,  # the MTP drafter loads lm_head.weight by name
    "use_sliding_window": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "torch_dtype": "float32",
    "bos_token_id": 0,
    "eos_token_id": 0,
}

# Training: small enough for ~30 s on 2 cores, long enough that NLL falls with context.
TRAIN = {"steps": 300, "batch": 4, "seq_len": 256, "lr": 3e-3, "warmup": 20, "threads": 2, "mtp_weight": 1.0}


def train_tokenizer(texts: list[str]):
    """A byte-level BPE with vocab_size tokens, EOS at id 0. Deterministic: the
    initial alphabet is all 256 bytes, so ids never depend on hash-map order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOS) == 0 and tok.get_vocab_size() == CONFIG["vocab_size"], tok.get_vocab_size()
    return tok


def save_tokenizer(tok, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": EOS,
                "eos_token": EOS,
                "unk_token": EOS,
                "pad_token": EOS,
                "add_bos_token": False,
                "add_eos_token": False,
                "model_max_length": CONFIG["max_position_embeddings"],
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": EOS, "eos_token": EOS, "unk_token": EOS, "pad_token": EOS}, indent=2)
    )


# ---------------------------------------------------------------------------
# The model, in plain torch, with vLLM's Qwen2/MiMo semantics: pre-norm blocks,
# neox-style RoPE, q/k/v biases, GQA; the body hands the MTP layer its
# residual stream *before* the final norm (vLLM's MiMoModel does the same).


def _modules():
    import torch
    import torch.nn.functional as F
    from torch import nn

    c = CONFIG
    hidden, heads, kv_heads, head_dim = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
    )

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden))

        def forward(self, x):
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])
            return self.weight * x

    def rope(x, positions):  # x: (B, H, T, D)
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = positions.float()[:, None] * inv_freq[None, :]
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        half = head_dim // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(hidden, heads * head_dim, bias=True)
            self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=True)
            self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=True)
            self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

        def forward(self, x, positions):
            B, T, _ = x.shape
            q = self.q_proj(x).view(B, T, heads, head_dim).transpose(1, 2)
            k = self.k_proj(x).view(B, T, kv_heads, head_dim).transpose(1, 2)
            v = self.v_proj(x).view(B, T, kv_heads, head_dim).transpose(1, 2)
            q, k = rope(q, positions), rope(k, positions)
            k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(y.transpose(1, 2).reshape(B, T, heads * head_dim))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(hidden, c["intermediate_size"], bias=False)
            self.up_proj = nn.Linear(hidden, c["intermediate_size"], bias=False)
            self.down_proj = nn.Linear(c["intermediate_size"], hidden, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
            self.self_attn, self.mlp = Attention(), MLP()

        def forward(self, x, positions):
            x = x + self.self_attn(self.input_layernorm(x), positions)
            return x + self.mlp(self.post_attention_layernorm(x))

    class MTPLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_layernorm, self.hidden_layernorm, self.final_layernorm = RMSNorm(), RMSNorm(), RMSNorm()
            self.input_proj = nn.Linear(2 * hidden, hidden, bias=False)
            block = Block()
            # Named like the checkpoint: the block's modules sit directly under the layer.
            self.self_attn, self.mlp = block.self_attn, block.mlp
            self.input_layernorm, self.post_attention_layernorm = block.input_layernorm, block.post_attention_layernorm
            self._block = [block]  # not a registered submodule: no duplicate names

        def forward(self, embeds, prev_hidden, positions):
            # vLLM zeroes the token embedding at position 0 (mimo_mtp.py).
            embeds = torch.where(positions[None, :, None] == 0, torch.zeros_like(embeds), embeds)
            x = self.input_proj(torch.cat([self.hidden_layernorm(prev_hidden), self.token_layernorm(embeds)], -1))
            return self.final_layernorm(self._block[0](x, positions))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(c["vocab_size"], hidden)
            self.layers = nn.ModuleList(Block() for _ in range(c["num_hidden_layers"]))
            self.norm = RMSNorm()
            self.mtp_layers = nn.ModuleList(MTPLayer() for _ in range(c["num_nextn_predict_layers"]))

    class TinyMiMo(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Model()
            self.lm_head = nn.Linear(hidden, c["vocab_size"], bias=False)

        def forward(self, ids):
            T = ids.shape[1]
            positions = torch.arange(T)
            x = self.model.embed_tokens(ids)
            for layer in self.model.layers:
                x = layer(x, positions)
            logits = self.lm_head(self.model.norm(x))
            # MTP at position i sees (h_i, token i+1) and predicts token i+2.
            mtp = self.model.mtp_layers[0]
            mtp_hidden = mtp(self.model.embed_tokens(ids[:, 1:]), x[:, :-1], positions[:-1])
            return logits, self.lm_head(mtp_hidden)

    return TinyMiMo


def _init_weights(model, std: float, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
            continue
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g) * std if p.dim() > 1 else torch.zeros(p.shape))
    hidden = CONFIG["hidden_size"]
    with torch.no_grad():
        for mtp in model.model.mtp_layers:
            # Start the drafter at "pass the hidden state through, residual branches
            # small": it then proposes what the body just predicted, and distillation
            # moves it one token further.
            mtp.input_proj.weight.zero_()
            mtp.input_proj.weight[:, :hidden] = torch.eye(hidden)
            mtp.self_attn.o_proj.weight.mul_(0.1)
            mtp.mlp.down_proj.weight.mul_(0.1)


def _token_stream(tok, texts: list[str]):
    import torch

    ids: list[int] = []
    for text in texts:
        ids.extend(tok.encode(text).ids)
        ids.append(0)
    return torch.tensor(ids, dtype=torch.long)


def train(tok, texts: list[str], seed: int = SEED, log=print, on_step=None):
    """Train body (next-token CE) and MTP layer (KL to the body's next prediction); `on_step()` after each."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    stream = _token_stream(tok, texts)
    model = _modules()()
    _init_weights(model, CONFIG["initializer_range"], seed)
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN["lr"], weight_decay=0.01, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(seed)
    T, B, steps = TRAIN["seq_len"], TRAIN["batch"], TRAIN["steps"]
    for step in range(steps):
        lr = TRAIN["lr"] * min(1.0, (step + 1) / TRAIN["warmup"]) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(stream) - T - 1, (B,), generator=g)
        batch = torch.stack([stream[s : s + T + 1] for s in starts.tolist()])
        inputs, targets = batch[:, :-1], batch[:, 1:]
        logits, mtp_logits = model(inputs)
        loss_body = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        # Distil the body's prediction at i+1 into the MTP's prediction at i: greedy
        # drafts then agree with the body's greedy tokens most of the time.
        teacher = F.log_softmax(logits[:, 1:].detach(), -1)
        loss_mtp = F.kl_div(F.log_softmax(mtp_logits, -1), teacher, log_target=True, reduction="batchmean") / (T - 1)
        opt.zero_grad(set_to_none=True)
        (loss_body + TRAIN["mtp_weight"] * loss_mtp).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if on_step:
            on_step()
        if step % 50 == 0 or step == steps - 1:
            log(f"tiny model: training step {step + 1}/{steps}  body CE {loss_body.item():.3f}  "
                f"mtp KL {loss_mtp.item():.3f}")
    return model


def state_dict(model) -> dict:
    # Checkpoint names as vLLM's MiMo loaders expect (mtp block modules directly
    # under model.mtp_layers.{j}).
    return {name: p.detach().contiguous().clone() for name, p in model.named_parameters()}
