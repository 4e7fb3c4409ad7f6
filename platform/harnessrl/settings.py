"""Where things live by default: the embedded, single-machine setup (DESIGN §2).

Everything is overridable by environment: HARNESSRL_HOME for the local state folder,
MLFLOW_TRACKING_URI for a tracking server, RAY_ADDRESS for a cluster.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

OFFLINE_ENV = {
    # Nothing may download weights or data at run time, and nothing phones home.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def apply_offline_env() -> None:
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def home() -> Path:
    """The local state folder (`.harnessrl/` in the working directory unless HARNESSRL_HOME)."""
    return Path(os.environ.get("HARNESSRL_HOME", ".harnessrl")).expanduser().resolve()


def tracking_uri() -> str:
    """MLflow tracking URI: MLFLOW_TRACKING_URI, else a SQLite store under home()."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    path = home() / "mlflow.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


_SECRET_QUERY = re.compile(r"(?i)([?&][^=&]*(?:password|passwd|pwd|token|secret|key|sig|credential)[^=&]*=)[^&]*")


def redact(uri: str) -> str:
    """`uri` fit to print or log: its userinfo (`user:password@`) and the values of query
    parameters that look like secrets (`?password=...`, `&token=...`) replaced by `***`."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = _SECRET_QUERY.sub(r"\1***", "?" + parts.query)[1:] if parts.query else parts.query
    if (netloc, query) == (parts.netloc, parts.query):
        return uri
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def protect_tracking_uri() -> None:
    """MLflow prints "View run ... at: <tracking URI>/#/..." when a run ends: not when the URI
    carries credentials (it would print them)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri and redact(uri) != uri:
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def artifact_root() -> str:
    """Where new experiments put artifacts when the tracking store is the local SQLite one."""
    return (home() / "artifacts").as_uri()


def runs_dir() -> Path:
    return home() / "runs"
