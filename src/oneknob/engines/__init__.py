"""The engines: what each is to the planner (Facts, cheap, no engine import) and inside its worker (Engine);
vLLM's plugin, which runs in vLLM's own processes. base.py names engines by module path, never imports them.
May import: provision, config and the leaves.
"""
