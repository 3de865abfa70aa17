"""Fingerprints and versions, read by the orchestrator without importing an engine.

These make the keys of the point cache and of stored references: a result is
reused only for the same engine versions, hardware, model and corpus.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path


def version(*dists: str) -> str | None:
    """The installed version of the first of these distributions found."""
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


@cache
def gpu() -> dict[str, str]:
    """GPU name, driver and CUDA version from nvidia-smi, or {} on a machine without one."""
    if not shutil.which("nvidia-smi"):
        return {}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    if not out:
        return {}
    name, driver = (part.strip() for part in out[0].split(",", 1))
    return {"gpu": name, "gpu_count": str(len(out)), "driver": driver}


@cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict[str, str]:
    return gpu() or {"cpu": cpu_model(), "machine": platform.machine()}


def model_fingerprint(path: str) -> str:
    """config.json hash plus weight file names and sizes; the id itself for a hub model."""
    root = Path(path)
    if not root.is_dir():
        return "hub:" + path
    digest = hashlib.sha256()
    config = root / "config.json"
    if config.exists():
        digest.update(config.read_bytes())
    for weight in sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin")):
        digest.update(f"{weight.name}:{weight.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def model_config(path: str) -> dict | None:
    config = Path(path) / "config.json"
    return json.loads(config.read_text()) if config.is_file() else None
