"""`harnessrl serve`: run the critic service here, deploy it onto a cluster, remove it, or print
it as a Ray Serve config file.

`serve deploy` takes what a Ray user types as `--address`: the dashboard's URL
(`http://HEAD:8265`, as Ray's own `serve deploy` does) deploys the Serve config file through
the cluster's REST API, and the cluster's own environment gives the replicas their settings
(MLFLOW_TRACKING_URI, HARNESSRL_HOME, HARNESSRL_API_TOKEN, as in the RayService); a GCS address
(`HEAD:6379`, `auto`, `ray://...`) joins the cluster as a driver and deploys from here, passing
this machine's settings to the replicas.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import time
from typing import Any

from harnessrl import addresses, registry, settings
from harnessrl.errors import ConfigError, HarnessError

EXIT_DEPLOY_FAILED = 7  # as a failed job (cli_jobs.EXIT_JOB_FAILED): the cluster ran it and it failed


def serve_config(args: argparse.Namespace, resolve: bool = True):
    """serve.yaml (if given), then --set, then the explicit flags: one ServeConfig, validated;
    `resolve`: the model as a URI (NAME@ALIAS -> models:/NAME@ALIAS; a config file keeps NAME@ALIAS)."""
    from harnessrl.config import load_serve

    model = (registry.model_uri(args.model, "--model") if resolve else args.model) if args.model else None
    fields = {"model": model, "host": args.host, "port": args.port,
              "max_batch_size": args.max_batch_size, "max_queued_requests": args.max_queued_requests,
              "challenger": registry.model_uri(args.challenger, "--challenger") if args.challenger else None,
              "challenger_share": args.challenger_share, "reload_every_s": args.reload_every_s,
              "decision_log": args.decision_log}
    cfg = load_serve(args.config, args.set, fields)
    if cfg.model is None:
        raise ConfigError("no model to serve: give --model or set `model` in the --config file")
    return cfg.model_copy(update={"model": registry.model_uri(cfg.model, "serve model")}) if resolve else cfg


def _port_free(host: str, port: int) -> None:
    """ConfigError when the service could not listen there: said now, not by a Serve proxy that
    fails on the other side of Ray."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"--host {host}: {exc.strerror or exc}") from None
    family, *_, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(addr)
        except OSError as exc:
            raise ConfigError(f"cannot serve on {host}:{port}: {exc.strerror or exc} (--host / --port)") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from harnessrl.api_token import resolve_token

    if args.action == "stop":
        return _stop(args.address or addresses.from_env())
    cfg = serve_config(args, resolve=args.action != "config")  # before Ray starts: a bad config is exit 2 at once
    if args.action == "config":
        from harnessrl import serve_file

        sys.stdout.write(serve_file.dump(serve_file.serve_config(cfg), args.config or "the command line"))
        return 0
    resolve_token()  # so is an empty or unreadable API token
    address = args.address or addresses.from_env()
    if args.action == "deploy":
        if not address:
            raise ConfigError("serve deploy: give --address of a running Ray cluster (http://HEAD:8265 or "
                              "HEAD:6379; a local Ray would stop with this command)")
        if addresses.is_url(address):
            return _deploy_via_api(address, cfg, args.timeout_s)
    if cfg.decision_log is None:
        cfg = cfg.model_copy(update={"decision_log": str(settings.home() / "decisions")})
    from harnessrl.ray_runtime import init_ray

    if not address:
        _port_free(cfg.host, cfg.port)
    init_ray(address)
    from harnessrl.serving import app as serving

    if args.action == "deploy":
        url = serving.start(config=cfg)
        print(f"deployed {cfg.model} at {url} on the cluster; `harnessrl serve stop --address ...` removes it",
              flush=True)
        return 0
    try:
        url = serving.start(config=cfg)
        print(f"serving {cfg.model} at {url}  (POST /v1/score, /v1/select_tool, /v1/feedback; GET /v1/model, "
              f"/healthz, /metrics; docs at {url}/docs); decisions logged to {settings.redact(cfg.decision_log)}; "
              "Ctrl-C stops", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        print("stopping the service", flush=True)
        serving.stop()
    return 0


def _other_apps(details: dict[str, Any]) -> list[dict]:
    """The config of every other app on the cluster: a config PUT replaces the whole set."""
    from harnessrl.serve_file import APP_NAME

    out = []
    for name, app in (details.get("applications") or {}).items():
        if name == APP_NAME:
            continue
        config = app.get("deployed_app_config")
        if not config:
            raise ConfigError(f"the cluster runs the Serve app {name!r}, deployed from Python rather than from a "
                              "config file: deploying a config would remove it; use --address HEAD:6379")
        out.append(config)
    return out


def _deploy_via_api(url: str, cfg, timeout_s: float) -> int:
    from harnessrl import serve_file

    client = addresses.api_client("serve", url)
    config = serve_file.serve_config(cfg)
    config["applications"] = _other_apps(client.get_serve_details()) + config["applications"]
    _call(client.deploy_applications, url, config)
    deadline = time.time() + timeout_s
    while True:
        app = (client.get_serve_details().get("applications") or {}).get(serve_file.APP_NAME) or {}
        status = app.get("status", "NOT_STARTED")
        if status == "RUNNING":
            print(f"deployed {cfg.model} on the cluster at {settings.redact(url)} (Serve's proxy: port {cfg.port} "
                  f"of its nodes); `harnessrl serve stop --address {settings.redact(url)}` removes it", flush=True)
            return 0
        if status in ("DEPLOY_FAILED", "UNHEALTHY"):
            message = (app.get("message") or "").strip().splitlines()
            print(f"harnessrl: the cluster could not start the app: {status}"
                  + (f": {message[-1]}" if message else ""), file=sys.stderr)
            return EXIT_DEPLOY_FAILED
        if time.time() > deadline:
            print(f"harnessrl: the app is still {status} after {timeout_s:.0f} s", file=sys.stderr)
            return EXIT_DEPLOY_FAILED
        time.sleep(2)


def _call(fn, url: str, *args):
    try:
        return fn(*args)
    except (ConnectionError, RuntimeError) as exc:
        raise HarnessError(f"the Ray job API at {settings.redact(url)} refused: {addresses.first_line(exc)}") from None


def _stop(address: str | None) -> int:
    from harnessrl.serve_file import APP_NAME

    if not address:
        raise ConfigError("serve stop: give --address of the cluster the service runs on")
    if addresses.is_url(address):
        client = addresses.api_client("serve", address)
        details = client.get_serve_details()
        if APP_NAME not in (details.get("applications") or {}):
            print(f"no app '{APP_NAME}' on the cluster", flush=True)
            return 0
        _call(client.deploy_applications, address, {"applications": _other_apps(details)})
    else:
        from harnessrl.ray_runtime import init_ray
        from harnessrl.serving import app as serving

        init_ray(address)
        serving.delete()
    print(f"removed the app '{APP_NAME}' from the cluster", flush=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve", help="serve a critic over HTTP with Ray Serve: run it here, deploy it onto a cluster, stop it, "
                      "or print it as a Ray Serve config file",
        description="run: serve here until Ctrl-C. deploy: onto a running cluster, and return (--address "
                    "http://HEAD:8265 deploys through the cluster's REST API, like Ray's `serve deploy`; HEAD:6379 "
                    "joins it as a driver). stop: remove the deployed app. config: print a Ray Serve config file "
                    "(for `serve run` / `serve deploy` / a RayService). Settings: ServeConfig (harnessrl.config), "
                    "from --config YAML, then --set, then the flags; unset flags keep the file's value or "
                    "ServeConfig's default.")
    serve.add_argument("action", nargs="?", default="run", choices=["run", "deploy", "stop", "config"],
                       help="what to do (default: run)")
    serve.add_argument("--config", metavar="YAML", help="serve config YAML (e.g. serving/serve.yaml), validated by "
                                                       "ServeConfig")
    serve.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value (e.g. autoscaling.max_replicas=4); repeatable")
    serve.add_argument("--model", help=registry.FORMS)
    serve.add_argument("--host", help="address Serve's proxy listens on (default 127.0.0.1; 0.0.0.0 for other "
                                      "machines, then set HARNESSRL_API_TOKEN)")
    serve.add_argument("--port", type=int, help="HTTP port (default 8000)")
    serve.add_argument("--max-batch-size", type=int, help="requests scored in one forward pass (default 32)")
    serve.add_argument("--max-queued-requests", type=int, help="beyond this many waiting requests: 429 + Retry-After")
    serve.add_argument("--challenger", help="a second model (e.g. NAME@challenger) for a share of agents")
    serve.add_argument("--challenger-share", type=float, help="share of agents (by agent_id hash; default 0.1)")
    serve.add_argument("--reload-every-s", type=float,
                       help="check the aliases this often and switch to a new version without dropping requests")
    serve.add_argument("--decision-log", metavar="DIR", help="folder (local or s3://) for decisions and feedback "
                                                             "(default: $HARNESSRL_HOME/decisions)")
    serve.add_argument("--address", help="the cluster (deploy and stop need one): http://HEAD:8265 (its dashboard), "
                                         "HEAD:6379, ray://HEAD:10001 or auto (default: RAY_ADDRESS)")
    serve.add_argument("--timeout-s", type=float, default=600,
                       help="deploy through the dashboard: wait this long for the app to run (default 600)")
    serve.set_defaults(fn=cmd_serve)
