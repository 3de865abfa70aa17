"""Where results go and how runs are tagged, as the config says it: `tracking.uri` (checked before any engine
starts) and the user's `tags` (MLflow tag names a user may take). The store itself is oneknob.record.tracking.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from oneknob import files
from oneknob.config.secrets import MASK, secret_name
from oneknob.errors import Refused

USER_TAGS = "oneknob.tags"  # the user's tags as written, a JSON list (compare reads it back)
RESERVED = ("mlflow.", "oneknob.")
_KEY = re.compile(r"^[\w\-./ ]{1,250}$")
_URI = re.compile(r"^(sqlite:///.+|https?://[^/\s]+.*|postgresql(\+\w+)?://.+|mysql(\+\w+)?://.+)$")


class TrackingError(Refused):
    pass


TAG_VALUE_CHARS = 8000  # what MLflow stores of a tag's value (mlflow.utils.validation.MAX_TAG_VAL_LENGTH)


def _shown(text: str, limit: int = 80) -> str:
    """A value the user wrote as a message quotes it: the start of a long one, and how long it is."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def default_uri(mlruns: str | Path = "mlruns") -> str:
    """$MLFLOW_TRACKING_URI, else the local SQLite store under `mlruns` (the one default, everywhere)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(mlruns).resolve()}/mlflow.db"


def resolve_uri(configured: str | None, mlruns: str | Path) -> str:
    """tracking.uri, else the default; checked before any engine starts."""
    uri = configured or default_uri(mlruns)
    # the key a user set: tracking.uri, or (tracking.uri null) the environment variable
    key, unset = (("tracking.uri", "") if configured or not os.environ.get("MLFLOW_TRACKING_URI") else
                  ("MLFLOW_TRACKING_URI", " (tracking.uri is null, so the environment variable decides: fix or "
                                          "unset it, or set tracking.uri)"))
    if password := re.match(r"[a-z][a-z0-9+.-]*://[^/@\s]*?:([^/@\s]+)@", uri, re.I):
        # the URI is written into plan.json, the journal, retry and compare lines and MLflow tags: never a secret
        shown = uri[:password.start(1)] + MASK + uri[password.end(1):]
        raise TrackingError(f"{key}={shown}{unset}: the URI holds a password, which oneknob would write and print "
                            "wherever it names the store; give the URI without it and the credentials as "
                            "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD in the environment")
    if uri.startswith("file:") or "://" not in uri and Path(uri).name == "mlruns":
        raise TrackingError(f"{key}={uri}{unset}: MLflow refuses the plain file store (since 3.13); use "
                            "sqlite:///<absolute path>/mlflow.db (artifacts go beside it), or null for the local store")
    if not _URI.match(uri):
        raise TrackingError(
            f"{key}={uri}{unset}: not a tracking URI oneknob can use; give "
            "sqlite:///<absolute path>/mlflow.db, http://host:port, or null for the local store")
    if uri.startswith("sqlite:///") and Path(uri[len("sqlite:///"):]).is_dir():  # MLflow retries it for minutes
        raise TrackingError(f"{key}={uri}{unset}: that path is a directory, not an SQLite file; give a file in it, "
                            f"e.g. {uri.rstrip('/')}/mlflow.db")
    if configured or os.environ.get("MLFLOW_TRACKING_URI"):
        return uri
    mlruns = Path(mlruns).resolve()
    try:
        files.ensure_writable_dir(mlruns)
    except OSError as exc:
        raise TrackingError(f"paths.mlruns={mlruns}: cannot write there ({exc.strerror}); make it writable "
                            "or set paths.mlruns / tracking.uri elsewhere") from None
    return uri



def user_tags(values: Iterable[str] | None) -> dict[str, str]:
    """The config's `tags` list as MLflow tags: a word is a tag with an empty value, `key:value` or
    `key=value` a tag with that value (Hydra's command line takes `:` unquoted, `=` only in quotes); the
    list itself is kept as written under oneknob.record.tags."""
    values = [str(v) for v in values or []]
    found: dict[str, str] = {}
    for text in values:
        pair = re.match(r"([^:=]*)[:=](.*)", text, re.S)  # split at the first ':' or '='
        key, value = (pair[1].strip(), pair[2]) if pair else (text.strip(), "")
        shown = _shown(text)
        if not _KEY.match(key):
            raise Refused(f"tags=[{shown}]: an MLflow tag name is 1 to 250 letters, digits, '_', '-', '.', '/' or "
                          "spaces; e.g. tags=[bisect-53488] or tags=[owner:alice]")
        if key.startswith(RESERVED):
            raise Refused(f"tags=[{shown}]: names starting with {' or '.join(RESERVED)} are oneknob's and MLflow's "
                          "own; pick another name, e.g. tags=[bisect-53488]")
        if len(value.strip()) > TAG_VALUE_CHARS:
            raise Refused(f"tags=[{shown}]: a tag's value is at most {TAG_VALUE_CHARS} characters in MLflow, this "
                          f"one has {len(value.strip())}; shorten it (a file's contents belong in an artifact)")
        if secret_name(key.replace(" ", "_")):
            raise Refused(f"tags=[{key}:{MASK}]: named like a credential, and every tag is stored and shown in "
                          "MLflow and the report; oneknob takes no secret: name it otherwise, or leave it out")
        found[key] = value.strip()
    return found | ({USER_TAGS: json.dumps(values)} if values else {})
