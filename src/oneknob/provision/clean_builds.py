"""`make clean-builds`: remove the vLLM builds oneknob created that were not used for N days.

    python -m oneknob clean-builds [--days 14] [--cache DIR] [--dry-run]

DIR is where the builds live: paths.builds, i.e. $ONEKNOB_BUILDS when set, else paths.cache (.cache/oneknob).

Only directories oneknob made are candidates: <cache>/builds/<key>/ (vllm.version environments),
<cache>/patched/<name>/ (vllm.patch copies) and <cache>/commits/<release>-<hash>/ (vllm.commit overlays),
each recognised by the marker file oneknob writes last (oneknob-build.json). A build's age is the time since
its marker was written or the build was last used (oneknob touches <name>.used beside it on every use),
whichever is later; the build's own directory is never written to after it is made.
Nothing else under the cache, and nothing outside it, is deleted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

MARK = "oneknob-build.json"
USED = ".used"  # <build>.used beside each build, touched on every use (the marker says the build is complete)
KINDS = ("builds", "patched", "commits")


def stale(cache_dir: Path, days: float, now: float | None = None) -> list[Path]:
    now = time.time() if now is None else now
    found = []
    for kind in KINDS:
        for build in sorted((Path(cache_dir) / kind).glob("*")):
            marker, used = build / MARK, _used(build)
            if not build.is_dir() or build.is_symlink() or not marker.is_file():
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oneknob clean-builds",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=float, default=14.0, help="remove builds unused for more than this (14)")
    parser.add_argument("--cache", default=os.environ.get("ONEKNOB_BUILDS") or ".cache/oneknob",
                        help="where the builds live (paths.builds: $ONEKNOB_BUILDS, else .cache/oneknob)")
    parser.add_argument("--dry-run", action="store_true", help="list them only")
    args = parser.parse_args(argv)
    if args.days < 0:
        parser.error(f"--days {args.days}: give a number of days >= 0")
    found = stale(Path(args.cache), args.days)
    for build in found:
        print(f"{'would remove' if args.dry_run else 'removing'} {build}")
        if not args.dry_run:
            shutil.rmtree(build)
            _used(build).unlink(missing_ok=True)
    print(f"{len(found)} build(s) of oneknob unused for more than {args.days:g} day(s) under {args.cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
