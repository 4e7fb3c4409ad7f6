"""Connecting to Ray: a local, loopback-only instance by default, a cluster by address."""

from __future__ import annotations

import logging
import os
import socket
from contextlib import contextmanager

from harnessrl.settings import apply_offline_env


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start or join Ray once per process.

    Without an address (and no RAY_ADDRESS) a local instance starts, bound to 127.0.0.1 with
    no dashboard; with one, this process joins that cluster.
    """
    apply_offline_env()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not address:
        # Must be set before Ray is imported anywhere: it decides the node IP (127.0.0.1).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    # A local instance's workers inherit this process's environment (HARNESSRL_HOME, MLflow,
    # AWS endpoint); on a cluster the job's runtime env carries them.
    kwargs: dict = {
        "logging_level": logging.WARNING,
        "log_to_driver": True,
        # Workers log warnings and errors only (Train logs every report at INFO otherwise).
        "logging_config": ray.LoggingConfig(encoding="TEXT", log_level="WARNING"),
    }
    if address:
        ray.init(address=address, **kwargs)
    else:
        # The dashboard serves the State API (Ray Train's placement-group cleaner polls it)
        # and job submission; it binds to loopback like the rest.
        dashboard = dashboard_available()
        if not dashboard:
            logging.getLogger(__name__).warning(
                "starting local Ray without its dashboard: its packages are missing (a minimal `ray` install); "
                "encode and ingest run, training and job submission need `pip install 'ray[default]'`")
        ray.init(
            include_dashboard=dashboard,
            dashboard_host="127.0.0.1",
            dashboard_port=_free_port(8265),  # two local instances (say, serve + run) must not collide
            num_cpus=num_cpus,
            _node_ip_address="127.0.0.1",
            **kwargs,
        )
    from ray.data import DataContext

    logging.getLogger("ray.data").setLevel(logging.WARNING)

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False


def dashboard_available() -> bool:
    """Whether Ray's dashboard can start here: a minimal `ray` install (no `ray[default]`, as on a
    bare GPU image) lacks its packages, and `include_dashboard=True` would refuse to start Ray."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401
    except ImportError:
        return False
    return True


def _free_port(preferred: int) -> int:
    """`preferred` when it is free on loopback, else any free port."""
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
                return sock.getsockname()[1]
            except OSError:
                continue
    raise RuntimeError("no free port on 127.0.0.1")


def shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def shuffle_partitions() -> int:
    """Partitions for a hash shuffle (groupby): a few per CPU. Ray's default of 200 costs
    seconds of scheduling on a small machine for nothing."""
    import ray

    return max(2, min(200, 4 * int(ray.cluster_resources().get("CPU", 1))))


STREAM_OBJECT_STORE_BYTES = 256 << 20  # the streaming stages' budget: blocks in flight, not the corpus


@contextmanager
def object_store_budget(nbytes: int = STREAM_OBJECT_STORE_BYTES):
    """Ray Data's object-store limit for the executions inside (this process's DataContext; Ray
    Data snapshots it when a dataset is made, so enter this before), so that no operator's
    outputs pile up ahead of the next one and memory does not grow with the corpus."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    before = ctx.execution_options.resource_limits
    ctx.execution_options.resource_limits = before.copy(object_store_memory=nbytes)
    try:
        yield
    finally:
        ctx.execution_options.resource_limits = before
