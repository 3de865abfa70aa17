"""Stage 3, plan: the only reader of the composed config. Every check a user can fail, the single-variable
rules, and one JobPlan per job (engine facts asked through engines.base.facts).
May import: engines, provision, config and the leaves.
"""
