"""The encoder deployment (`serve.encoder`), over HTTP against real Ray Serve apps: the same
scores as the inline encoder, its LRU counted in /metrics, and an encoder that is not the
model's refused at startup. The encoder-mode app is built by `app_builder`, as a Serve config
file or a RayService builds it."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from conftest import MODEL, free_port

pytestmark = pytest.mark.integration

BODIES = [
    {"agent_id": "a1", "state": {"task": "Find the coin.", "history": [],
                                 "observation": "You are in the kitchen. You see a coin."},
     "candidates": ["take coin", "move north", "inventory"]},
    {"agent_id": "a2", "state": {"task": "Find the coin.",
                                 "history": [{"action": "move north", "observation": "A hallway."}],
                                 "observation": "A hallway. Doors lead east and south."},
     "candidates": ["move east", "move south", "take coin", "look around"]},
    {"agent_id": "a3", "state": "Task: make a meal\nNow: a kitchen with a fridge",
     "candidates": ["open fridge", "cook meal", "eat meal"]},
    {"agent_id": "a4", "state": {"task": "Put the apple away.",
                                 "history": [{"action": "take apple", "observation": "Taken."},
                                             {"action": "move west", "observation": "The pantry."}],
                                 "observation": "The pantry. You see a shelf."},
     "candidates": ["put apple on shelf", "move east", "take apple"]},
]


def _score_all(url: str) -> list[dict]:
    """Concurrently, so that the requests share batches."""
    with httpx.Client(timeout=120) as http, ThreadPoolExecutor(len(BODIES)) as pool:
        results = list(pool.map(lambda b: http.post(f"{url}/v1/score", json=b), BODIES * 2))
    assert all(r.status_code == 200 for r in results), [r.text for r in results if r.status_code != 200]
    return [r.json() for r in results]


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


@pytest.fixture(scope="module")
def inline_answers(pipeline_run):
    from harnessrl.serving import app as serving

    url = serving.start(f"models:/{MODEL}@champion", port=free_port(), reload_every_s=0)
    try:
        model = httpx.get(f"{url}/metrics", timeout=30).text
        assert "harnessrl_encoder_cache" not in model  # inline: no encoder deployment
        return _score_all(url)
    finally:
        serving.stop()


@pytest.fixture(scope="module")
def encoder_url(pipeline_run, inline_answers):
    """Encoder mode, built by app_builder from Serve application args; the critic replica keeps no
    LRU of its own (cache_size 0), so every text goes to the encoder deployment."""
    from ray import serve

    from harnessrl.serving import app as serving

    port = free_port()
    args = {"model": f"{MODEL}@champion", "reload_every_s": 0, "cache_size": 0,
            "encoder": {"replicas": 1, "num_cpus": 0.5, "max_batch_size": 8, "batch_wait_timeout_s": 0.01}}
    application = serving.app_builder(args)
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"enable_access_log": False})
    serve.run(application, name=serving.APP_NAME, route_prefix="/")
    yield f"http://127.0.0.1:{port}"
    serving.stop()


def test_encoder_deployment_scores_like_the_inline_encoder(inline_answers, encoder_url):
    answers = _score_all(encoder_url)
    for inline, remote in zip(inline_answers, answers):
        assert np.allclose(inline["scores"], remote["scores"], atol=1e-5), (inline["scores"], remote["scores"])
        assert (inline["best_index"], inline["fallback"], inline["ood"]) == \
            (remote["best_index"], remote["fallback"], remote["ood"])
        assert inline["model"] == remote["model"]


def test_a_repeated_request_is_an_encoder_cache_hit_in_metrics(encoder_url):
    body = {"state": "Task: count the sheep\nNow: a field with 7 sheep", "candidates": ["count", "sleep"]}

    def scrape() -> tuple[float, float, float]:
        text = httpx.get(f"{encoder_url}/metrics", timeout=30).text
        return (_metric(text, "harnessrl_encoder_cache_hits_total"),
                _metric(text, "harnessrl_encoder_cache_misses_total"),
                _metric(text, 'harnessrl_embedding_cache_misses_total{model="champion"}'))

    hits0, misses0, local0 = scrape()
    assert httpx.post(f"{encoder_url}/v1/score", json=body, timeout=60).status_code == 200
    hits1, misses1, local1 = scrape()
    assert (hits1, misses1) == (hits0, misses0 + 3)  # state and two candidates: new texts, encoded
    assert local1 == local0 + 3  # the critic replica keeps no LRU (cache_size 0): it asked the encoder
    assert httpx.post(f"{encoder_url}/v1/score", json=body, timeout=60).status_code == 200
    hits2, misses2, _ = scrape()
    assert (hits2, misses2) == (hits1 + 3, misses1)  # the same texts: from the encoder's LRU


def test_an_encoder_other_than_the_models_is_refused_at_startup(pipeline_run):
    from harnessrl.errors import ModelError
    from harnessrl.serving import app as serving

    with pytest.raises(ModelError, match=r"encoder mismatch in serve\.encoder.*max_seq_length: 128 vs 64"):
        serving.start(f"models:/{MODEL}@champion", port=free_port(), encoder={"max_seq_length": 64})
