"""The single-variable guard over requested values (command-line overrides).

A sweep varies at most one knob. Knob overrides with one value set the
sweep's baseline; a knob override with several values (`a,b`, `range(...)`)
is the varied knob. Hydra accepts `+key`, `++key` and `~key` silently even on
typed keys, so they are refused here on knob keys. Runs before any engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType

from oneknob.knobs import KNOBS


class GuardError(ValueError):
    pass


@dataclass(frozen=True)
class SweepShape:
    varied: dict[str, list[str]] = field(default_factory=dict)  # knob key -> its values as typed
    baseline: dict[str, str] = field(default_factory=dict)  # knob key -> the one value given

    @property
    def knob(self) -> str | None:
        return next(iter(self.varied), None)


def _values(override: Override) -> list[str]:
    if override.is_sweep_override():
        return [str(v) for v in override.sweep_string_iterator()]
    return [override.get_value_element_as_str()]


def parse(overrides: list[str]) -> list[Override]:
    return OverridesParser.create().parse_overrides(overrides=list(overrides))


def _refuse_prefixes(parsed: list[Override]) -> None:
    for override in parsed:
        if override.key_or_group in KNOBS and override.type is not OverrideType.CHANGE:
            sign = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++", OverrideType.DEL: "~"}[override.type]
            raise GuardError(
                f"{override.input_line}: '{sign}' on the knob {override.key_or_group} is refused: knobs "
                f"always exist, so write {override.key_or_group}=VALUE (Hydra would otherwise add or "
                "delete the key silently)")


def check_single(overrides: list[str]) -> None:
    """A single run may set any knob values, but never with +, ++ or ~."""
    _refuse_prefixes(parse(overrides))


def check_sweep(overrides: list[str]) -> SweepShape:
    parsed = parse(overrides)
    _refuse_prefixes(parsed)
    varied, baseline = {}, {}
    for override in parsed:
        key = override.key_or_group
        if key not in KNOBS:
            continue  # non-knob overrides are free
        values = _values(override)
        if len(values) > 1:
            varied[key] = values
        else:
            baseline[key] = values[0]
    if len(varied) > 1:
        listed = "; ".join(f"{key} over {','.join(values)}" for key, values in varied.items())
        raise GuardError(
            f"this sweep varies {len(varied)} knobs ({listed}), so no result could be pinned on one of "
            "them. Vary one knob per sweep, or put them in an ablation block and run the "
            "one-knob-at-a-time sweeper: python run.py -m hydra/sweeper=ablation "
            + " ".join(f"'+ablation.{key}=[{','.join(values)}]'" for key, values in varied.items()))
    return SweepShape(varied, baseline)
