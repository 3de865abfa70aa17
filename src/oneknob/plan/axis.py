"""The ordered axis a job searches along: prompt length, batch neighbours, or the concurrency of repeats.

    axis=length   one prompt per request; the grid is `lengths`
    axis=batch    one probe prompt (`batch.probe_length` tokens) submitted in ONE engine call with neighbour
                  prompts, so that the engine schedules them in the same step; the grid is the number of
                  neighbours (`batch.neighbours`, each `batch.neighbour_length` tokens) or one neighbour's length
                  (`batch.neighbour_lengths`, 0: the probe alone). The probe is judged against the reference,
                  which scores the probe alone.
    axis=repeat   the same prompt `c` times in one engine call (c = `repeat.concurrency`, the grid), `repeat.n`
                  times; every output is judged against the first: identical, within tolerance, or differs.
                  No reference.

One search (oneknob.verdict.search) serves every axis: it sees integer positions. What differs is how one point
is measured (oneknob.study.points) and what a position means: `step_tokens(value)` is the tokens one step
schedules at a batch point (probe + neighbours), the unit the engine's thresholds (capture size, batched
tokens) are in; `value_at_step_tokens(q)` maps such a threshold back onto the axis (suspect probes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from oneknob.errors import ConfigError

AXES = ("length", "batch", "repeat")


@dataclass(frozen=True)
class Axis:
    name: str = "length"  # length | batch | repeat
    values: tuple[int, ...] = ()  # the grid along the axis (for length: the plan's lengths)
    varies: str = "length"  # length | neighbours | neighbour_length | concurrency
    probe_length: int | None = None  # batch: the probe; repeat: the repeated prompt's length
    neighbour_length: int | None = None  # batch, varies=neighbours: each neighbour's length
    repeats: int | None = None  # repeat: engine calls per point (repeat.n)

    @property
    def unit(self) -> str:
        """What one step along the axis counts, in words (report, MLflow)."""
        return {"length": "prompt tokens", "neighbours": "neighbours", "neighbour_length": "neighbour tokens",
                "concurrency": "concurrent requests"}[self.varies]

    @property
    def column(self) -> str:
        """The per-point table's first column."""
        return {"length": "prompt tokens", "neighbours": "neighbours (batch)",
                "neighbour_length": "neighbour tokens (batch)", "concurrency": "concurrency (repeat)"}[self.varies]

    def neighbours(self, value: int) -> list[int]:
        """The neighbours' lengths at one batch point."""
        if self.varies == "neighbours":
            return [self.neighbour_length] * value
        return [value] if value > 0 else []

    def step_tokens(self, value: int) -> int | None:
        """Tokens one step schedules at this point when the probe and its neighbours share it (batch only)."""
        if self.name != "batch":
            return value if self.name == "length" else None
        return self.probe_length + sum(self.neighbours(value))

    def value_at_step_tokens(self, tokens: int) -> int | None:
        """The axis value whose step holds exactly `tokens` tokens (None when no integer value does)."""
        if self.name == "length":
            return tokens
        if self.name != "batch" or tokens < self.probe_length:
            return None
        extra = tokens - self.probe_length
        if self.varies == "neighbour_length":
            return extra
        return extra // self.neighbour_length if extra % self.neighbour_length == 0 else None

    def key(self) -> dict[str, Any]:
        """What decides a point beside its value and sample (the point cache's key): {} for the length axis, so
        the length axis keeps the cache it had."""
        return {} if self.name == "length" else {k: v for k, v in asdict(self).items() if k != "values"}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"values": list(self.values), "unit": self.unit}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Axis:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**(fields | {"values": tuple(fields.get("values", ()))}))


# What a point of axis=batch or axis=repeat is judged on: the prompt logprobs of ONE engine step (the probe's
# among its neighbours; each repeat's against the first). The oracles that read those (and only those) can judge
# it; any other oracle, one that reads a continuation decoded in later steps (greedy, or any decode oracle to
# come), says nothing of that step and is refused rather than ignored.
STEP_ORACLES = ("nll", "topk")


def check_oracles(name: str, asked: list[str]) -> None:
    unjudged = [o for o in asked if o not in STEP_ORACLES]
    if unjudged:
        kept = [o for o in asked if o in STEP_ORACLES] or ["nll"]
        raise ConfigError(f"oracles=[{','.join(asked)}] with axis={name}: {', '.join(unjudged)} cannot judge a point "
                          f"of this axis (it is judged on one step's prompt logprobs"
                          + (", each repeat against the first" if name == "repeat" else ", the probe's") +
                          f"; a continuation decodes past that step); use oracles=[{','.join(kept)}] with axis={name}")


def _count(key: str, value: Any, fix: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value}: must be an integer >= {minimum}; {fix}")
    return value


def _grid(key: str, values: Any, fix: str, minimum: int = 0) -> tuple[int, ...]:
    values = list(values or [])
    if not values:
        raise ConfigError(f"{key}=[]: the axis needs at least one value; {fix}")
    for value in values:
        _count(key, value, fix, minimum)
    return tuple(sorted(set(values)))


def from_config(cfg, lengths: tuple[int, ...], sample_tokens: int) -> Axis:
    """The checked axis of a composed config; ConfigError names the key, the value and the fix."""
    name = cfg.axis
    if name not in AXES:
        raise ConfigError(f"axis={name}: unknown axis; use axis=length (one prompt per step, the default), "
                          "axis=batch (a probe among neighbours) or axis=repeat (repeats at a concurrency)")
    if name == "length":
        return Axis(values=tuple(lengths))
    check_oracles(name, list(cfg.oracles))
    if name == "batch":
        batch = cfg.batch
        if batch.probe_length is None:
            raise ConfigError("batch.probe_length=null: axis=batch needs the probe's prompt length in tokens; e.g. "
                              "batch.probe_length=200")
        probe = _count("batch.probe_length", batch.probe_length, "e.g. batch.probe_length=200", minimum=2)
        if (batch.neighbours is None) == (batch.neighbour_lengths is None):
            said = "both" if batch.neighbours is not None else "neither"
            raise ConfigError(f"batch.neighbours and batch.neighbour_lengths: {said} given; axis=batch varies one of "
                              "them: 'batch.neighbours=[0,1,2,4,8]' (how many neighbours of batch.neighbour_length "
                              "tokens) or 'batch.neighbour_lengths=[0,100,200]' (one neighbour's length); set the "
                              "other to null")
        if batch.neighbours is not None:
            length = _count("batch.neighbour_length", batch.neighbour_length, "e.g. batch.neighbour_length=64", 1)
            values = _grid("batch.neighbours", batch.neighbours, "e.g. 'batch.neighbours=[0,1,2,4,8]'")
            longest = length
            axis = Axis("batch", values, "neighbours", probe, neighbour_length=length)
        else:
            values = _grid("batch.neighbour_lengths", batch.neighbour_lengths,
                           "e.g. 'batch.neighbour_lengths=[0,100,200,300]'")
            longest = max(values)
            axis = Axis("batch", values, "neighbour_length", probe)
        for key, tokens in (("batch.probe_length", probe), ("the longest neighbour", longest)):
            if tokens > sample_tokens:
                raise ConfigError(f"{key}: {tokens} tokens, but corpus.sample_tokens={sample_tokens}; raise "
                                  f"corpus.sample_tokens to at least {tokens} or shorten the prompt")
        return axis
    repeat = cfg.repeat
    n = _count("repeat.n", repeat.n, "the first repeat is what the others are judged against: e.g. repeat.n=3", 2)
    values = _grid("repeat.concurrency", repeat.concurrency, "e.g. 'repeat.concurrency=[1,2,4,8]'", minimum=1)
    length = min(lengths) if repeat.length is None else _count("repeat.length", repeat.length,
                                                               "e.g. repeat.length=128", minimum=2)
    if length > sample_tokens:
        raise ConfigError(f"repeat.length={length}: longer than corpus.sample_tokens={sample_tokens}; raise "
                          "corpus.sample_tokens or shorten repeat.length")
    return Axis("repeat", values, "concurrency", length, repeats=n)


# What one point may keep in memory: a repeat point holds every output (n x concurrency prompts' logprobs) in the
# worker, the job and its cache record at once, ~64 bytes per logprob as Python floats and JSON text.
BYTES_PER_KEPT_LOGPROB = 64


def memory_bytes() -> int:
    """This machine's memory (the ceiling's base; a job's engine and worker share it)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def check_capacity(axis: Axis, max_num_seqs: int | None) -> None:
    """Ceilings an axis's grid must fit before anything starts (README "Axes"): the requests one batch or repeat
    point sends in ONE engine call share one step only up to the engine's sequence slots (max_num_seqs); a repeat
    point keeps all its outputs, at most a quarter of this machine's memory."""
    if axis.name == "length":
        return
    if max_num_seqs:
        largest = max(axis.values)
        if axis.name == "batch" and axis.varies == "neighbours" and largest + 1 > max_num_seqs:
            raise ConfigError(f"batch.neighbours: {largest} neighbours plus the probe is {largest + 1} requests, but "
                              f"the engine schedules at most max_num_seqs={max_num_seqs} in one step, so the rest "
                              f"would wait for a later step; give at most {max_num_seqs - 1} neighbours (or raise "
                              "sched.max_num_seqs)")
        if axis.name == "repeat" and largest > max_num_seqs:
            raise ConfigError(f"repeat.concurrency: {largest} concurrent requests, but the engine schedules at most "
                              f"max_num_seqs={max_num_seqs} in one step; give concurrencies of at most "
                              f"{max_num_seqs} (or raise sched.max_num_seqs)")
    if axis.name == "repeat":
        kept = axis.repeats * max(axis.values) * axis.probe_length
        ceiling = memory_bytes() // 4 // BYTES_PER_KEPT_LOGPROB
        if kept > ceiling:
            most = max(2, ceiling // (max(axis.values) * axis.probe_length))
            raise ConfigError(f"repeat.n={axis.repeats}: a point keeps every output, {axis.repeats} x "
                              f"{max(axis.values)} x {axis.probe_length} = {kept} logprobs, more than this machine "
                              f"holds for one point ({ceiling}: a quarter of its memory); give repeat.n={most} or "
                              "less, or lower the concurrency or repeat.length")
