"""The MLflow tags every oneknob run carries besides its own: where the code came from, what the user
wrote on the command line (`tags=[bisect-53488]`), and what its params imply, so the MLflow UI can
filter on them.

    git()                    the source (run.py) and {"mlflow.source.git.commit": "<sha>"} (+ oneknob.git_dirty)
    user_tags(["bisect-53488", "owner:alice"])   {"bisect-53488": "", "owner": "alice", "oneknob.tags": ...}
    from_params(params)      {"oneknob.emulated": "true"} for a run on emulated CUDA graphs
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from oneknob.errors import Refused

GIT_COMMIT = "mlflow.source.git.commit"
GIT_DIRTY = "oneknob.git_dirty"
USER_TAGS = "oneknob.tags"  # the user's tags as written, a JSON list (compare reads it back)
EMULATED = "oneknob.emulated"
EMULATED_TEXT = "emulated CUDA graphs (CPU)"  # the one label of such a result, everywhere
RESERVED = ("mlflow.", "oneknob.")
_KEY = re.compile(r"^[\w\-./ ]{1,250}$")
CHECKOUT = Path(__file__).resolve().parents[2]  # oneknob's repository (config.REPO_ROOT, without Hydra)


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


def user_tags(values: Iterable[str] | None) -> dict[str, str]:
    """The config's `tags` list as MLflow tags: a word is a tag with an empty value, `key:value` or
    `key=value` a tag with that value (Hydra's command line takes `:` unquoted, `=` only in quotes); the
    list itself is kept as written under oneknob.tags."""
    values = [str(v) for v in values or []]
    found: dict[str, str] = {}
    for text in values:
        pair = re.match(r"([^:=]*)[:=](.*)", text, re.S)  # split at the first ':' or '='
        key, value = (pair[1].strip(), pair[2]) if pair else (text.strip(), "")
        if not _KEY.match(key):
            raise Refused(f"tags=[{text}]: an MLflow tag name is 1 to 250 letters, digits, '_', '-', '.', '/' or "
                          "spaces; e.g. tags=[bisect-53488] or tags=[owner:alice]")
        if key.startswith(RESERVED):
            raise Refused(f"tags=[{text}]: names starting with {' or '.join(RESERVED)} are oneknob's and MLflow's "
                          "own; pick another name, e.g. tags=[bisect-53488]")
        found[key] = value.strip()
    return found | ({USER_TAGS: json.dumps(values)} if values else {})


def from_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Tags that follow from a run's params: oneknob.emulated for a run whose CUDA graphs were emulated on the
    CPU build (never a GPU result)."""
    emulated = params.get("resolved.cudagraph_emulated")
    return {EMULATED: "true"} if emulated is True or str(emulated).lower() == "true" else {}
