"""Shared fixtures: one local Ray per test session (loopback), a private HARNESSRL_HOME with a
SQLite MLflow store, and small slices of the bundled TextWorldExpress sample."""

from __future__ import annotations

import gzip
import os
import socket
from importlib import resources
from pathlib import Path

import pytest

TRAIN_EPISODES = 40
TEST_EPISODES = 12
MODEL = "it-critic"


@pytest.fixture(scope="session")
def harnessrl_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("harnessrl_home")
    # Set before Ray starts: a local Ray's workers inherit this environment.
    os.environ["HARNESSRL_HOME"] = str(home)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("RAY_ADDRESS", None)
    return home


@pytest.fixture(scope="session")
def ray_local(harnessrl_home):
    from harnessrl.ray_runtime import init_ray, shutdown_ray

    init_ray(num_cpus=2)
    yield
    shutdown_ray()


def _slice(name: str, n: int, out: Path) -> Path:
    src = resources.files("harnessrl.examples").joinpath(f"data/{name}.jsonl.gz")
    lines = gzip.decompress(src.read_bytes()).splitlines(keepends=True)[:n]
    out.write_bytes(b"".join(lines))
    return out


@pytest.fixture(scope="session")
def sample_slice(tmp_path_factory) -> dict[str, Path]:
    """The first episodes of the bundled sample: `train` (train seeds) and `test` (held-out seeds)."""
    d = tmp_path_factory.mktemp("sample")
    return {"train": _slice("twx_train", TRAIN_EPISODES, d / "train.jsonl"),
            "test": _slice("twx_test", TEST_EPISODES, d / "test.jsonl")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pipeline_run(ray_local, sample_slice, tmp_path_factory):
    """The quickstart pipeline on a slice of the sample; its model is registered as MODEL@champion."""
    from harnessrl.config import parse_pipeline
    from harnessrl.jobs.pipeline import run_pipeline

    cfg = parse_pipeline({
        "name": "integration",
        "output_dir": str(tmp_path_factory.mktemp("integration")),
        "data": {"train": [str(sample_slice["train"])], "heldout": [str(sample_slice["test"])]},
        "render": {"window": 3, "max_chars": 1500},
        "encoder": {"batch_size": 32, "max_seq_length": 128},
        "train": {"steps": 300, "batch_size": 128, "checkpoint_every": 150, "log_every": 50},
        "registry": {"experiment": "integration", "model_name": MODEL, "alias": "champion"},
        "evaluate": {"max_heldout_steps": 200},
        "serve": {"port": free_port(), "smoke_requests": 3},
    })
    return run_pipeline(cfg)
