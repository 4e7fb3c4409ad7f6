"""A pipeline against an MLflow tracking server, as on a cluster (infra/k8s/mlflow.yaml): a SQL store
(SQLite here, Postgres there) and artifacts proxied by the server to S3 (moto's S3 server on
loopback, the `s3` fixture). The tracking URI reaches the Ray Train workers through the training
config (`config["tracking_uri"]`), not their environment: the session's local Ray was started
before MLFLOW_TRACKING_URI was set, as a cluster's workers are started before a job names a server.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest

from conftest import free_port, start_mlflow_server

pytestmark = pytest.mark.integration

MODEL = "server-critic"
PREFIX = "mlflow"


@pytest.fixture
def mlflow_server(s3, tmp_path):
    """`mlflow server` with a SQLite store and S3 artifacts, on loopback; MLFLOW_TRACKING_URI points
    at it for the test and is restored afterwards. Stopped by its process group (the server and the
    uvicorn workers it starts)."""
    import mlflow

    from harnessrl import settings

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MLFLOW_S3_ENDPOINT_URL": s3["endpoint"]}
    env.pop("MLFLOW_TRACKING_URI", None)
    log = tmp_path / "mlflow-server.log"
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    proc = None
    try:
        proc = start_mlflow_server(tmp_path / "mlflow.db", f"s3://{s3['bucket']}/{PREFIX}", port, env, log)
        os.environ["MLFLOW_TRACKING_URI"] = url
        yield {"url": url, "log": log}
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved
        mlflow.set_tracking_uri(settings.tracking_uri())  # the session's own store again
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def test_pipeline_tracks_to_server_with_s3_artifacts(ray_local, sample_slice, s3, mlflow_server, tmp_path):
    from mlflow import MlflowClient

    from harnessrl import settings
    from harnessrl.config import parse_pipeline
    from harnessrl.critic import Critic
    from harnessrl.jobs.pipeline import run_pipeline

    assert settings.tracking_uri() == mlflow_server["url"]
    raw = {
        "name": "mlflow-server",
        "output_dir": str(tmp_path / "run"),
        "data": {"train": [str(sample_slice["train"])], "heldout": [str(sample_slice["test"])]},
        "render": {"window": 3, "max_chars": 1500, "tool_from": "first_word"},
        "encoder": {"batch_size": 32, "max_seq_length": 128},
        "train": {"steps": 60, "batch_size": 64, "checkpoint_every": 60, "log_every": 20, "reader": {"prior_steps": 20}},
        "registry": {"experiment": "mlflow-server", "model_name": MODEL, "alias": "champion"},
        "evaluate": {"max_heldout_steps": 50},
        "serve": {"enabled": False},
    }
    summary = run_pipeline(parse_pipeline(raw))

    client = MlflowClient(mlflow_server["url"])
    mv = client.get_model_version_by_alias(MODEL, "champion")
    assert str(mv.version) == str(summary["model"]["version"])
    run = client.get_run(mv.run_id)
    assert run.info.experiment_id == client.get_experiment_by_name("mlflow-server").experiment_id
    assert run.info.artifact_uri.startswith("mlflow-artifacts:"), run.info.artifact_uri  # proxied by the server
    # Logged by the Ray Train worker (rank 0) through config["tracking_uri"]: one value per log_every.
    history = client.get_metric_history(run.info.run_id, "train/loss_q")
    assert sorted(m.step for m in history) == [20, 40, 60], history
    assert "train/seconds" in run.data.metrics  # logged by the driver

    # The model's files are objects in the bucket, under the server's artifacts destination.
    keys = []
    for page in s3["client"].get_paginator("list_objects_v2").paginate(Bucket=s3["bucket"], Prefix=f"{PREFIX}/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    assert any(k.endswith("/MLmodel") for k in keys), keys
    weights = [k for k in keys if k.endswith(".safetensors")]
    assert weights, keys

    # Loaded through the registry from the server (the copy the evaluate stage cached is removed
    # first, so this one comes from the server and the bucket), and it scores.
    cache = settings.home() / "models" / MODEL / str(mv.version)
    shutil.rmtree(cache, ignore_errors=True)
    critic = Critic.load(f"models:/{MODEL}@champion")
    assert (critic.name, str(critic.version)) == (MODEL, str(mv.version))
    assert cache.is_dir()
    d = critic.decide("You are in the kitchen. Task: take the key.", ["take key", "go north", "look"])
    assert len(d.scores) == 3 and all(isinstance(s, float) for s in d.scores)
    assert 0 <= d.best_index < 3
