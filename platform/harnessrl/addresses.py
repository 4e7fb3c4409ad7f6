"""`--address`: whatever a Ray user types, converted to what each command needs.

Ray has two kinds of cluster address: the dashboard's HTTP API (`http://HEAD:8265`: jobs,
`serve deploy`, the state API) and the GCS address a driver joins (`HEAD:6379`, `auto`, or a
Ray Client `ray://HEAD:10001`). Every harnessrl command takes either:

- commands that run a driver here (`run`, `train`, `ingest`, `evaluate`, `serve`, `serve stop`)
  join the GCS; given `http://HEAD:PORT`, they join `HEAD:6379` (Ray's default GCS port);
- commands that talk to the job API (`submit`, `jobs`) use the dashboard URL; given `HEAD:PORT`
  or `ray://HEAD:PORT` they use `http://HEAD:8265` (Ray's default dashboard port), given `auto`
  the dashboard of the Ray instance running on this machine;
- `serve deploy` deploys through the job API's Serve endpoint given a URL (as Ray's own
  `serve deploy` does), and as a driver given a GCS address.

A cluster that does not answer is a ClusterError (exit code 8), never a stack trace.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from urllib.parse import urlsplit

from harnessrl.errors import ClusterError, ConfigError
from harnessrl.settings import redact

log = logging.getLogger(__name__)
DASHBOARD_PORT, GCS_PORT = 8265, 6379
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[^\s:/\[\]]+)(?::(?P<port>\d{1,5}))?$")
FORMS = "http://HOST:8265 (dashboard / job API), HOST:6379 (GCS), ray://HOST:10001 or auto"


def is_url(address: str) -> bool:
    return address.startswith(("http://", "https://"))


def _host_port(address: str) -> tuple[str, int | None]:
    m = _HOST_PORT.match(address)
    if not m or (m["port"] and not 0 < int(m["port"]) < 65536):
        raise ConfigError(f"--address {address!r}: not a Ray address; give {FORMS}")
    return m["host"], int(m["port"]) if m["port"] else None


def from_env() -> str | None:
    return os.environ.get("RAY_ADDRESS") or None


def gcs_address(address: str | None) -> str | None:
    """The address for `ray.init` (None: RAY_ADDRESS, else a local Ray)."""
    address = (address or from_env() or "").strip() or None
    if address is None or address == "auto" or address.startswith("ray://"):
        return address
    if is_url(address):
        parts = urlsplit(address)
        if not parts.hostname:
            raise ConfigError(f"--address {redact(address)!r}: no host; give {FORMS}")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        log.info("--address %s is the dashboard's URL; joining the cluster's GCS at %s:%d (Ray's default port; "
                 "give HOST:PORT if it listens elsewhere)", redact(address), host, GCS_PORT)
        return f"{host}:{GCS_PORT}"
    host, port = _host_port(address)
    return f"{host}:{port or GCS_PORT}"


def job_api_url(address: str | None) -> str:
    """The dashboard URL for Ray's job (and Serve) REST API."""
    address = (address or os.environ.get("RAY_API_SERVER_ADDRESS") or from_env() or "").strip()
    if not address:
        raise ConfigError("no cluster: give --address http://HOST:8265 (or set RAY_ADDRESS)")
    if is_url(address):
        return address.rstrip("/")
    if address == "auto":
        return _local_dashboard()
    if address.startswith("ray://"):
        address = address[len("ray://"):].split("/", 1)[0]
    host, _ = _host_port(address)
    return f"http://{host}:{DASHBOARD_PORT}"


def _local_dashboard() -> str:
    """`auto`: the dashboard of the Ray instance on this machine (as Ray's own CLI finds it)."""
    try:
        from ray.dashboard.utils import ray_address_to_api_server_url

        return ray_address_to_api_server_url("auto")
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise ClusterError(f"--address auto: no Ray instance found on this machine ({first_line(exc)})") from None


def api_client(kind: str, address: str | None):
    """A client of the cluster's REST API: Ray's JobSubmissionClient (`kind` "job") or
    ServeSubmissionClient ("serve"). Ray 2.60 clusters have token auth on: a client only sends
    the token when RAY_AUTH_MODE=token, so that is set here whenever a token is at hand
    (RAY_AUTH_TOKEN or ~/.ray/auth_token)."""
    from pathlib import Path

    url = job_api_url(address)
    # Ray's clients take RAY_API_SERVER_ADDRESS over the URL they are given (harnessrl.ray_runtime.init_ray sets it)
    os.environ["RAY_API_SERVER_ADDRESS"] = url
    if "RAY_AUTH_MODE" not in os.environ and (os.environ.get("RAY_AUTH_TOKEN")
                                              or (Path.home() / ".ray" / "auth_token").is_file()):
        os.environ["RAY_AUTH_MODE"] = "token"
    try:
        if kind == "serve":
            from ray.dashboard.modules.serve.sdk import ServeSubmissionClient as Client
        else:
            from ray.job_submission import JobSubmissionClient as Client
        return Client(url)
    except (ConnectionError, RuntimeError, ValueError) as exc:  # Ray's answers for an absent or refusing head
        msg = first_line(exc)
        hint = " (token auth: set RAY_AUTH_TOKEN or put the token in ~/.ray/auth_token)" if "auth" in msg.lower() else ""
        where = "" if is_url(address or url) else " (Ray's default dashboard port; give http://HOST:PORT if it differs)"
        raise ClusterError(f"cannot reach the Ray job API at {redact(url)}{where}: {msg}{hint}") from None


def reachable(address: str, timeout_s: float = 5.0) -> None:
    """ClusterError unless a TCP connection to HOST:PORT opens within `timeout_s` (a driver
    would otherwise wait a minute for an absent GCS before saying so)."""
    if address == "auto" or "://" in address:
        return
    host, port = _host_port(address)
    try:
        with socket.create_connection((host.strip("[]"), port or GCS_PORT), timeout=timeout_s):
            return
    except OSError as exc:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
