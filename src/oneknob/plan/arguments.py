"""The command line's arguments: as Hydra must read them, as a user types them, and a sweep's values.

`force_add_families` writes engine_args.X=V / env.VLLM_X=V (and a free-form setting's mapping) as `++` for
Hydra, bisect=true as bisect.enabled=true; `as_typed` undoes it for every command oneknob prints (retry,
report.md's reproduce line, refusals' suggestions), so they run as printed. `values_of` reads a sweep's values
as typed, a range lazily (RangeValues): range(1,100000000) is three numbers until the search asks for one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, RangeSweep

from oneknob.config import knobs
from oneknob.errors import ConfigError


def parse(overrides: list[str]) -> list[Override]:
    return OverridesParser.create().parse_overrides(overrides=list(overrides))


# Settings that are free-form mappings, empty by default: a value given to one adds keys, which Hydra's struct
# mode refuses unless written ++ (the synthetic engine's simulated config.json, README "The synthetic engine")
FREE_MAPPINGS = ("engine.fault.model_config",)


def force_add_families(arguments: list[str]) -> list[str]:
    """engine_args.X=V / env.VLLM_X=V as Hydra must read them: `++` (they add keys to an empty mapping, which
    the structured config's struct mode refuses otherwise); bisect=true|false as bisect.enabled=... (a key
    cannot be both a switch and the group holding bisect.criterion). Other arguments are kept as written."""
    out = []
    for argument in arguments:
        if argument.replace(" ", "").lower() in ("bisect=true", "bisect=false"):
            out.append("bisect.enabled=" + argument.split("=", 1)[1].strip().lower())
            continue
        try:
            (override,) = parse([argument])
        except Exception:  # Hydra reports its own parse errors
            out.append(argument)
            continue
        family = (knobs.is_family(override.key_or_group) or override.key_or_group in FREE_MAPPINGS) \
            and override.type is OverrideType.CHANGE
        out.append(f"++{argument}" if family and not override.package else argument)
    return out


def as_typed(arguments: list[str]) -> list[str]:
    """force_add_families undone: the arguments as a user writes them (engine_args.X=V, not ++engine_args.X=V,
    which the guard refuses), for the commands oneknob prints (retry, report.md's reproduce line)."""
    out = []
    for argument in arguments:
        if argument.startswith("bisect.enabled="):  # bisect=true as typed
            out.append("bisect=" + argument.split("=", 1)[1])
            continue
        try:
            (override,) = parse([argument])
        except Exception:
            out.append(argument)
            continue
        family = (knobs.is_family(override.key_or_group) or override.key_or_group in FREE_MAPPINGS) \
            and override.type is OverrideType.FORCE_ADD
        out.append(argument[2:] if family and argument.startswith("++") else argument)
    return out


# The most jobs one sweep plans (every job is planned and checked before the first starts, and each starts an
# engine: 30-60 s apiece with vLLM here). A longer axis is searched, not swept: bisect=true plans two jobs.
MAX_SWEEP_JOBS = 1000


class RangeValues(Sequence):
    """A range(...) sweep's values as typed, computed when asked: range(1,100000000) holds three numbers."""

    def __init__(self, numbers: range):
        self.numbers = numbers

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [str(n) for n in self.numbers[index]]
        return str(self.numbers[index])


def said(values) -> str:
    """A sweep's values in a message: all of them when few, else the ends and the count."""
    return ",".join(values) if len(values) <= 8 else f"{values[0]},{values[1]},...,{values[-1]} ({len(values)} values)"


def values_of(override: Override) -> Sequence[str]:
    if not override.is_sweep_override():
        return [override.get_value_element_as_str()]
    value = override.value()
    ranges = [value] if isinstance(value, RangeSweep) else [v for v in getattr(value, "list", [])
                                                             if isinstance(v, RangeSweep)]
    for sweep in ranges:
        if sweep.step == 0 or any(isinstance(x, float) and not math.isfinite(x)
                                  for x in (sweep.start, sweep.stop, sweep.step)):
            raise ConfigError(f"{override.input_line}: a range needs a finite, non-zero step (a step of 0 never "
                             f"ends); e.g. {override.key_or_group}=range(1,10) or range(1,10,2)")
        count = math.ceil((sweep.stop - sweep.start) / sweep.step)
        if count > MAX_SWEEP_JOBS and not (len(ranges) == 1 and value is sweep and not sweep.shuffle
                                           and all(isinstance(x, int) for x in (sweep.start, sweep.stop, sweep.step))):
            raise ConfigError(f"{override.input_line}: {count} values, more than a sweep plans "
                             f"({MAX_SWEEP_JOBS}); give a plain integer range to bisect it (bisect=true), or fewer "
                             "values")
    if isinstance(value, RangeSweep) and not value.shuffle and all(
            isinstance(x, int) for x in (value.start, value.stop, value.step)):
        return RangeValues(range(value.start, value.stop, value.step))  # planned lazily: never materialised
    return [str(v) for v in override.sweep_string_iterator()]
