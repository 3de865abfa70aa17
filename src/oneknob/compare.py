"""Cross-run comparison (placeholder until the report lands)."""


def after_sweep(**kwargs) -> None:
    pass
