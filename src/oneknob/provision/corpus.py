"""Prompts of an exact token length, from a local corpus that every machine has.

The corpus is one token stream, cut into samples of `corpus.sample_tokens`
consecutive tokens; the prompt for (length L, sample i) is the first L tokens
of sample i. Deterministic, and fingerprinted (text, tokenizer, cut), so a
cached point or a stored reference is never reused for different prompts.
Default text: the Python standard library's own sources (sorted top-level
modules), which every Python install carries.
"""

from __future__ import annotations

import functools
import hashlib
import json
import stat
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from oneknob.config import model_override
from oneknob.errors import Refused

STDLIB_MAX_CHARS = 3_000_000


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids (vocab 256): the synthetic engine's tokenizer."""

    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


BYTES = ByteTokenizer()


class FileTokenizer:
    """A Hugging Face tokenizer, read from a local tokenizer.json or by id. `overrides` (model.override.<path>):
    the model's config.json fields changed for the job; transformers' AutoTokenizer gets that config (it picks
    the tokenizer's class from it), a tokenizer.json alone reads no config."""

    def __init__(self, path: str, overrides: str = "", trust_remote_code: bool = False):
        self.name = path
        local = Path(path) / "tokenizer.json"
        if local.is_file():
            from tokenizers import Tokenizer as HFTokenizer

            self._tok = HFTokenizer.from_file(str(local))
            self._encode = lambda text: self._tok.encode(text, add_special_tokens=False).ids
            self.name = f"{path} (sha256 {hashlib.sha256(local.read_bytes()).hexdigest()[:12]})"
        else:  # a hub id on a GPU machine with the model cached
            from transformers import AutoTokenizer

            config = {"config": model_override.pretrained_config(path, json.loads(overrides))} if overrides else {}
            self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True,  # no download at run time
                                                      trust_remote_code=trust_remote_code, **config)
            self._encode = lambda text: self._tok.encode(text, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return self._encode(text)


def stdlib_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in stdlib.glob("*.py") if p.is_file())


def stdlib_text(max_chars: int = STDLIB_MAX_CHARS, enough_chars: int | None = None) -> str:
    """The stdlib's sources joined, whole files only until `enough_chars`, never past `max_chars`."""
    parts, total = [], 0
    for path in stdlib_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= min(max_chars, enough_chars or max_chars):
            break
    return "\n".join(parts)[:max_chars]


class CorpusError(Refused):
    pass


@dataclass(frozen=True)
class Corpus:
    samples: tuple[tuple[int, ...], ...]
    source: str
    fingerprint: str

    def prompt(self, length: int, sample: int) -> list[int]:
        return list(self.samples[sample][:length])


MAX_CORPUS_BYTES = 200 * 2**20  # read whole; prompts need a few MB at most
MAX_UNDECODABLE = 0.01  # share of bytes that are not UTF-8 text (or NUL) a corpus may hold


def read_text(path: str | None, enough_chars: int | None = None) -> tuple[str, str]:
    """(text, source description); raises CorpusError naming corpus.path."""
    if path is None:
        return stdlib_text(enough_chars=enough_chars), "python-stdlib"
    file = Path(path)
    fix = "give a readable UTF-8 text file, or corpus.path=null for the Python standard library's sources"
    try:
        info = file.stat()
        if not stat.S_ISREG(info.st_mode):  # /dev/zero never ends, a FIFO blocks until someone writes
            raise CorpusError(f"corpus.path={path}: not a regular file; {fix}")
        if info.st_size > MAX_CORPUS_BYTES:
            raise CorpusError(f"corpus.path={path}: {info.st_size / 2**20:.0f} MB is more than the "
                              f"{MAX_CORPUS_BYTES // 2**20} MB oneknob reads; cut a smaller text file from it")
        data = file.read_bytes()
    except OSError as exc:
        raise CorpusError(f"corpus.path={path}: cannot read it ({exc.strerror}); {fix}") from None
    text = data.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") + text.count("\x00")
    if bad > MAX_UNDECODABLE * max(len(text), 1):
        raise CorpusError(f"corpus.path={path}: {bad} of {len(text)} characters are not UTF-8 text (a binary "
                          f"file?); {fix}")
    if not text.strip():
        raise CorpusError(f"corpus.path={path}: the file is empty; give a text file with content")
    return text, str(file.resolve())


@functools.lru_cache(maxsize=8)
def load_corpus(path: str | None, tokenizer: Tokenizer, sample_tokens: int, samples: int) -> Corpus:
    needed = samples * sample_tokens
    # Tokenizing all 3 MB of the default text took ~2 s per job for ~16 KB of prompts: read whole files
    # until the stream is long enough (a margin keeps the cut away from the text's end, where a
    # tokenizer may merge differently), and the full text only when that does not suffice.
    enough = needed * 8
    while True:
        text, source = read_text(path, enough)
        ids = tokenizer.encode(text)
        if path is not None or len(ids) >= needed + 256 or enough >= STDLIB_MAX_CHARS:
            break
        enough *= 4
    available = len(ids) // sample_tokens
    if available < samples:
        raise CorpusError(
            f"samples={samples}: the corpus ({source}) has {len(ids)} tokens, enough for {available} "
            f"sample(s) of corpus.sample_tokens={sample_tokens}; lower samples or corpus.sample_tokens, "
            "or give a longer corpus.path")
    cut = tuple(tuple(ids[i * sample_tokens:(i + 1) * sample_tokens]) for i in range(samples))
    digest = hashlib.sha256()
    digest.update(f"{tokenizer.name}|{sample_tokens}|{samples}|".encode())
    for sample in cut:
        digest.update(",".join(map(str, sample)).encode())
    return Corpus(cut, source, digest.hexdigest()[:16])


@functools.lru_cache(maxsize=8)
def file_tokenizer(path: str, overrides: str = "", trust_remote_code: bool = False) -> FileTokenizer:
    """`overrides`: the model's config.json overrides as JSON (hashable), "" for none."""
    return FileTokenizer(path, overrides, trust_remote_code)
