"""Local Ray start-up: on installs without the dashboard's packages (a bare GPU image), and beside other
Ray instances on the same machine."""

import os
import subprocess
import sys

import pytest

from harnessrl.ray_runtime import dashboard_available


def test_dashboard_available_with_the_full_install():
    assert dashboard_available() is True  # ray[data,train,serve] brings the dashboard's packages


def test_dashboard_unavailable_when_a_package_is_missing(monkeypatch):
    # A None entry in sys.modules makes the import raise ImportError, as a missing package does.
    monkeypatch.delitem(sys.modules, "ray.dashboard.optional_deps", raising=False)
    monkeypatch.setitem(sys.modules, "aiohttp_cors", None)
    assert dashboard_available() is False


RACE = r'''
import os, socket, sys
from harnessrl import ray_runtime

held = socket.socket()
held.bind(("127.0.0.1", 0))
held.listen()
taken, free = held.getsockname()[1], ray_runtime._any_free_port()
# the first port offered was free when chosen and is taken by the time Ray's dashboard binds it
ray_runtime.start_local(1, {"log_to_driver": False}, ports=iter([taken, free]))
import ray
assert os.environ["RAY_API_SERVER_ADDRESS"] == f"http://127.0.0.1:{free}", os.environ["RAY_API_SERVER_ADDRESS"]


@ray.remote(num_cpus=0)
def nodes_seen_from_a_worker():
    """Ray Train's placement-group cleaner asks the State API like this, with no address."""
    from ray.util.state import list_nodes
    return len(list_nodes())


print("NODES", ray.get(nodes_seen_from_a_worker.remote()))
'''


@pytest.mark.integration
def test_local_ray_survives_a_taken_dashboard_port_and_workers_find_it(ray_local, tmp_path):
    """Beside another Ray (the session's own): a worker's State API call without an address finds
    this instance (Ray's own lookup refuses with two running), and a dashboard port taken between
    choosing it and Ray binding it costs a restart on another port, not a traceback."""
    env = {**os.environ, "HARNESSRL_HOME": str(tmp_path), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_API_SERVER_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", RACE], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "NODES 1" in out.stdout, out.stdout[-2000:]


@pytest.mark.integration
def test_arrow_allocates_with_jemalloc_in_the_driver_and_the_workers(ray_local):
    """jemalloc as Arrow configures it returns freed pages at once; pyarrow's default (mimalloc)
    kept 0.4-0.8 GB in each worker that had read the corpus's files (ray_runtime.use_arrow_pool)."""
    import pyarrow as pa
    import ray

    @ray.remote
    def backend() -> str:
        import pyarrow as pa

        return pa.default_memory_pool().backend_name

    assert pa.default_memory_pool().backend_name == "jemalloc"
    assert ray.get(backend.remote()) == "jemalloc"


def test_a_submitted_jobs_workers_allocate_as_a_local_runs_do(tmp_path, monkeypatch):
    from harnessrl.cli_jobs import runtime_env

    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    (tmp_path / "a").mkdir()
    assert runtime_env({"name": "x"}, tmp_path / "a", [], [], None)["env_vars"]["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "system")  # the user's choice is forwarded as it is
    (tmp_path / "b").mkdir()
    assert runtime_env({"name": "x"}, tmp_path / "b", [], [], None)["env_vars"]["ARROW_DEFAULT_MEMORY_POOL"] == "system"


def test_the_train_poll_interval_reaches_ray_trains_workers_and_is_undone_after(ray_local, tmp_path, monkeypatch):
    """train.poll_s as Ray Train reads it: handed from the driver to its controller and workers."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from harnessrl.ray_runtime import TRAIN_POLL_ENV, train_poll_interval

    monkeypatch.delenv(TRAIN_POLL_ENV, raising=False)
    seen = tmp_path / "seen"

    def loop(config):
        with open(config["seen"], "w") as fh:
            fh.write(os.environ.get(TRAIN_POLL_ENV, "unset"))

    with train_poll_interval(0.25):
        TorchTrainer(loop, train_loop_config={"seen": str(seen)},
                     scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.5}),
                     run_config=RunConfig(name="poll", storage_path=str(tmp_path / "runs"))).fit()
    assert seen.read_text() == "0.25"
    assert TRAIN_POLL_ENV not in os.environ  # the driver's environment as it was
    monkeypatch.setenv(TRAIN_POLL_ENV, "3")
    with train_poll_interval(0.5):
        assert os.environ[TRAIN_POLL_ENV] == "0.5"
    assert os.environ[TRAIN_POLL_ENV] == "3"
