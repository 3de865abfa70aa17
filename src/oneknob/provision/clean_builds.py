"""`make clean-builds`: remove the vLLM builds oneknob created that were not used for N days.

    python -m oneknob clean-builds [--days 14] [--cache DIR] [--dry-run]

DIR is where the builds live: paths.builds, i.e. $ONEKNOB_BUILDS when set, else paths.cache (.cache/oneknob).

Only directories oneknob made are candidates: <cache>/builds/<key>/ (vllm.version environments),
<cache>/patched/<name>/ (vllm.patch copies) and <cache>/commits/<release>-<hash>/ (vllm.commit overlays),
each recognised by the marker file oneknob writes last (oneknob-build.json). A build's age is the time since
its marker was written or the build was last used (oneknob touches <name>.used beside it on every use),
whichever is later; the build's own directory is never written to after it is made.
Nothing else under the cache, and nothing outside it, is deleted: a kind folder or a build that is a symbolic
link is never followed (it is skipped, said), and a build whose real place is not inside the cache is skipped.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from pathlib import Path

MARK = "oneknob-build.json"
USED = ".used"  # <build>.used beside each build, touched on every use (the marker says the build is complete)
KINDS = ("builds", "patched", "commits")


def stale(cache_dir: Path, days: float, now: float | None = None, say=None) -> list[Path]:
    """The builds under `cache_dir` unused for more than `days`; `say(line)` hears what is skipped, and why."""
    now = time.time() if now is None else now
    root = Path(cache_dir).resolve()  # the folder the user named, wherever it is
    found = []
    for kind in KINDS:
        folder = root / kind
        if folder.is_symlink():  # its builds live elsewhere: never deleted through the link
            if say:
                say(f"skipping {folder}: a symbolic link (to {os.path.realpath(folder)}); oneknob deletes nothing "
                    "outside its own folders")
            continue
        for build in sorted(folder.glob("*")):
            marker, used = build / MARK, _used(build)
            if not build.is_dir() or build.is_symlink() or not marker.is_file():
                continue
            if Path(os.path.realpath(build)).parent != folder:  # a link further up, made after the check above
                continue
            last = max(marker.stat().st_mtime, used.stat().st_mtime if used.is_file() else 0)
            if now - last > days * 86400:
                found.append(build)
    return found


def _used(build: Path) -> Path:
    return build.with_name(build.name + USED)


def touch(build: Path) -> None:
    """Mark a build used now (its age restarts)."""
    try:
        _used(Path(build)).touch()
    except OSError:
        pass


def _days(text: str) -> float:
    """--days: a finite number >= 0 (nan compares false with every age, inf would keep everything, unsaid)."""
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not math.isfinite(days) or days < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number of days >= 0, e.g. --days 14")
    return days


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oneknob clean-builds",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=_days, default=14.0, help="remove builds unused for more than this (14)")
    parser.add_argument("--cache", default=os.environ.get("ONEKNOB_BUILDS") or ".cache/oneknob",
                        help="where the builds live (paths.builds: $ONEKNOB_BUILDS, else .cache/oneknob)")
    parser.add_argument("--dry-run", action="store_true", help="list them only")
    args = parser.parse_args(argv)
    found = stale(Path(args.cache), args.days, say=print)
    for build in found:
        print(f"{'would remove' if args.dry_run else 'removing'} {build}")
        if not args.dry_run:
            shutil.rmtree(build)
            _used(build).unlink(missing_ok=True)
    print(f"{len(found)} build(s) of oneknob unused for more than {args.days:g} day(s) under {args.cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
