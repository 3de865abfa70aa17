"""Fixtures shared by the CLI tests; the helpers themselves live in tests/helpers.py."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # `import helpers` from any test module


def pytest_configure(config):
    """`make test` keeps the tests that share a module fixture on one worker (xdist_group, --dist loadgroup).
    pytest-xdist 3.8 tags them by renaming item._nodeid, which pytest 9.2 no longer reads: there each worker would
    start those engines again. Stop, saying so, rather than run twice as long."""
    version = tuple(map(int, pytest.__version__.split(".")[:2]))
    if getattr(config.option, "dist", None) == "loadgroup" and version >= (9, 2):
        raise pytest.UsageError(f"--dist loadgroup cannot group tests under pytest {pytest.__version__} (pytest-xdist "
                                "tags them through item._nodeid, which pytest >= 9.2 ignores); install what "
                                "pyproject.toml's dev extra pins: make setup")


@pytest.fixture(scope="session", autouse=True)
def mlflow_empty_template(tmp_path_factory):
    """A fresh machine has no empty MLflow store yet (oneknob.record.empty_store), so its first one-job run opens
    MLflow in the command instead of trailing (oneknob.record.trail) and keeps one. The suite makes it once, as
    that first run would, so every test meets what a user meets from the second run on, whichever runs first
    (tests/test_trail.py checks the first run with a cache of its own)."""
    from oneknob.record import empty_store

    if not empty_store.template().is_file():
        from oneknob.record.tracking import Tracker

        Tracker(f"sqlite:///{tmp_path_factory.mktemp('empty-store')}/mlflow.db", "template")
