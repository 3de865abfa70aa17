"""A tiny MiMo-style checkpoint with one MTP layer, built from nothing on any machine.

vLLM runs it with `speculative_config={"method": "mtp", ...}` (drafter
`MiMoMTPModel`), so the whole speculative-decoding path runs on a laptop CPU
in seconds. Everything is made here: a byte-level BPE tokenizer and a small
Qwen2 body trained briefly on the Python standard library's own sources (text
every machine with Python has), plus an MTP layer distilled from the body so
its drafts are mostly accepted. The result is deterministic given the seed and
the corpus; `oneknob_build.json` records both, so a fingerprint is stable.

    python -m oneknob.tiny_model [--out models/tiny-mtp] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from oneknob.provision.corpus import stdlib_files

VERSION = 1  # bump when the recipe changes: it is part of the fingerprint
SEED = 0
DEFAULT_OUT = Path("models/tiny-mtp")
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
EXPECTED = "about a minute on 2 CPU cores"  # measured: 38 s for the whole build on this recipe's 2 threads
TRAIN = {"steps": 300, "batch": 4, "seq_len": 256, "lr": 3e-3, "warmup": 20, "threads": 2, "mtp_weight": 1.0}

# The corpus: the top-level stdlib modules, by name, small files only, bounded in total.
CORPUS_MAX_FILE_BYTES = 60_000
CORPUS_MAX_FILES = 200
CORPUS_MAX_BYTES = 3_000_000
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "oneknob_build.json")
# Every build carries this marker: oneknob writes into, replaces or deletes a model directory only when it holds
# the marker (or, for builds made before the marker, an oneknob_build.json whose "builder" is this module).
MARKER = ".oneknob-tiny-model"
BUILDER = "oneknob.tiny_model"


def stdlib_corpus_files() -> list[Path]:
    """The corpus: sorted top-level `*.py` files of this Python's stdlib (bounded, deterministic)."""
    files, total = [], 0
    for path in stdlib_files():  # the evaluation corpus's file list, bounded for training
        size = path.stat().st_size
        if size > CORPUS_MAX_FILE_BYTES or size == 0:
            continue
        if len(files) == CORPUS_MAX_FILES or total + size > CORPUS_MAX_BYTES:
            break
        files.append(path)
        total += size
    if not files:
        raise RuntimeError("no *.py files in the stdlib: the tiny model needs the Python standard library sources")
    return files


def _corpus_texts(files: list[Path]) -> list[str]:
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def corpus_fingerprint(files: list[Path] | None = None) -> str:
    """sha256 over (name, content) of the corpus files; names only relative to the stdlib."""
    digest = hashlib.sha256()
    for path in files or stdlib_corpus_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def fingerprint(seed: int = SEED, corpus: str | None = None) -> str:
    """What identifies a build: recipe version, seed, config, training settings, corpus."""
    payload = json.dumps(
        {"version": VERSION, "seed": seed, "config": CONFIG, "train": TRAIN, "corpus": corpus or corpus_fingerprint()},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


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


def _save_tokenizer(tok, out: Path) -> None:
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


def _state_dict(model) -> dict:
    # Checkpoint names as vLLM's MiMo loaders expect (mtp block modules directly
    # under model.mtp_layers.{j}).
    return {name: p.detach().contiguous().clone() for name, p in model.named_parameters()}


def build(path: str | Path, seed: int = SEED, log=print) -> Path:
    """Build the checkpoint into `path` (replacing it), atomically: tmp dir, then rename."""
    import torch
    from safetensors.torch import save_file

    from oneknob.console import make_console, steps

    out = Path(path)
    if not may_build_into(out):  # before any work: never replace a directory oneknob did not build
        raise NotOurs(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    files = stdlib_corpus_files()
    texts = _corpus_texts(files)
    corpus = corpus_fingerprint(files)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model dir is shared by jobs
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(TRAIN["threads"])  # fixed reduction order regardless of machine size
        log(f"building the tiny MTP model {out} on first use ({EXPECTED}): a tokenizer, then "
            f"{TRAIN['steps']} training steps; later runs reuse it")
        tok = train_tokenizer(texts)
        _save_tokenizer(tok, tmp)
        with steps(make_console(), TRAIN["steps"], "tiny model: training") as advance:
            model = train(tok, texts, seed=seed, log=log, on_step=advance)
        tensors = _state_dict(model)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(CONFIG, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 0}, indent=2))
        weights_sha = hashlib.sha256((tmp / "model.safetensors").read_bytes()).hexdigest()
        info = {
            "builder": BUILDER,
            "version": VERSION,
            "seed": seed,
            "fingerprint": fingerprint(seed, corpus),
            "corpus": {
                "fingerprint": corpus,
                "files": len(files),
                "bytes": sum(len(t) for t in texts),
                "python": sys.version.split()[0],
            },
            "config": CONFIG,
            "train": TRAIN,
            # Informational: bitwise equal on one machine, may differ across CPU ISAs.
            "weights_sha256": weights_sha,
            "parameters": sum(t.numel() for t in tensors.values()),
            "build_seconds": round(time.monotonic() - t0, 1),
        }
        (tmp / "oneknob_build.json").write_text(json.dumps(info, indent=2))
        (tmp / MARKER).write_text("built by python -m oneknob.tiny_model; oneknob may replace this directory\n")
        if out.exists():
            if not ours(out):  # checked by the planner first; never replace a directory oneknob did not build
                raise NotOurs(out)  # an incomplete or stale build: move it aside, then swap in
            stale = Path(tempfile.mkdtemp(prefix=f".{out.name}.stale.", dir=out.parent))
            os.replace(out, stale / out.name)
            os.replace(tmp, out)
            shutil.rmtree(stale, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        torch.set_num_threads(threads)
    log(f"tiny MTP model built in {time.monotonic() - t0:.1f} s: {out}")
    return out


class NotOurs(RuntimeError):
    def __init__(self, path: Path):
        super().__init__(f"{path}: an existing directory that oneknob's tiny-model builder did not make (no "
                         f"{MARKER} marker); oneknob never writes into, replaces or deletes it")
        self.path = path


def ours(path: str | Path) -> bool:
    """Whether `path` is a directory oneknob's builder made: the marker, or (builds from before the marker) an
    oneknob_build.json that names this builder. A missing path is not ours, and not anyone's."""
    out = Path(path)
    if not out.is_dir():
        return False
    if (out / MARKER).is_file():
        return True
    try:
        info = json.loads((out / "oneknob_build.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("builder") == BUILDER


def may_build_into(path: str | Path) -> bool:
    """A path the builder may (re)build: not there yet, or a build of its own."""
    out = Path(path)
    return not (out.exists() or out.is_symlink()) or ours(out)


def is_complete(path: str | Path, seed: int = SEED) -> bool:
    """All files present and built by this recipe from this corpus with this seed."""
    out = Path(path)
    if not all((out / name).is_file() for name in REQUIRED_FILES):
        return False
    try:
        info = json.loads((out / "oneknob_build.json").read_text())
    except (OSError, ValueError):
        return False
    return info.get("fingerprint") == fingerprint(seed)


def ensure(path: str | Path = DEFAULT_OUT, seed: int = SEED, log=print) -> Path:
    """The checkpoint at `path`, built first if missing or incomplete.

    Safe when several jobs call it at once: one builds, the others wait on a lock.
    """
    from oneknob.files import locked

    out = Path(path)
    if is_complete(out, seed):
        return out
    if not may_build_into(out):
        raise NotOurs(out)
    with locked(out.parent / f".{out.name}.lock"):
        if not is_complete(out, seed):
            _drop_unfinished(out)
            build(out, seed=seed, log=log)
    return out


def _drop_unfinished(out: Path) -> None:
    """Scratch directories of builds that were killed (SIGKILL skips their cleanup): only oneknob's builder makes
    `.<name>.<random>/` beside the model, and only while it holds the lock this caller now holds."""
    for scratch in out.parent.glob(f".{out.name}.*"):
        if scratch.is_dir() and not scratch.is_symlink():
            shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oneknob.tiny_model", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="model directory (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a complete build is there")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    try:
        if args.force:
            build(args.out, seed=args.seed)
        else:
            ensure(args.out, seed=args.seed)
    except NotOurs as exc:
        print(f"tiny_model: --out {exc}; give --out a new directory", file=sys.stderr)
        return 2
    info = json.loads((Path(args.out) / "oneknob_build.json").read_text())
    print(f"{args.out}: fingerprint {info['fingerprint']}, {info['parameters']} parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
