"""Stage 5, verdict: points judged against the reference (NLL and the other oracles), the search that says
which points it still needs, and what one job found (transitions, disagreeing samples).
May import: config and the leaves (pure functions over numbers: no engine, no store).
"""
