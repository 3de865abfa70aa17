"""The wiring: one job top to bottom (decide, measure, judge, record), its reference, how it ends, and a
sweep's lifecycle (baseline, variants, comparison). Calls every stage; no stage calls it.
May import: every stage; never oneknob.cli.
"""
