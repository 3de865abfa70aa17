"""A new environment's bytecode from the running one's, for the files both share (provision/builds.py).

uv writes no bytecode by itself, and where PYTHONDONTWRITEBYTECODE is set Python never does either. uv links a
package's files from its cache, so most of a new environment's files (torch, transformers, ...) are the very files
of the running interpreter's environment, whose pyc are then valid as they are: a timestamp pyc records its
source's size and mtime, which the same file shares.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import sysconfig
from pathlib import Path


def running_site() -> list[Path]:
    """The running interpreter's site-packages (purelib and platlib, once each)."""
    paths = sysconfig.get_paths()
    return [Path(p) for p in dict.fromkeys((paths["purelib"], paths["platlib"]))]


def reuse(site: Path, donors: list[Path]) -> int:
    """Link each donor's __pycache__/*.pyc into `site` where `site` holds the same source file at the same relative
    path: the same inode (uv's hardlink from its cache) or the same bytes, and the same size and mtime (what a
    timestamp pyc records, so Python and compileall accept it as is). Returns how many."""
    reused = 0
    for donor in donors:
        if not donor.is_dir() or donor.resolve() == site.resolve():
            continue
        for cache in donor.rglob("__pycache__"):
            rel = cache.parent.relative_to(donor)
            for pyc in cache.glob("*.pyc"):
                module = pyc.name.split(".", 1)[0]  # name.cpython-311[.opt-1].pyc
                source, mine = donor / rel / f"{module}.py", site / rel / f"{module}.py"
                try:
                    theirs, ours = source.stat(), mine.stat()
                except OSError:
                    continue
                if (theirs.st_size, int(theirs.st_mtime)) != (ours.st_size, int(ours.st_mtime)):
                    continue
                if not os.path.samestat(theirs, ours) and not filecmp.cmp(source, mine, shallow=False):
                    continue  # another file that happens to share size and mtime: compiled, not trusted
                target = site / rel / "__pycache__" / pyc.name
                if target.exists():
                    continue
                target.parent.mkdir(exist_ok=True)
                try:
                    os.link(pyc, target)
                except OSError:
                    shutil.copy2(pyc, target)
                reused += 1
    return reused
