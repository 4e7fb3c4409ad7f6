"""Connecting to Ray: a local, loopback-only instance by default, a cluster by address."""

from __future__ import annotations

import logging
import os
import re
import socket
from contextlib import contextmanager
from typing import Iterator

from harnessrl import addresses
from harnessrl.errors import ClusterError
from harnessrl.settings import apply_offline_env


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start or join Ray once per process.

    Without an address (and no RAY_ADDRESS) a local instance starts, bound to 127.0.0.1; with one
    (any form harnessrl.addresses accepts), this process joins that cluster. A cluster that does
    not answer, or a local Ray that cannot start, is a ClusterError (one line, exit code 8).
    """
    apply_offline_env()
    address = addresses.gcs_address(address)
    if not address:
        # Must be set before Ray is imported anywhere: it decides the node IP (127.0.0.1).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    use_arrow_pool()
    # A local instance's workers inherit this process's environment (HARNESSRL_HOME, MLflow,
    # AWS endpoint); on a cluster the job's runtime env carries them.
    kwargs: dict = {
        "logging_level": logging.WARNING,
        "log_to_driver": True,
        # Workers log warnings and errors only (Train logs every report at INFO otherwise).
        "logging_config": ray.LoggingConfig(encoding="TEXT", log_level="WARNING"),
    }
    if address:
        addresses.reachable(address)
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError, OSError) as exc:
            raise ClusterError(f"cannot join the Ray cluster at {address}: {addresses.first_line(exc)}") from None
    else:
        start_local(num_cpus, kwargs)
    from ray.data import DataContext

    from harnessrl import console

    console.attach_ray()  # what Ray forwards from workers: to the run's log file when a console is on

    logging.getLogger("ray.data").setLevel(logging.WARNING)

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False


ARROW_POOL = "jemalloc"  # Arrow's allocator in every process (ARROW_DEFAULT_MEMORY_POOL; unset: this one)


def use_arrow_pool() -> None:
    """Arrow allocates with jemalloc, which Arrow configures to return freed pages at once, in
    this process and (through the environment, which a local Ray's workers inherit and `harnessrl
    submit` forwards) in the workers. pyarrow's default, mimalloc, keeps them: a Ray worker that
    had read the corpus's files held 0.4-0.8 GB after it (the reader's 1M-row train job peaked at
    5.7-6.0 GB with mimalloc, 5.0-5.1 GB with jemalloc: bench/train_scale.py). Builds without
    jemalloc keep their default."""
    import pyarrow as pa

    pool = os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", ARROW_POOL)
    if pool != "jemalloc":
        return
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # this pyarrow has no jemalloc: every process keeps its default
        os.environ.pop("ARROW_DEFAULT_MEMORY_POOL")


def start_local(num_cpus: int | None, kwargs: dict, ports: Iterator[int] | None = None, attempts: int = 3) -> None:
    """A local Ray on loopback. Its dashboard serves the State API (Ray Train's placement-group
    cleaner polls it) and job submission. A port found free can be taken before Ray's dashboard
    binds it (another Ray starting beside this one): Ray then fails to start, and it is started
    again on another port. The dashboard's URL is put in RAY_API_SERVER_ADDRESS before Ray starts,
    so that Ray's workers (which inherit this environment) query this instance's State API even
    when other Ray instances run on the machine (Ray's own lookup refuses to choose then)."""
    import ray

    dashboard = dashboard_available()
    if not dashboard:
        logging.getLogger(__name__).warning(
            "starting local Ray without its dashboard: its packages are missing (a minimal `ray` install); "
            "encode and ingest run, training and job submission need `pip install 'ray[default]'`")
    ports = ports or dashboard_ports()
    for attempt in range(1, attempts + 1):
        port = next(ports) if dashboard else None
        if port is not None:
            os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
        try:
            ray.init(include_dashboard=dashboard, dashboard_host="127.0.0.1", dashboard_port=port,
                     num_cpus=num_cpus, _node_ip_address="127.0.0.1", **kwargs)
            return
        except Exception as exc:  # Ray raises ValueError, RuntimeError or a bare Exception here
            ray.shutdown()
            message = addresses.first_line(exc)
            if port is None or attempt == attempts or not _PORT_TROUBLE.search(str(exc)):
                raise ClusterError(f"could not start a local Ray: {message}") from None
            logging.getLogger(__name__).info("local Ray: dashboard port %d was taken as Ray started (%s); "
                                             "starting it on another port", port, message)


_PORT_TROUBLE = re.compile(r"(?i)occupied|in use|bind|dashboard")


def dashboard_ports() -> Iterator[int]:
    """8265 (Ray's default) when it is free on loopback, then ports the OS hands out."""
    yield 8265 if _port_free(8265) else _any_free_port()
    while True:
        yield _any_free_port()


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _any_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dashboard_available() -> bool:
    """Whether Ray's dashboard can start here: a minimal `ray` install (no `ray[default]`, as on a
    bare GPU image) lacks its packages, and `include_dashboard=True` would refuse to start Ray."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401
    except ImportError:
        return False
    return True


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


TRAIN_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # Ray Train's own knob, read by its controller


@contextmanager
def train_poll_interval(seconds: float):
    """How often Ray Train's controller polls its workers, for the `fit()` calls inside. Each
    `ray.train.report` (a checkpoint) waits for the next poll, and so do the run's start and end:
    Ray's 2 s default costs a small run seconds of idling (an empty run 12.7 s -> 8.8 s at 0.2 s).
    Ray hands this variable from the driver to its controller, on a laptop and a cluster alike."""
    before = os.environ.get(TRAIN_POLL_ENV)
    os.environ[TRAIN_POLL_ENV] = f"{seconds:g}"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRAIN_POLL_ENV, None)
        else:
            os.environ[TRAIN_POLL_ENV] = before
