"""`harnessrl submit` and `harnessrl jobs` against a real two-node Ray cluster on loopback: the
pipeline runs as a Ray job, its encoder actors and its training workers land on both nodes, and
the model it registers carries the lineage of the run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from ray_cluster import start_cluster, state_query, stop_cluster

pytestmark = pytest.mark.integration
MODEL_ON_CLUSTER = "cluster-critic"


@pytest.fixture(scope="module")
def cluster(harnessrl_home):
    c = start_cluster(cpus_per_node=2)
    try:
        yield c
    finally:
        stop_cluster(c)


def harnessrl(*args: str, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harnessrl", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_submit_runs_the_pipeline_across_both_nodes(cluster, sample_slice, tmp_path):
    pipeline = {
        "name": "on-cluster",
        "output_dir": str(tmp_path / "run"),
        "data": {"train": [str(sample_slice["train"])]},
        "render": {"window": 3, "max_chars": 1500, "tool_from": "first_word"},
        # encoder actors spread across nodes (encode_pool.py); the train workers by configuration
        "encoder": {"batch_size": 32, "max_seq_length": 128, "actors": 2},
        "train": {"steps": 40, "batch_size": 64, "checkpoint_every": 20, "log_every": 20, "num_workers": 2,
                  "placement_strategy": "SPREAD", "reader": {"prior_steps": 20}},
        "registry": {"experiment": "on-cluster", "model_name": MODEL_ON_CLUSTER, "alias": "champion"},
        "serve": {"enabled": False},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline))

    sub = harnessrl("submit", str(path), "--address", cluster.dashboard_url, "--job-id", "hrl-test-1", "--wait",
                    "--timeout-s", "800", env=cluster.env)
    logs = harnessrl("jobs", "logs", "hrl-test-1", "--address", cluster.dashboard_url, env=cluster.env).stdout
    assert sub.returncode == 0, f"{sub.stderr[-3000:]}\n--- job logs ---\n{logs[-6000:]}"
    assert sub.stdout.strip() == "hrl-test-1"
    assert "harnessrl pipeline 'on-cluster' finished" in logs

    status = json.loads(harnessrl("jobs", "status", "hrl-test-1", "--address", cluster.dashboard_url,
                                  env=cluster.env).stdout)
    assert status["status"] == "SUCCEEDED" and status["driver_exit_code"] == 0
    listed = harnessrl("jobs", "list", "--address", cluster.dashboard_url, "--json", env=cluster.env)
    assert {"job_id": "hrl-test-1", "status": "SUCCEEDED", "pipeline": "on-cluster"}.items() <= next(
        j for j in json.loads(listed.stdout) if j["job_id"] == "hrl-test-1").items()

    actors = state_query(cluster, "[(a.class_name, a.node_id) for a in state.list_actors(address=address, "
                                  "limit=10000, raise_on_missing_output=False)]")
    nodes = {kind: {node for name, node in actors if kind in (name or "")} for kind in ("_Encoder", "RayTrainWorker")}
    assert len(nodes["_Encoder"]) == 2, nodes
    assert len(nodes["RayTrainWorker"]) == 2, nodes

    # the job registered its model with the lineage of this run, in the same tracking store
    lineage = harnessrl("lineage", f"{MODEL_ON_CLUSTER}@champion", "--verify", env=cluster.env)
    assert lineage.returncode == 0, lineage.stdout + lineage.stderr
    assert str(tmp_path / "run") in lineage.stdout and "verified: every digest matches" in lineage.stdout


def test_jobs_errors_are_clear(cluster, tmp_path):
    unknown = harnessrl("jobs", "status", "no-such-job", "--address", cluster.dashboard_url, env=cluster.env)
    assert unknown.returncode == 1 and "no job 'no-such-job'" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndata: {train: [a.jsonl]}\ntrain: {steps: -1}\n")
    refused = harnessrl("submit", str(bad), "--address", cluster.dashboard_url, env=cluster.env)
    assert refused.returncode == 2 and "steps" in refused.stderr  # validated before anything is sent
    # a GCS-style address is taken to mean the dashboard on Ray's default port: nothing answers there
    nowhere = harnessrl("jobs", "list", "--address", "127.0.0.2:1", env=cluster.env)
    assert nowhere.returncode == 8 and "cannot reach the Ray job API at http://127.0.0.2:8265" in nowhere.stderr
    assert "Traceback" not in nowhere.stderr
