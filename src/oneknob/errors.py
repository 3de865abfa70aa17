"""Bad input: refused before any engine starts, with exit code 2 and nothing recorded.

Every refusal raises a subclass of `Refused` whose message names the key, the
value and the fix; `cli.refusals()` turns any of them into the one refusal
path shared by single runs and sweeps.
"""


class Refused(ValueError):
    """Refused before anything starts."""


class ConfigError(Refused):
    """A setting that cannot work (lengths, samples, model, corpus, tolerances, ...)."""


class UnavailableHere(ConfigError):
    """Valid knob values that this machine's engine build cannot run (a sweep skips such variants)."""
