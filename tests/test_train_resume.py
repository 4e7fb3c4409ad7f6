"""`harnessrl train --resume RUN` continues a finished or stopped run from its last checkpoint:
the step count goes on from there, metrics land in the same MLflow run, and a new model
version is registered."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import MODEL

pytestmark = pytest.mark.integration


def test_resume_continues_from_last_checkpoint(pipeline_run, ray_local):
    import ray

    from harnessrl import registry

    run_id = pipeline_run["model"]["run_id"]  # trained 300 steps, checkpoints every 150
    out = subprocess.run(
        [sys.executable, "-m", "harnessrl", "train", str(pipeline_run["pipeline_yaml"]), "--resume", run_id,
         "--set", "train.steps=450", "--set", "registry.alias=resumed",
         "--address", ray.get_runtime_context().gcs_address],
        capture_output=True, text=True, env=os.environ.copy(), timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # Ray forwards worker output to the driver's stdout too: the summary is the last JSON block.
    body = json.loads(out.stdout[out.stdout.rindex("\n{\n") + 1 if "\n{\n" in out.stdout else 0:])
    assert body["run_id"] == run_id and body["resumed"] == run_id
    assert body["resumed_from_step"] == 300 and body["metrics"]["step"] == 450
    assert body["model"]["name"] == MODEL and body["model"]["version"] != pipeline_run["model"]["version"]
    # the test slice holds a few dozen steps of successful held-out episodes: the threshold's basis,
    # and the warning, on both outputs
    rows = body["fallback_rows"]
    assert 0 < rows < 139 and f"only {rows} steps of successful episodes" in body["fallback_warning"]
    assert f"train: the fallback threshold is the 10% quantile of only {rows} " in out.stderr

    history = registry.client().get_metric_history(run_id, "train/loss_q")
    assert [m.step for m in history] == [50, 100, 150, 200, 250, 300, 350, 400, 450]
    assert str(registry.client().get_model_version_by_alias(MODEL, "resumed").version) == body["model"]["version"]


def test_an_unknown_run_or_missing_data_is_a_clear_error_before_ray_starts(pipeline_run, tmp_path):
    # RAY_ADDRESS points nowhere: reaching init_ray would fail differently (a ClusterError, exit 8)
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}
    train = [sys.executable, "-m", "harnessrl", "train", str(pipeline_run["pipeline_yaml"])]
    out = subprocess.run([*train, "--resume", "no-such-run"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 3 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "no training run 'no-such-run'" in out.stderr
    out = subprocess.run([*train, "--set", f"output_dir={tmp_path / 'never-run'}"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 3 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert f"no encoded dataset at {tmp_path / 'never-run' / 'encoded'}: run `harnessrl run`" in out.stderr
