"""Fingerprints and versions, read by the orchestrator without importing an engine.

These make the keys of the point cache and of stored references: a result is
reused only for the same engine versions, hardware, model and corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
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


def _visible_index(rows: list[list[str]]) -> int:
    """The row of the GPU vLLM will use: the first of CUDA_VISIBLE_DEVICES (an index or a UUID), else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.isdigit() and int(first) < len(rows):
        return int(first)
    return next((i for i, row in enumerate(rows) if first and row[4].startswith(first)), 0)


@cache
def gpu() -> dict[str, str]:
    """The GPU this process's CUDA_VISIBLE_DEVICES selects (name, driver, memory, compute capability), from
    nvidia-smi, or {} on a machine without one."""
    if not shutil.which("nvidia-smi"):
        return {}
    query = "name,driver_version,memory.total,compute_cap,uuid"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [[part.strip() for part in line.split(",")] for line in out if line.count(",") >= 4]
    if not rows:
        return {}
    name, driver, memory_mib, capability, _ = rows[_visible_index(rows)]
    memory_gib = f"{int(memory_mib) / 1024:.0f}" if memory_mib.isdigit() else "0"  # [N/A] on unified memory
    return {"gpu": name, "gpu_count": str(len(rows)), "driver": driver, "memory_gib": memory_gib,
            "compute_capability": capability}


def local_device():
    """This machine's device as the resolution rules see it."""
    from oneknob.config.resolution import Device

    found = gpu()
    if not found:
        return Device("cpu", "cpu")
    major, _, minor = found["compute_capability"].partition(".")
    capability = (int(major), int(minor or 0)) if major.isdigit() else None
    return Device(found["gpu"], "cuda", capability, float(found["memory_gib"]))


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


def model_fingerprint(path: str, overrides: dict | None = None) -> str:
    """config.json hash plus weight file names and sizes; the id itself for a hub model. With config.json fields
    overridden (model.override.<path>), their values too: another config is another model."""
    root = Path(path)
    if overrides:
        from oneknob.config.model_override import digest

        return f"{model_fingerprint(path)}+{digest(overrides)}"
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
