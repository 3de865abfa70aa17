"""What runs in a vLLM build's interpreter without oneknob: the standard library and vLLM only (import-linter's
contract in pyproject.toml). The scripts run with `python -P FILE` (oneknob.engines.vllm.validate,
oneknob.plan.from_command, oneknob.engines.vllm.release); oneknob's own modules import them too."""
