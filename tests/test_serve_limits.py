"""Serving many agents: configured limits answered with a clear 4xx, Prometheus metrics at
/metrics, optional blending of the critic's scores with the agent's own log-probabilities, and
the avoid_repeats rule (real Ray Serve on loopback, real model)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import MODEL, free_port

pytestmark = pytest.mark.integration
STATE = {"task": "Find the coin.", "history": [{"action": "move north", "observation": "A kitchen."}],
         "observation": "A kitchen. You see a coin."}
CANDIDATES = ["take coin", "move south", "open fridge"]
MAX_CANDIDATES, MAX_TEXT, WEIGHT, MAX_BYTES = 4, 300, 0.5, 8192


@pytest.fixture(scope="module")
def url(pipeline_run):
    from harnessrl.serving import app as serving

    base = serving.start(f"models:/{MODEL}@champion", port=free_port(), max_candidates=MAX_CANDIDATES,
                         max_text_chars=MAX_TEXT, prior_weight=WEIGHT, max_request_bytes=MAX_BYTES,
                         avoid_repeats=True)  # the service's default; requests may turn it off
    yield base
    serving.stop()


def _score(url: str, candidates, state=STATE) -> httpx.Response:
    return httpx.post(f"{url}/v1/score", json={"agent_id": "a1", "state": state, "candidates": candidates}, timeout=60)


def test_too_many_candidates_is_422_naming_the_limit(url):
    assert _score(url, [f"move {i}" for i in range(MAX_CANDIDATES)]).status_code == 200
    r = _score(url, [f"move {i}" for i in range(MAX_CANDIDATES + 1)])
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert f"{MAX_CANDIDATES + 1} candidates" in detail and f"at most {MAX_CANDIDATES}" in detail
    assert "serve.max_candidates" in detail


def test_too_long_text_is_413_with_a_json_error(url):
    long = "x" * (MAX_TEXT + 1)
    assert _score(url, ["take coin", "y" * MAX_TEXT]).status_code == 200  # at the limit: fine
    r = _score(url, ["take coin", long])
    assert r.status_code == 413 and r.headers["content-type"].startswith("application/json")
    assert r.json()["detail"] == (f"candidates[1] is {MAX_TEXT + 1} characters; this service accepts at most "
                                  f"{MAX_TEXT} per text (serve.max_text_chars)")
    assert _score(url, ["take coin"], state=long).status_code == 413
    deep = {**STATE, "history": [{"action": "look", "observation": long}]}
    r = _score(url, ["take coin"], state=deep)
    assert r.status_code == 413 and r.json()["detail"].startswith("state.history[0].observation is")
    r = httpx.post(f"{url}/v1/select_tool", json={"state": long}, timeout=60)
    assert r.status_code == 413 and "serve.max_text_chars" in r.json()["detail"]
    # every text within its limit, but the body as a whole too large: refused before parsing
    many = {**STATE, "history": [{"action": "look", "observation": "o" * 250} for _ in range(40)]}
    r = _score(url, ["take coin"], state=many)
    assert r.status_code == 413 and r.json()["detail"].startswith("request body is ")
    assert r.json()["detail"].endswith(f"at most {MAX_BYTES} (serve.max_request_bytes)")


def test_prior_blending_ranks_by_score_plus_weighted_logprob(url):
    plain = _score(url, CANDIDATES).json()
    assert plain["blended_scores"] is None and plain["prior_weight"] == 0.0 and plain["prior"] is None
    raw = plain["scores"]
    # the agent is sure it does not want the critic's favourite: the blend picks another candidate
    logprobs = [-50.0 if i == plain["best_index"] else -0.1 * i for i in range(len(CANDIDATES))]
    body = _score(url, [{"text": c, "logprob": lp} for c, lp in zip(CANDIDATES, logprobs)])
    assert body.status_code == 200, body.text
    r = body.json()
    assert r["prior_weight"] == WEIGHT and r["prior"] == "agent"
    assert r["scores"] == pytest.approx(raw, abs=1e-5)  # the critic's own scores stay in the answer
    expected = [s + WEIGHT * lp for s, lp in zip(raw, logprobs)]
    assert r["blended_scores"] == pytest.approx(expected, abs=1e-5)
    assert r["best_index"] == max(range(len(expected)), key=expected.__getitem__) != plain["best_index"]
    # one candidate without a logprob: no blend, the critic alone decides
    mixed = _score(url, [{"text": CANDIDATES[0], "logprob": -1.0}, *CANDIDATES[1:]]).json()
    assert mixed["blended_scores"] is None and mixed["prior_weight"] == 0.0
    assert mixed["best_index"] == plain["best_index"]
    assert _score(url, [{"text": "take coin", "logprob": 0.5}]).status_code == 422  # not a log-probability


def test_a_request_may_set_its_own_prior_weight(url):
    """`prior_weight` in a request overrides the service's (WEIGHT) for that request only: 0 ranks by
    the critic alone, a larger weight blends with it; it must be a finite weight >= 0."""
    plain = _score(url, CANDIDATES).json()
    logprobs = [-50.0 if i == plain["best_index"] else -0.1 * i for i in range(len(CANDIDATES))]
    cands = [{"text": c, "logprob": lp} for c, lp in zip(CANDIDATES, logprobs)]

    def score(**extra):
        r = httpx.post(f"{url}/v1/score", json={"state": STATE, "candidates": cands, **extra}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    off = score(prior_weight=0)
    assert off["blended_scores"] is None and off["prior_weight"] == 0.0 and off["best_index"] == plain["best_index"]
    heavy = score(prior_weight=4.0)
    assert heavy["prior_weight"] == 4.0
    expected = [s + 4.0 * lp for s, lp in zip(plain["scores"], logprobs)]
    assert heavy["blended_scores"] == pytest.approx(expected, abs=1e-4)
    assert heavy["best_index"] == max(range(len(CANDIDATES)), key=heavy["blended_scores"].__getitem__)
    assert heavy["best_index"] != plain["best_index"]
    assert score(prior_weight=None)["prior_weight"] == WEIGHT == score()["prior_weight"]  # null: the service's
    # negative, infinite (a JSON 1e999 overflows to inf: its 422 echoes "inf"), not a number; an infinite logprob
    for field, bad in (("prior_weight", "-0.5"), ("prior_weight", "1e999"), ("prior_weight", '"heavy"'),
                       ("logprob", "-1e999")):
        lp, w = (bad, "1") if field == "logprob" else ("-1", bad)
        body = '{"state": "s", "candidates": [{"text": "a", "logprob": %s}], "prior_weight": %s}' % (lp, w)
        r = httpx.post(f"{url}/v1/score", content=body, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 422 and field in r.text, (field, bad, r.status_code)


def test_avoid_repeats_passes_over_candidates_taken_from_the_same_observation(url):
    def score(candidates, state, **extra):
        r = httpx.post(f"{url}/v1/score", json={"state": state, "candidates": candidates, **extra}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    fav = 1
    obs = STATE["observation"]
    # CANDIDATES[fav] was taken while the agent saw this same observation (the result of the turn before)
    looped = {**STATE, "history": [{"action": "move north", "observation": obs},
                                   {"action": CANDIDATES[fav], "observation": obs}]}
    # the agent's own prior makes the repeat the favourite by far (blend: score + WEIGHT * logprob)
    cands = [{"text": c, "logprob": 0.0 if i == fav else -50.0} for i, c in enumerate(CANDIDATES)]
    off = score(cands, looped, avoid_repeats=False)
    assert off["repeats"] is None and off["best_index"] == fav
    on = score(cands, looped)  # null: the service's setting (on)
    assert on["repeats"] == [fav] and on["scores"] == pytest.approx(off["scores"], abs=1e-5)
    allowed = [i for i in range(len(CANDIDATES)) if i != fav]
    assert on["best_index"] == max(allowed, key=on["blended_scores"].__getitem__) != fav
    # without a blend the critic's scores rank, over the same candidates
    plain = score(CANDIDATES, looped)
    assert plain["repeats"] == [fav] and plain["best_index"] == max(allowed, key=plain["scores"].__getitem__)
    # every candidate a repeat: the rule gives way
    alone = score([CANDIDATES[fav]], looped, avoid_repeats=True)
    assert alone["repeats"] == [0] and alone["best_index"] == 0
    # taken before, but from another observation: not a repeat
    elsewhere = {**STATE, "history": [{"action": CANDIDATES[fav], "observation": "A hall."}]}
    assert score(CANDIDATES, elsewhere)["repeats"] == []
    # a rendered-text state carries no history: nothing is known to repeat
    assert score(CANDIDATES, "Task: find the coin.\nNow: A kitchen.")["repeats"] == []


def _samples(url: str) -> dict[tuple, float]:
    r = httpx.get(f"{url}/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def _get(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_requests_batches_cache_and_decisions(url):
    before = _samples(url)
    for i in range(3):
        assert _score(url, ["take coin", f"move {i}"]).status_code == 200
    assert _score(url, [f"c{i}" for i in range(MAX_CANDIDATES + 1)]).status_code == 422
    assert _score(url, ["z" * (MAX_TEXT + 1)]).status_code == 413
    after = _samples(url)

    def delta(name, **labels):
        return _get(after, name, **labels) - _get(before, name, **labels)

    assert delta("harnessrl_requests_total", endpoint="/v1/score", status="200") == 3
    assert delta("harnessrl_requests_total", endpoint="/v1/score", status="422") == 1
    assert delta("harnessrl_requests_total", endpoint="/v1/score", status="413") == 1
    assert delta("harnessrl_request_latency_seconds_count", endpoint="/v1/score") == 5
    assert delta("harnessrl_batch_size_count", endpoint="/v1/score") >= 1
    assert delta("harnessrl_batch_size_sum", endpoint="/v1/score") == 3  # rejected requests never reach a batch
    assert delta("harnessrl_decisions_total", model="champion") == 3
    # "take coin" and the state were seen before: the cache served them
    assert delta("harnessrl_embedding_cache_hits_total", model="champion") > 0
    assert 0 < _get(after, "harnessrl_embedding_cache_hit_ratio", model="champion") <= 1
    assert _get(after, "harnessrl_embedding_cache_entries", model="champion") > 0
    names = {n for n, _ in after}
    assert {"harnessrl_fallbacks_total", "harnessrl_ood_decisions_total", "harnessrl_replica_info"} <= names
    # the scrape itself is counted on the next one
    assert _get(_samples(url), "harnessrl_requests_total", endpoint="/metrics", status="200") >= 2


def test_the_same_series_reach_rays_metrics_agent(url):
    """For totals over replicas: Ray's metrics agent exports every replica's series."""
    import time

    import ray

    for i in range(2):
        assert _score(url, ["take coin", f"look {i}"]).status_code == 200
    served = _get(_samples(url), "harnessrl_requests_total", endpoint="/v1/score", status="200")
    port = next(n["MetricsExportPort"] for n in ray.nodes() if n["Alive"])
    deadline, total = time.time() + 90, 0.0
    while time.time() < deadline:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        total = sum(s.value for f in text_string_to_metric_families(text)
                    for s in f.samples if s.name == "ray_harnessrl_requests_total"
                    and s.labels.get("endpoint") == "/v1/score" and s.labels.get("status") == "200")
        if total >= served:
            break
        time.sleep(3)
    assert total >= served > 0
