"""Credentials in a tracking URI (`http://user:password@host`, `postgresql://user:password@...`)
are never printed: not in an error, not in the pipeline summary, not in MLflow's own "View run"
line. Against a real `mlflow server` on loopback, reached through a URI with userinfo (MLflow
sends it as basic auth; the server ignores it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from conftest import free_port, start_mlflow_server

SECRET = "s3cr3t-pw-7f3a"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlflow-redaction")
    port = free_port()
    proc = start_mlflow_server(d / "mlflow.db", (d / "artifacts").as_uri(), port, dict(os.environ), d / "server.log")
    yield f"http://harnessrl:{SECRET}@127.0.0.1:{port}"
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)


def test_redact_removes_userinfo_and_secret_query_values():
    from harnessrl.settings import redact

    assert redact(f"http://u:{SECRET}@host:5000/x") == "http://***@host:5000/x"
    assert redact(f"https://{SECRET}@host") == "https://***@host"
    assert redact(f"postgresql://u:{SECRET}@db:5432/mlflow?sslmode=require&password={SECRET}") == \
        "postgresql://***@db:5432/mlflow?sslmode=require&password=***"
    for plain in ("http://127.0.0.1:5000", "sqlite:////tmp/h/mlflow.db", "databricks", "s3://bucket/runs/x"):
        assert redact(plain) == plain


def _cli(*args: str, uri: str, home) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "HARNESSRL_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "harnessrl", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def test_registry_errors_name_the_server_without_its_credentials(server, tmp_path):
    out = _cli("score", "--model", "nosuch@champion", "--state", "s", "--candidate", "a", uri=server, home=tmp_path)
    assert out.returncode == 4, out.stderr
    assert "not found in the registry at http://***@127.0.0.1:" in out.stderr
    assert SECRET not in out.stdout + out.stderr


def test_mlflow_prints_no_run_url_with_credentials(server, tmp_path):
    """MLflow prints "View run ... at: <tracking URI>/#/..." as a run ends; the CLI turns that off
    for a URI with credentials (settings.protect_tracking_uri, called by `harnessrl` at start)."""
    prog = ("import mlflow; from harnessrl import settings; settings.protect_tracking_uri(); "
            "mlflow.set_experiment('redaction'); mlflow.start_run(); mlflow.log_metric('x', 1); mlflow.end_run(); "
            "print('RUN-ENDED')")
    env = {**os.environ, "MLFLOW_TRACKING_URI": server, "HARNESSRL_HOME": str(tmp_path)}
    env.pop("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", None)
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "RUN-ENDED" in out.stdout, out.stderr[-2000:]
    assert SECRET not in out.stdout + out.stderr


def test_pipeline_summary_prints_no_credentials(monkeypatch, capsys):
    from harnessrl.cli import print_summary

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"postgresql://mlflow:{SECRET}@db:5432/mlflow")
    enc = {"texts_total": 10, "texts_distinct": 5, "actors": 1, "seconds": 1.0,
           "encoder": {"model_name": "m", "dim": 8}}
    print_summary({
        "pipeline": "p", "seconds": 1.0, "output_dir": f"s3://AKIA:{SECRET}@bucket/runs/p", "run_id": "r",
        "experiment": "e",
        "ingest": {"records_in": 1, "episodes": 1, "steps": 1, "records_quarantined": 0, "by_reason": {}},
        "transitions": {"recipe": "default", "recipe_digest": "d", "mean_return": 0.0, "success_rate": 1.0,
                        "transitions": 1, "episodes": 1},
        "encode": enc, "train": {"steps": 1, "seconds": 1.0, "metrics": {}, "fallback_threshold": 0.0},
        "model": {"name": "m", "version": "1", "alias": "champion", "uri": "models:/m@champion", "run_id": "r",
                  "experiment": "e"}})
    out = capsys.readouterr().out
    assert SECRET not in out and "postgresql://***@db:5432/mlflow" in out and "s3://***@bucket/runs/p" in out
