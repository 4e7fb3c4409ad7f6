"""`harnessrl evaluate` on the registered test model and held-out test-seed logs: every metric is
computed and finite where it must be, the diagnosis report is written with its plots, the run
is logged to MLflow, and a missing model is a clear error."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MODEL, TEST_EPISODES

pytestmark = pytest.mark.integration
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def result(pipeline_run, sample_slice, tmp_path_factory):
    from harnessrl.jobs.evaluate import evaluate

    return evaluate(f"models:/{MODEL}@champion", [str(sample_slice["test"])], "auto",
                    str(tmp_path_factory.mktemp("eval")))


def test_metrics_are_computed(result):
    m = result.metrics
    assert m["episodes"] == TEST_EPISODES and m["steps"] > 50
    for key in ("td_mae", "td_rmse", "v_mean_abs", "v_bound_ratio", "spearman_v_rtg", "expert_top1",
                "expert_random_top1", "fallback_rate", "tool_entropy", "tool_entropy_norm", "invalid_tool_rate",
                "latency_p50_ms", "latency_p99_ms"):
        assert math.isfinite(m[key]), key
    assert -1 <= m["spearman_v_rtg"] <= 1 and 0 <= m["expert_top1"] <= 1 and 0 <= m["fallback_rate"] <= 1
    assert 0 <= m["tool_entropy_norm"] <= 1 and 0 <= m["invalid_tool_rate"] <= 1
    assert m["latency_p50_ms"] <= m["latency_p99_ms"]
    assert m["spearman_v_rtg"] > 0  # a trained V orders held-out states by what followed them
    assert m["seen_groups_checked"] == 1 and m["seen_groups"] == 0  # test-fold seeds: no task in both
    # a frozen critic has no behaviour prior: its steps are decided by the scores alone
    assert m["prior_weight"] == 0.0 and "expert_top1_prior" not in m
    assert 0 <= m["fallback_rate_success_decisions"] <= 1


def test_task_groups_seen_in_training_are_left_out(pipeline_run, sample_slice, tmp_path):
    from harnessrl.errors import DataError
    from harnessrl.jobs.evaluate import evaluate

    train_lines = sample_slice["train"].read_bytes().splitlines(keepends=True)[:3]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b"".join(train_lines) + sample_slice["test"].read_bytes())
    groups = {json.loads(line)["group_id"] for line in train_lines}
    r = evaluate(f"models:/{MODEL}@champion", [str(mixed)], "auto", str(tmp_path / "eval"), log_to_mlflow=False)
    assert r.metrics["seen_groups"] == len(groups) and r.metrics["episodes"] == TEST_EPISODES
    test_groups = {json.loads(line)["group_id"] for line in sample_slice["test"].read_bytes().splitlines()}
    assert r.metrics["groups"] == len(test_groups | groups)
    with pytest.raises(DataError, match="--include-seen"):
        evaluate(f"models:/{MODEL}@champion", [str(sample_slice["train"])], "auto", str(tmp_path / "seen"),
                 log_to_mlflow=False)
    kept = evaluate(f"models:/{MODEL}@champion", [str(sample_slice["train"])], "auto", str(tmp_path / "kept"),
                    max_steps=40, log_to_mlflow=False, include_seen=True)
    assert kept.metrics["seen_groups"] == kept.metrics["groups"] > 0 and kept.metrics["steps"] == 40


def test_report_and_mlflow_run(result):
    report = Path(result.report)
    text = report.read_text()
    assert "## Findings" in text and "## Metrics" in text and "expert_top1" in text
    for png in ("learning_curves.png", "q_distribution.png", "advantage_hist.png", "value_vs_return.png"):
        assert (report.parent / png).read_bytes()[:8] == PNG, png
    from harnessrl import registry

    run = registry.client().get_run(result.mlflow_run_id)
    assert run.data.metrics["eval/steps"] == result.metrics["steps"]
    assert run.data.tags["harnessrl.model"] == MODEL
    artifacts = {a.path for a in registry.client().list_artifacts(result.mlflow_run_id, "diagnosis")}
    assert "diagnosis/report.md" in artifacts


def test_cli_evaluate_json_and_missing_model(pipeline_run, sample_slice, ray_local):
    import ray

    address = ["--address", ray.get_runtime_context().gcs_address]
    out = subprocess.run([sys.executable, "-m", "harnessrl", "evaluate", "--model", f"{MODEL}@champion", "--data",
                          str(sample_slice["test"]), "--max-steps", "60", "--no-mlflow", "--json", *address],
                         capture_output=True, text=True, env=os.environ.copy(), timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    body = json.loads(out.stdout[out.stdout.rindex("\n{\n") + 1 if "\n{\n" in out.stdout else 0:])
    assert body["metrics"]["steps"] == 60 and body["mlflow_run_id"] is None
    missing = subprocess.run([sys.executable, "-m", "harnessrl", "evaluate", "--model", "no-such-model@champion",
                              "--data", str(sample_slice["test"]), *address],
                             capture_output=True, text=True, env=os.environ.copy(), timeout=600)
    assert missing.returncode == 4 and "Traceback" not in missing.stderr
