"""Stage 4, run: the worker process that holds one engine, and the executor that starts, drives and reaps it.
Measures and returns raw per-token logprobs; judges nothing.
May import: plan, engines, provision, config and the leaves.
"""
