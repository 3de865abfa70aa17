"""The engines: what each is to the planner (Facts, cheap, no engine import) and inside its worker (Engine).
vLLM's are the subpackage vllm/, whose docstring says which interpreter each of its modules runs in. base.py
names engines by module path, never imports them. May import: provision, config and the leaves.
"""
