"""One precision per quantity, wherever a report or the terminal shows it: a mean NLL to 3 decimals (nats), a
relative change as a percentage to 2 significant figures ("+270 %", "-0.015 %")."""

from __future__ import annotations

import math


def nll(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def percent(fraction: float | None, sign: bool = True) -> str:
    """A fraction (0.0123) as a percentage to 2 significant figures, never in exponent form: "+1.2 %"."""
    if fraction is None or math.isnan(fraction):
        return "n/a"
    value = 100 * fraction
    if value == 0 or math.isinf(value):
        return f"{'+' if sign and value >= 0 else ''}{value:g} %"
    rounded = float(f"{value:.2g}")
    digits = 1 - math.floor(math.log10(abs(rounded)))
    text = f"{rounded:.{max(digits, 0)}f}"
    return f"{'+' if sign and rounded >= 0 else ''}{text} %"
