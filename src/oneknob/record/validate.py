"""Stored measurements checked when read, before anything believes them.

Valid JSON is not a valid measurement: a stored reference or a cached point with a NaN, a string, or fewer
logprobs than its prompt has positions would be judged as if the engine had returned it (a NaN reference makes
every length "clean"). Each check returns why a stored record cannot be used (a sentence naming the stored
file's field), or None; the reader sets the file aside (files.set_aside) and the point is measured again.
"""

from __future__ import annotations

import math
from typing import Any


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _float(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def logprobs_problem(rows: Any, positions: int, field: str, malformed: bool = False) -> str | None:
    """One prompt's logprobs: `positions` finite numbers (a prompt of L tokens has L - 1); numbers of any kind
    (NaN where a row could not be read) when the engine's answer was malformed there, as the record says."""
    if not isinstance(rows, list):
        return f"{field} is {type(rows).__name__}, not a list of logprobs"
    if len(rows) != positions:
        return f"{field} holds {len(rows)} logprobs, not {positions}"
    bad = next((x for x in rows if not (_float(x) if malformed else _number(x))), "ok")
    return None if bad == "ok" else f"{field} holds {bad!r}, not a finite logprob"


def topk_problem(rows: Any, positions: int, field: str, malformed: bool = False) -> str | None:
    """One prompt's top-k: per position a list of [token id, finite logprob] ([-1, -inf] pads a row the engine's
    malformed answer left short)."""
    if not isinstance(rows, list) or len(rows) != positions:
        return f"{field} is not a top-k list of {positions} positions"

    def pair_ok(pair) -> bool:
        if malformed and isinstance(pair, list) and len(pair) == 2 and pair[0] == -1:
            return _float(pair[1])
        return isinstance(pair, list) and len(pair) == 2 and _token(pair[0]) and _number(pair[1])

    for row in rows:
        if not isinstance(row, list) or not all(pair_ok(pair) for pair in row):
            return f"{field} holds {str(row)[:60]}, not [token id, finite logprob] pairs"
    return None


def _samples(data: dict, key: str, positions: int, each) -> str | None:
    rows = data.get(key)
    if not isinstance(rows, list) or not rows:
        return f"{key} is not a non-empty list of samples"
    for sample, row in enumerate(rows):
        if (problem := each(row, positions, f"{key}[{sample}]")) is not None:
            return problem
    return None


def _length(data: dict, key: str) -> int | str:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 2 else \
        f"{key} is {value!r}, not a prompt length"


def reference_problem(name: str, data: dict) -> str | None:
    """A stored reference file (study/reference.py): long-<N>.k<K>.json or at-<L>.k<K>.json."""
    length = _length(data, "max_length" if name.startswith("long-") else "length")
    if isinstance(length, str):
        return length
    if (problem := _samples(data, "logprobs", length - 1, logprobs_problem)) is not None:
        return problem
    if data.get("topk") is not None:
        return _samples(data, "topk", length - 1, topk_problem)
    return None


def point_problem(record: Any, probe_length: int | None = None) -> str | None:
    """One cached point (a line of points.jsonl). Its logprobs are of the prompt at `length` on the length axis,
    of the probe (`probe_length`) on the others; a repeat point's outputs are all of the repeated prompt."""
    if not isinstance(record, dict):
        return f"a line holds {type(record).__name__}, not a point"
    for key in ("sample", "length"):
        if not isinstance(record.get(key), int) or isinstance(record.get(key), bool) or record[key] < 0:
            return f"{key} is {record.get(key)!r}, not a count"
    if not _number(record.get("seconds", 0.0)):
        return f"seconds is {record.get('seconds')!r}, not a number"
    where = f"sample {record['sample']} at {record['length']}"
    positions = (probe_length if probe_length else record["length"]) - 1
    malformed = record.get("malformed") or {}  # what the engine answered wrongly (oneknob.engines.answers)
    if not isinstance(malformed, dict) or not all(isinstance(v, str) for v in malformed.values()):
        return f"malformed ({where}) is not a mapping of fields to reasons"
    if (problem := logprobs_problem(record.get("logprobs"), positions, f"logprobs ({where})",
                                    "logprobs" in malformed)) is not None:
        return problem
    if record.get("topk") is not None and (problem := topk_problem(record["topk"], positions, f"topk ({where})",
                                                                    "topk" in malformed)):
        return problem
    if "greedy" in record and not (isinstance(record["greedy"], list) and all(
            _token(t) or ("greedy" in malformed and t == -1) for t in record["greedy"])):
        return f"greedy ({where}) is not a list of token ids"
    if "greedy_logprobs" in record and (problem := logprobs_problem(
            record["greedy_logprobs"], len(record.get("greedy") or []), f"greedy_logprobs ({where})",
            "greedy_logprobs" in malformed)):
        return problem
    if "repeats" in record:
        repeats = record["repeats"]
        if not isinstance(repeats, list) or not repeats:
            return f"repeats ({where}) is not a list of outputs"
        for i, row in enumerate(repeats):
            if (problem := logprobs_problem(row, positions, f"repeats[{i}] ({where})",
                                            "logprobs" in malformed)) is not None:
                return problem
    return None


def meta_problem(data: dict) -> str | None:
    """A point cache's meta.json: the resolved config and provenance it recorded are mappings."""
    for key in ("resolved", "provenance"):
        if key in data and not isinstance(data[key], dict):
            return f"{key} is {type(data[key]).__name__}, not a mapping"
    return None


def continuation_problem(data: Any, tokens: list[int]) -> str | None:
    """A stored teacher-forced score of one continuation (study/continuations.py): a reference logprob and a
    reference choice per generated token."""
    if not isinstance(data, dict):
        return f"it holds {type(data).__name__}, not a score"
    if data.get("tokens") != [int(t) for t in tokens]:
        return "its tokens are not the continuation it is stored under"
    if (problem := logprobs_problem(data.get("logprobs"), len(tokens), "logprobs")) is not None:
        return problem
    argmax = data.get("argmax")
    if not isinstance(argmax, list) or len(argmax) != len(tokens) or not all(map(_token, argmax)):
        return f"argmax is not {len(tokens)} token ids"
    return None
