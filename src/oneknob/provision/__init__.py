"""Stage 2, provision: what a plan needs on disk before any engine: corpora and their prompts, fingerprints
and versions, the environment of each vLLM build, the tiny model oneknob builds itself.
May import: config and the leaves (errors, console, files).
"""
