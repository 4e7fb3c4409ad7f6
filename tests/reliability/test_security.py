"""Security promises of the load paths and logs:

- loading a registered critic (registry download, safetensors, MiniLM encoder) and the MLflow
  pyfunc of it, then scoring, unpickles nothing: a fresh process with every unpickling entry
  point (pickle, _pickle, torch.load) replaced by a tripwire does all of it;
- secrets (the S3 secret key of the session, Ray's auth token) appear in no MLflow param or tag
  of the session's runs and in none of Ray's session logs.
(Request paths, the bind address and the API token in logs: tests/reliability/test_serve_faults.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MODEL

pytestmark = pytest.mark.integration

TRIPWIRE = r'''
import pickle, _pickle, sys

ARMED = [False]  # the self-check below must not count as an attempt


def boom(*args, **kwargs):
    if ARMED[0]:
        import traceback
        print("UNPICKLE-ATTEMPT", file=sys.stderr, flush=True)
        traceback.print_stack(file=sys.stderr)
    raise RuntimeError("unpickling on the model load path")

class NoUnpickler:
    def __init__(self, *args, **kwargs):
        boom()

for mod in (pickle, _pickle):
    mod.load = mod.loads = boom
    mod.Unpickler = NoUnpickler
import torch
torch.load = boom
try:  # the tripwire itself works
    pickle.loads(pickle.dumps(1))
    raise SystemExit("tripwire did not fire")
except RuntimeError:
    pass
ARMED[0] = True

import pandas as pd
import mlflow.pyfunc
from harnessrl.critic import Critic

uri = sys.argv[1]
critic = Critic.load(uri)
scores = critic.score("Task: find the coin.\nNow: You are in the kitchen.", ["take coin", "move north"])
assert len(scores) == 2
model = mlflow.pyfunc.load_model(uri)
out = model.predict(pd.DataFrame({"state": ["Task: t\nNow: a room"], "candidates": [["look", "take coin"]]}))
assert len(out) == 1 and len(out[0]) == 2
print("LOADED-AND-SCORED", flush=True)
'''


def test_model_loading_unpickles_nothing(pipeline_run, tmp_path):
    from harnessrl import settings

    env = {**os.environ, "HARNESSRL_HOME": str(tmp_path / "home"),  # an empty model cache: a real download
           "MLFLOW_TRACKING_URI": settings.tracking_uri()}
    proc = subprocess.run([sys.executable, "-c", TRIPWIRE, f"models:/{MODEL}@champion"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert "UNPICKLE-ATTEMPT" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0 and "LOADED-AND-SCORED" in proc.stdout, proc.stderr[-3000:]
    assert list((tmp_path / "home" / "models" / MODEL).glob("*/MLmodel"))  # it was downloaded, not reused


def _secrets() -> dict[str, str]:
    found = {"AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "")}
    token = Path.home() / ".ray" / "auth_token"
    if token.is_file():
        found["ray auth token"] = token.read_text().strip()
    for key in ("HARNESSRL_API_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        if os.environ.get(key):
            found[key] = os.environ[key]
    return {k: v for k, v in found.items() if len(v) >= 8}


def test_secrets_not_in_mlflow_params_or_ray_logs(pipeline_run, s3):
    import ray
    from mlflow import MlflowClient

    from harnessrl import settings

    secrets = _secrets()
    assert "AWS_SECRET_ACCESS_KEY" in secrets  # the session's S3 has a distinctive secret to look for
    client = MlflowClient(settings.tracking_uri())
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    assert runs
    for run in runs:
        for where, values in (("params", run.data.params), ("tags", run.data.tags)):
            for k, v in values.items():
                for name, secret in secrets.items():
                    assert secret not in str(v) and secret not in k, (run.info.run_id, where, k, name)
    for mv in client.search_model_versions(f"name='{MODEL}'"):
        for k, v in mv.tags.items():
            assert not any(s in str(v) for s in secrets.values()), (mv.version, k)
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    leaked = []
    for f in logs.rglob("*"):
        if f.is_file() and f.stat().st_size < 200 << 20:
            data = f.read_bytes()
            leaked += [(str(f), name) for name, s in secrets.items() if s.encode() in data]
    assert not leaked, leaked
