"""Stage 1, config: what a user can set (the structured schema, the knob registry, --help) and what vLLM
resolves from it (the resolution rules, the engine quantities they name).
May import: oneknob.errors and oneknob.console only.
"""
