"""The whole pipeline on a slice of the sample, on the real stack, then the HTTP API and the CLI
against the model it registered: local Ray, MiniLM, Ray Train (2 DDP workers), MLflow SQLite
registry, Ray Serve on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from conftest import MODEL, TEST_EPISODES, TRAIN_EPISODES, free_port

pytestmark = pytest.mark.integration


def test_pipeline_end_to_end(pipeline_run):
    run = pipeline_run
    assert run["ingest"]["records_in"] == TRAIN_EPISODES == run["ingest"]["episodes"]
    assert run["transitions"]["transitions"] == run["ingest"]["steps"]
    assert run["encode"]["rows"] == run["transitions"]["transitions"]
    assert run["encode"]["texts_distinct"] < run["encode"]["texts_total"]
    assert run["train"]["steps"] == 300 and np.isfinite(run["train"]["metrics"]["loss_q"])
    assert run["model"]["name"] == MODEL and run["model"]["version"] == "1"
    ev = run["evaluate"]
    assert ev["heldout_episodes"] == TEST_EPISODES and 0 < ev["steps"] <= 200
    assert 0.0 <= ev["gold_top1"] <= 1.0 and 0.0 < ev["random_top1"] < 1.0
    served = run["served"]
    assert len(served) == 3
    for answer in served:  # answered over HTTP by the registered version
        assert answer["model"] == {"name": MODEL, "version": "1"}
        assert len(answer["scores"]) == len(answer["candidates"])
        assert answer["best_index"] == int(np.argmax(answer["scores"]))
        assert len(answer["decision_id"]) == 32


def test_registry_carries_lineage(pipeline_run):
    run = pipeline_run
    from harnessrl import registry

    client = registry.client()
    version = client.get_model_version_by_alias(MODEL, "champion")
    tags = version.tags
    for key in ("digest.raw", "digest.transitions", "digest.encoded", "reward_recipe_hash", "encoder",
                "train_config", "git_sha", "mlflow_run_id", "fallback_threshold"):
        assert tags.get(key), key
    assert tags["digest.encoded"] == run["digests"]["encoded"]
    assert json.loads(tags["encoder"])["model_name"] == "builtin:all-MiniLM-L6-v2"
    history = client.get_metric_history(run["model"]["run_id"], "train/loss_q")
    assert [m.step for m in history] == [50, 100, 150, 200, 250, 300]
    inputs = client.get_run(run["model"]["run_id"]).inputs.dataset_inputs
    assert {d.dataset.name for d in inputs} >= {"raw", "transitions", "encoded"}


@pytest.fixture(scope="module")
def service(pipeline_run):
    from harnessrl.serving import app as serving

    url = serving.start(f"models:/{MODEL}@champion", port=free_port())
    yield url
    serving.stop()


def _held_out(run) -> tuple[dict[str, bool], float]:
    """(state text -> in a held-out task group only, the share held out): the train job's split of the
    run (train.validation_fraction unset: 0.1 of the task groups, seed 0), recomputed."""
    import pyarrow.dataset as pads

    from harnessrl.metrics import split_by_group

    rows = pads.dataset(f"{run['output_dir']}/transitions", format="parquet").to_table(
        columns=["group_id", "state_text"]).to_pylist()
    groups = sorted({str(r["group_id"]) for r in rows})
    assert len(groups) >= 10  # so the train job held some out
    held = {g for g, h in zip(groups, split_by_group(groups, 0.1, 0)[1]) if h}
    seen = {r["state_text"] for r in rows if str(r["group_id"]) not in held}
    return {r["state_text"]: r["state_text"] not in seen for r in rows}, len(held) / len(groups)


def _training_states(run) -> list[str]:
    return [text for text, held_only in _held_out(run)[0].items() if not held_only]


def test_http_score_matches_python_api(service, pipeline_run):
    from harnessrl import Critic

    state = {"task": "Find the coin and take it.",
             "history": [{"action": "move north", "observation": "You are in the kitchen. You see a coin."}],
             "observation": "You are in the kitchen. You see a coin."}
    candidates = ["take coin", "move south", "inventory"]
    r = httpx.post(f"{service}/v1/score", json={"agent_id": "a1", "state": state, "candidates": candidates}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    critic = Critic.load(f"models:/{MODEL}@champion")
    local = critic.score(state, candidates)
    assert np.allclose(body["scores"], local, atol=1e-4)
    # the library's avoid_repeats: the favourite, once taken from this observation, is passed over
    fav = int(np.argmax(local))
    looped = {**state, "history": [*state["history"], {"action": candidates[fav], "observation": state["observation"]}]}
    d = critic.decide(looped, candidates, avoid_repeats=True)
    assert d.repeats == [fav] and d.best_index != fav
    assert d.best_index == max((i for i in range(3) if i != fav), key=d.scores.__getitem__)
    assert critic.decide(looped, candidates).repeats is None
    assert body["model"]["name"] == MODEL and isinstance(body["fallback"], bool)
    trained = next(iter(_training_states(pipeline_run)))
    near = httpx.post(f"{service}/v1/score", json={"state": trained, "candidates": candidates}, timeout=60).json()
    assert near["ood"] is False  # a state the model was trained on
    far = httpx.post(f"{service}/v1/score", json={"state": "Quarterly corporate tax filing deadlines in Delaware.",
                                                   "candidates": candidates}, timeout=60).json()
    assert far["ood"] is True


def test_http_concurrent_requests_are_batched_and_answered(service):
    payloads = [{"agent_id": f"a{i}", "state": f"Task: t{i}\nNow: room {i}", "candidates": ["go east", f"take item {i}"]}
                for i in range(24)]
    with httpx.Client(timeout=120) as http, ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: http.post(f"{service}/v1/score", json=p), payloads))
    assert all(r.status_code == 200 for r in results)
    assert len({r.json()["decision_id"] for r in results}) == len(payloads)


@pytest.mark.parametrize("payload", [
    {"state": "s", "candidates": []},
    {"state": "s", "candidates": [f"c{i}" for i in range(257)]},
    {"candidates": ["a"]},
    {"state": {"task": "t", "unknown": 1}, "candidates": ["a"]},
    {"state": "s", "candidates": "not a list"},
])
def test_http_rejects_bad_requests_with_422(service, payload):
    r = httpx.post(f"{service}/v1/score", json=payload, timeout=30)
    assert r.status_code == 422


def test_http_model_and_health(service):
    assert httpx.get(f"{service}/healthz", timeout=10).json() == {"status": "ok"}
    info = httpx.get(f"{service}/v1/model", timeout=10).json()
    assert info["model"] == {"name": MODEL, "version": "1"}
    assert info["encoder"]["dim"] == 384 and info["fallback_threshold"] is not None
    assert set(info["embedding_cache"]) == {"hits", "misses", "size"} and info["embedding_cache"]["misses"] > 0
    assert info["lineage"]["dataset_digests"]["encoded"].startswith("sha256:")


def test_the_ood_reference_leaves_out_the_held_out_states_its_threshold_is_set_on(pipeline_run):
    """The threshold is a high quantile of held-out task groups' distances to the reference: were those
    states in the reference, each would find itself (distance 0), the threshold would fall to its floor,
    and most states of new tasks from the same distribution would be flagged."""
    from harnessrl import Critic
    from harnessrl.metrics import nearest_cosine_distance
    from harnessrl.ood import MIN_THRESHOLD

    critic = Critic.load(f"models:/{MODEL}@champion")
    reference, threshold = critic.ood_reference
    states, share = _held_out(pipeline_run)
    held_only = [text for text, h in states.items() if h]
    trained = [text for text, h in states.items() if not h]
    assert held_only and 0 < share < 0.5
    far = nearest_cosine_distance(critic.encode(held_only), reference)
    near = nearest_cosine_distance(critic.encode(trained[:200]), reference)
    assert far.min() > 1e-3, far.min()  # none of them is in the reference (float16: itself is ~1e-4 away)
    assert np.median(near) < 1e-3  # the training states are (the reference keeps them all at this size)
    assert threshold > MIN_THRESHOLD and np.mean(far > threshold) <= 0.05


def test_training_logs_critic_and_tool_head_metrics(pipeline_run):
    from harnessrl import registry

    client = registry.client()
    run_id = pipeline_run["model"]["run_id"]
    for key in ("td_error", "q_abs_max", "adv_std", "cand_penalty", "tool_policy_entropy", "tool_actor_loss",
                "steps_per_s"):
        history = client.get_metric_history(run_id, f"train/{key}")
        assert len(history) == 6 and all(np.isfinite(m.value) for m in history), key
    entropy = [m.value for m in client.get_metric_history(run_id, "train/tool_policy_entropy")]
    assert 0 < entropy[-1] < entropy[0]  # the tool policy sharpens from near-uniform


def test_http_select_tool(service):
    info = httpx.get(f"{service}/v1/model", timeout=10).json()
    assert {"take", "move", "open"} <= set(info["tools"])  # game verbs (render.tool_from: first_word)
    state = {"task": "Find the coin and take it.", "history": [], "observation": "You see a coin."}
    r = httpx.post(f"{service}/v1/select_tool", json={"agent_id": "a1", "state": state}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tools"] == info["tools"] and len(body["probabilities"]) == len(body["tools"])
    assert abs(sum(body["probabilities"]) - 1) < 1e-4
    assert body["choice"] == body["tools"][int(np.argmax(body["probabilities"]))]


def test_cli_score_uses_registered_model(pipeline_run):
    out = subprocess.run(
        [sys.executable, "-m", "harnessrl.cli", "score", "--model", f"{MODEL}@champion",
         "--state", "Task: find the coin\nNow: You are in the kitchen.", "--candidate", "take coin",
         "--candidate", "move west"],
        capture_output=True, text=True, env=os.environ.copy(), timeout=300,
    )
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert len(body["scores"]) == 2 and body["best"] in ("take coin", "move west")
    # a frozen critic holds no behaviour prior: nothing blended at the default weight
    assert body["blended_scores"] is None and body["prior_weight"] == 0.0
    assert body["model"] == {"name": MODEL, "version": "1"}
