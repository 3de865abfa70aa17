"""A tiny MiMo-style checkpoint with one MTP layer, built from nothing on any machine.

vLLM runs it with `speculative_config={"method": "mtp", ...}` (drafter
`MiMoMTPModel`), so the whole speculative-decoding path runs on a laptop CPU
in seconds. Everything is made by oneknob: a byte-level BPE tokenizer and a
small Qwen2 body trained briefly on the Python standard library's own sources
(text every machine with Python has), plus an MTP layer distilled from the body
so its drafts are mostly accepted (the network and its training:
oneknob.provision.tiny_training; here the corpus, the fingerprint, the build
and the guard that never replaces a directory oneknob did not build). The
result is deterministic given the seed and the corpus; `oneknob_build.json`
records both, so a fingerprint is stable.

    python -m oneknob tiny-model [--out models/tiny-mtp] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from oneknob.provision.corpus import stdlib_files
from oneknob.provision.tiny_training import (
    CONFIG,
    SEED,
    TRAIN,
    save_tokenizer,
    state_dict,
    train,
    train_tokenizer,
)

VERSION = 1  # bump when the recipe changes: it is part of the fingerprint
DEFAULT_OUT = Path("models/tiny-mtp")

EXPECTED = "about a minute on 2 CPU cores"  # measured: 38 s for the whole build on this recipe's 2 threads


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
        save_tokenizer(tok, tmp)
        with steps(make_console(), TRAIN["steps"], "tiny model: training") as advance:
            model = train(tok, texts, seed=seed, log=log, on_step=advance)
        tensors = state_dict(model)
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
        (tmp / MARKER).write_text("built by python -m oneknob tiny-model; oneknob may replace this "
                                  "directory\n")
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
    parser = argparse.ArgumentParser(prog="python -m oneknob tiny-model", description=__doc__.splitlines()[0])
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
