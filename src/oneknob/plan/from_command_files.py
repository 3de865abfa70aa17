"""What a pasted line is read from, and what it reads: bounded and text before anything parses it, and the files
it names keyed by their content, so a parse is never older than what it read (oneknob.plan.from_command)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from oneknob.errors import ConfigError

# A command line, even one with a JSON config in it, is a few kilobytes; shlex takes time quadratic in one long
# word (300 KB: seconds, 30 MB: forever), so anything longer is refused before it is split.
MAX_CHARS = 100_000


def read(text: str | None) -> str:
    """The line: from_command=@path reads it from a file. Bounded in size before anything parses it, and text:
    a binary file or a log is refused, naming what it is."""
    text = (text or "").strip()
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        try:
            size = path.stat().st_size
            if size > MAX_CHARS * 4:  # refused before it is read: UTF-8 takes at most 4 bytes a character
                raise ConfigError(f"from_command=@{path}: the file holds {size:,} bytes; a command line is at most "
                                  f"{MAX_CHARS:,} characters: put the reporter's command alone in the file")
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"from_command=@{path}: cannot read it ({exc.strerror or exc}); give a file holding "
                              "the reporter's command line, or the line itself") from None
        try:
            text = data.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise ConfigError(f"from_command=@{path}: not a text file (byte {data[exc.start]:#04x} at offset "
                              f"{exc.start} is no UTF-8); give a file holding the reporter's command line") from None
        if "\0" in text:
            raise ConfigError(f"from_command=@{path}: not a text file (it holds NUL bytes); give a file holding "
                              "the reporter's command line")
    if len(text) > MAX_CHARS:
        raise ConfigError(f"from_command: the line is {len(text):,} characters; a command line is at most "
                          f"{MAX_CHARS:,}: paste the reporter's command alone, not a log around it")
    if not text:
        raise ConfigError("from_command is empty: give the reporter's command line, e.g. from_command=\"vllm serve "
                          "MODEL --max-num-seqs 128\", an LLM(...) call, or from_command=@file")
    return text


HASHED_BYTES = 1 << 20  # a --config YAML or a chat template is far smaller; a GGUF model file is gigabytes


def reads(argv: list[str]) -> dict[str, str]:
    """{path: sha256 of its content} of every file the line names (a --config YAML vLLM's parser reads, a chat
    template): a parse depends on them, so it is cached by them, never by the line's text alone. A file past
    HASHED_BYTES (`vllm serve model.gguf`) is keyed by its size and modification time: read whole, it would cost
    seconds a gigabyte at every plan."""
    found = {}
    for word in argv:
        for candidate in {word, word.split("=", 1)[-1]}:
            path = Path(candidate).expanduser()
            try:
                if candidate and path.is_file():
                    stat = path.stat()
                    found[str(path.resolve())] = (hashlib.sha256(path.read_bytes()).hexdigest()
                                                  if stat.st_size <= HASHED_BYTES else
                                                  f"{stat.st_size} bytes, modified {stat.st_mtime_ns}")
            except OSError:  # unreadable: vLLM's parser says so, if it reads it
                continue
    return found
