"""The MLflow tags every oneknob run carries besides its own: where the code came from, what the user
wrote on the command line (`tags=[bisect-53488]`), and what its params imply, so the MLflow UI can
filter on them.

    git()                    the source (run.py) and {"mlflow.source.git.commit": "<sha>"} (+ oneknob.git_dirty)
    user_tags(["bisect-53488", "owner:alice"])   {"bisect-53488": "", "owner": "alice", "oneknob.tags": ...}
    from_params(params)      {"oneknob.emulated": "true"} for a run on emulated CUDA graphs
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oneknob.config.tracking import USER_TAGS, user_tags  # noqa: F401 (the user's tags, checked with the config)

GIT_COMMIT = "mlflow.source.git.commit"
GIT_DIRTY = "oneknob.git_dirty"
EMULATED = "oneknob.emulated"
EMULATED_TEXT = "emulated CUDA graphs (CPU)"  # the one label of such a result, everywhere
CHECKOUT = Path(__file__).resolve().parents[3]  # oneknob's repository (config.REPO_ROOT, without Hydra)


@functools.cache
def git() -> dict[str, str]:
    """The entry point, the commit of oneknob's own checkout and whether it has uncommitted changes (no commit
    outside a checkout)."""
    def run(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    source = {"mlflow.source.name": "run.py", "mlflow.source.type": "LOCAL"}  # the UI's Source column
    commit = run("rev-parse", "HEAD")
    if not commit:
        return source
    dirty = run("status", "--porcelain", "--untracked-files=no")
    return source | {GIT_COMMIT: commit} | ({GIT_DIRTY: "true"} if dirty else {})


def from_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Tags that follow from a run's params: oneknob.emulated for a run whose CUDA graphs were emulated on the
    CPU build (never a GPU result)."""
    emulated = params.get("resolved.cudagraph_emulated")
    return {EMULATED: "true"} if emulated is True or str(emulated).lower() == "true" else {}
