"""The pipeline's evaluate-and-serve step on held-out logs that keep the expert's action at
another place (`info.behaviour.expert_action`): with the default field there is no figure and
the summary says so, the serve smoke requests still run; naming the field measures it. Real
stack: the model of `pipeline_run`, Ray Data ingest, Ray Serve on loopback."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def moved_labels(sample_slice, tmp_path_factory):
    out = tmp_path_factory.mktemp("moved") / "heldout.jsonl"
    lines = []
    for line in sample_slice["test"].read_bytes().splitlines()[:4]:
        rec = json.loads(line)
        for step in rec["steps"]:
            info = step["info"]
            info["behaviour"] = {"kind": info["behaviour"], "expert_action": info.pop("expert_action")}
        lines.append(json.dumps(rec))
    out.write_text("\n".join(lines) + "\n")
    return out


def _evaluate(pipeline_run, heldout, tmp_path, **evaluate):
    import mlflow

    from harnessrl import registry
    from harnessrl.config import parse_pipeline
    from harnessrl.jobs.pipeline import _evaluate_and_serve
    from harnessrl.rewards import load_recipe

    raw = yaml.safe_load(pipeline_run["pipeline_yaml"].read_text())
    raw["data"]["heldout"] = [str(heldout)]
    raw["evaluate"] = {**raw["evaluate"], **evaluate}
    raw["serve"] = {"port": free_port(), "smoke_requests": 2}
    cfg = parse_pipeline(raw)
    summary: dict = {}
    with mlflow.start_run(experiment_id=registry.ensure_experiment("heldout-serve")):
        _evaluate_and_serve(cfg, str(tmp_path), load_recipe(cfg.rewards), pipeline_run["model"]["uri"], summary)
    return summary


def test_heldout_without_labels_at_the_default_field(pipeline_run, moved_labels, tmp_path):
    from harnessrl.cli import heldout_line

    s = _evaluate(pipeline_run, moved_labels, tmp_path)
    ev = s["evaluate"]
    assert ev["steps"] == 0 and ev["gold_top1"] is None and ev["random_top1"] is None
    assert ev["heldout_episodes"] == 4 and ev["heldout_steps"] > 0
    assert "not measured" in heldout_line(ev) and "nan" not in heldout_line(ev)
    assert len(s["served"]) == 2  # the service is still checked over HTTP
    assert all(a["expert"] is None and len(a["scores"]) == len(a["candidates"]) for a in s["served"])


def test_heldout_labels_at_a_configured_field(pipeline_run, moved_labels, tmp_path):
    s = _evaluate(pipeline_run, moved_labels, tmp_path, expert_field="info.behaviour.expert_action")
    ev = s["evaluate"]
    assert ev["steps"] > 0 and 0.0 <= ev["gold_top1"] <= 1.0 and 0.0 < ev["random_top1"] < 1.0
    assert len(s["served"]) == 2 and all(a["expert"] for a in s["served"])
