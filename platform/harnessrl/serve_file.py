"""The critic service as a Ray Serve config file: Ray's own format (`serve run FILE`, `serve deploy
FILE --address http://HEAD:8265`, a RayService's `serveConfigV2`), made from a ServeConfig.

One application, `harnessrl`, whose `import_path` is `harnessrl.serving.app:app_builder` and
whose `args` are the ServeConfig's fields (those set in the file it came from): the builder
validates them again on the cluster and builds the same app as `harnessrl serve`. `host` and
`port` are the file's `http_options` (where Serve's proxy listens), not args. Needs no Ray:
`harnessrl serve config` prints it, infra/render.py writes it into the RayService manifest.
"""

from __future__ import annotations

from typing import Any

import yaml

from harnessrl.config import ServeConfig

APP_NAME = "harnessrl"
IMPORT_PATH = "harnessrl.serving.app:app_builder"
NOT_ARGS = {"host", "port", "enabled", "smoke_requests"}  # http_options, or pipeline-only fields


def application(cfg: ServeConfig) -> dict[str, Any]:
    """The application entry: name, route, import path and the ServeConfig as args."""
    args = cfg.model_dump(mode="json", exclude_unset=True, exclude=NOT_ARGS)
    return {"name": APP_NAME, "route_prefix": "/", "import_path": IMPORT_PATH, "args": args}


def serve_config(cfg: ServeConfig, host: str | None = None) -> dict[str, Any]:
    """A whole Serve config file (Ray's ServeDeploySchema); `host` overrides where the proxy
    listens (a RayService's pods: 0.0.0.0)."""
    return {
        "http_options": {"host": host or cfg.host, "port": cfg.port},
        # no access line per request from Serve's proxy; /metrics counts requests instead
        "logging_config": {"enable_access_log": False},
        "applications": [application(cfg)],
    }


def dump(config: dict[str, Any], source: str) -> str:
    head = (f"# Ray Serve config file of the harnessrl critic service, made from {source} by `harnessrl serve "
            "config`.\n# Deploy with Ray's CLI: serve run THIS_FILE, or serve deploy THIS_FILE --address "
            "http://HEAD:8265\n")
    return head + yaml.safe_dump(config, sort_keys=False)
