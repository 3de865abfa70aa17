"""An engine's answer, checked where every engine's answer leaves the worker: a malformed answer is a measurement.

A numerics bug answers; it does not crash. Prompt logprobs with rows missing, a row without the prompt's own
token, fewer rows than the prompt has positions, NaN or inf values, or a continuation whose tokens or logprobs
are missing or non-finite: each is what the engine said about that point, so the point is judged (polluted, with
the reason, by the oracles that read the malformed part) and searched like any other. Only no answer at all (the
engine died, hung or refused the request) is an engine error.

Two halves:
  `prompt_rows` reads the prompt-logprob rows of a vLLM face (the offline `LLM`'s {token id: Logprob} entries,
      the server's JSON) into the answer's shape, saying what it could not read instead of raising.
  `check` is the one check every engine's answer passes (oneknob.run.worker, for vllm, vllm_server,
      transformers and synthetic alike): the shapes the request asked for, finite values; what is wrong is
      recorded under "malformed", keyed by the answer's field, and the arrays are padded to the shapes asked for
      (NaN, or id -1 in a top-k row) so the protocol, the cache and the judge see one shape.

"malformed": {"logprobs": reason, "topk": reason, "greedy": reason, "greedy_logprobs": reason} (only the fields
that are). The oracles that read each field (oneknob.verdict.judge.MALFORMED_FIELDS) are judged polluted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

NAN = float("nan")


def _count(what: int, of: int, text: str) -> str:
    return f"{what} of {of} {text}"


def prompt_rows(entries: list | None, ids: list[int], own: Callable[[Any, int], Any],
                ranked: Callable[[Any], list[tuple]] | None = None, topk: int = 0) -> dict[str, Any]:
    """{"logprobs", "topk"?, "malformed"?} from one prompt's rows as an engine returned them: `entries[p]` the row
    of position p (p = 0 holds nothing: no token precedes it), `own(row, token)` the prompt token's logprob in a
    row (None when the row lacks it), `ranked(row)` its [(rank, token, logprob)]. A row that cannot be read gives
    NaN (the check counts it), never an exception."""
    positions = len(ids) - 1
    reasons: dict[str, list[str]] = {"logprobs": [], "topk": []}
    if entries is None:
        reasons["logprobs"].append("no prompt logprobs at all")
        entries = []
    elif not isinstance(entries, Sequence) or isinstance(entries, (str, bytes)):  # JSON can hold anything
        reasons["logprobs"].append(f"the prompt logprobs are a {type(entries).__name__}, not a list of rows")
        entries = []
    elif len(entries) != len(ids):
        reasons["logprobs"].append(f"{len(entries)} rows for a {len(ids)}-token prompt (its first position has "
                                   f"none: {len(ids)} expected)")
    logprobs, table, missing, lacking, read = [], [], 0, 0, []
    for position in range(1, len(ids)):
        row = entries[position] if position < len(entries) else None
        if row is None or not hasattr(row, "items"):
            missing += 1
            logprobs.append(NAN)
            table.append([])
            continue
        value = _read(own, row, ids[position])
        if value is None:
            lacking += 1
            logprobs.append(NAN)
        else:
            logprobs.append(_float(value))
            read.append(logprobs[-1])
        if topk and ranked is not None:
            entries_read = _read(ranked, row) or []  # unreadable: an empty row, which check() counts
            table.append([(t, _float(lp)) for rank, t, lp in sorted(entries_read, key=lambda r: (r[0], r[1]))
                          if rank <= topk])
    if missing and positions:
        text = _count(missing, positions, "rows are missing")
        reasons["logprobs"].append(text)
        reasons["topk"].append(text)
    if lacking:
        reasons["logprobs"].append(_count(lacking, positions, "rows lack the prompt's token"))
    if reasons["logprobs"]:  # the rows it could read, counted here: check() cannot tell them from the NaN above
        reasons["logprobs"] += _non_finite(read, positions, "logprobs")
    result: dict[str, Any] = {"logprobs": logprobs}
    if topk:
        result["topk"] = table
    malformed = {field: "; ".join(said) for field, said in reasons.items() if said and (field != "topk" or topk)}
    if malformed:
        result["malformed"] = malformed
    return result


def generated(tokens: list[int], entries: list | None, greedy: int, own: Callable[[Any, int], Any]) -> dict:
    """{"greedy", "greedy_logprobs", "malformed"?}: each generated token's own logprob from per-step rows (vLLM's
    {token id: Logprob}); a step whose row lacks its token gives NaN and a reason."""
    tokens = list(tokens)[:greedy]
    entries = list(entries or [])
    logprobs, lacking, read = [], 0, []
    for step, token in enumerate(tokens):
        row = entries[step] if step < len(entries) else None
        value = own(row, token) if row is not None and hasattr(row, "items") else None
        if value is None:
            lacking += 1
        else:
            read.append(_float(value))
        logprobs.append(NAN if value is None else _float(value))
    result: dict[str, Any] = {"greedy": tokens, "greedy_logprobs": logprobs}
    if lacking:
        said = [_count(lacking, len(tokens), "generated tokens have no logprob of their own")]
        result["malformed"] = {"greedy_logprobs": "; ".join(said + _non_finite(read, len(tokens),
                                                                               "generated-token logprobs"))}
    return result


def _read(read: Callable, *args: Any) -> Any:
    """`read(*args)`, or None where the engine's row cannot be read so (a token id or rank that is no number, an
    entry of another shape); a top-k row's entries come back with a numeric rank and an integer id, or not at all."""
    try:
        value = read(*args)
        if isinstance(value, list):
            value = [(rank, t, lp) for rank, t, lp in value
                     if isinstance(rank, (int, float)) and not isinstance(rank, bool) and isinstance(t, int)]
        return value
    except (TypeError, ValueError, AttributeError, KeyError, IndexError):
        return None


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return NAN


def _non_finite(values, of: int, what: str) -> list[str]:
    array = np.asarray(values, dtype=np.float64)
    nan, inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
    return ([_count(nan, of, f"{what} are NaN")] if nan else []) + ([_count(inf, of, f"{what} are infinite")]
                                                                     if inf else [])


def _floats(values: Any) -> list[float]:
    """A list of floats (numpy's conversion at once where it can; a value that is no number becomes NaN)."""
    try:
        return np.asarray(values if values is not None else [], dtype=np.float64).ravel().tolist()
    except (TypeError, ValueError):
        return [_float(v) for v in values]


def _merge(malformed: dict[str, str], field: str, said: list[str]) -> None:
    said = [s for s in said if s and s not in (malformed.get(field) or "")]
    if said:
        malformed[field] = "; ".join(filter(None, [malformed.get(field), *said]))


def check(answer: dict[str, Any], length: int, topk: int = 0, greedy: int = 0) -> dict[str, Any]:
    """The answer to one prompt of `length` tokens, as asked (`topk` per position, a `greedy` continuation), in the
    shape asked for, with what is wrong under "malformed" (the engine's own reasons kept, first)."""
    positions = length - 1
    malformed = dict(answer.get("malformed") or {})
    checked: dict[str, Any] = {key: value for key, value in answer.items() if key != "malformed"}
    logprobs = _floats(answer.get("logprobs"))
    if len(logprobs) != positions:
        _merge(malformed, "logprobs", [f"{len(logprobs)} logprobs for a {length}-token prompt ({positions} "
                                       "positions)"])
        logprobs = (logprobs + [NAN] * positions)[:positions]
    if "logprobs" not in malformed:  # else the engine's reader counted them (its NaN marks rows it could not read)
        _merge(malformed, "logprobs", _non_finite(logprobs, positions, "logprobs"))
    checked["logprobs"] = logprobs
    if topk:
        checked["topk"] = _topk(answer.get("topk"), positions, topk, malformed)
    if greedy:
        tokens = list(answer.get("greedy") or [])
        bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or t < 0]
        if len(tokens) != greedy or bad:
            _merge(malformed, "greedy", [f"{len(tokens)} generated tokens of the {greedy} asked for"]
                   if len(tokens) != greedy else [f"{len(bad)} of {greedy} generated tokens are no token id"])
        tokens = [t if isinstance(t, int) and not isinstance(t, bool) and t >= 0 else -1 for t in tokens]
        checked["greedy"] = (tokens + [-1] * greedy)[:greedy]
        values = _floats(answer.get("greedy_logprobs"))
        if len(values) != greedy:
            _merge(malformed, "greedy_logprobs", [f"{len(values)} generated-token logprobs for {greedy} tokens"])
            values = (values + [NAN] * greedy)[:greedy]
        if "greedy_logprobs" not in malformed:
            _merge(malformed, "greedy_logprobs", _non_finite(values, greedy, "generated-token logprobs"))
        checked["greedy_logprobs"] = values
    if malformed:
        checked["malformed"] = malformed
    return checked


def _topk(rows: Any, positions: int, k: int, malformed: dict[str, str]) -> list:
    """Top-k rows of exactly k (id, logprob) pairs; a missing or short row padded with (-1, -inf), which matches
    nothing (oneknob.verdict.oracles). Rows as engines answer them (k pairs each) are checked in one pass."""
    rows = rows if rows is not None else []
    if len(rows) == positions and all(len(row) >= k for row in rows):
        try:
            table = np.asarray([row[:k] for row in rows], dtype=np.float64).reshape(positions, k, 2)
        except (TypeError, ValueError):
            table = None
        if table is not None and np.isfinite(table).all():
            return rows if all(len(row) == k for row in rows) else [row[:k] for row in rows]
    said = []
    if len(rows) != positions:
        said.append(f"{len(rows)} top-k rows for {positions} positions")
    fixed, short, bad = [], 0, 0
    for row in (list(rows) + [[]] * positions)[:positions]:
        pairs = []
        for pair in list(row)[:k]:
            try:
                token, value = int(pair[0]), _float(pair[1])
            except (TypeError, ValueError, IndexError, OverflowError):
                bad += 1
                continue
            if not math.isfinite(value):
                bad += 1
                continue
            pairs.append((token, value))
        short += len(pairs) < k
        fixed.append(pairs + [(-1, -math.inf)] * (k - len(pairs)))
    if short and "rows are missing" not in (malformed.get("topk") or ""):
        said.append(_count(short, positions, f"top-k rows hold fewer than {k} readable tokens"))
    if bad:
        said.append(f"{bad} top-k entries are NaN, infinite or unreadable")
    _merge(malformed, "topk", said)
    return fixed


def reason_text(malformed: dict[str, str]) -> str:
    """One line: "malformed: logprobs: 128 of 255 rows lack the prompt's token; topk: ..."."""
    return "malformed: " + "; ".join(f"{field}: {reason}" for field, reason in malformed.items())
