"""Fixtures shared by the CLI tests; the helpers themselves live in tests/helpers.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # `import helpers` from any test module
