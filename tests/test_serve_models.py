"""Champion/challenger routing by agent and switching to a new version when the alias moves,
under load, without a failed request (real registry, real Ray Serve)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from conftest import MODEL, free_port
from harnessrl.serving.models import routes_to_challenger

STATE = {"task": "Find the coin.", "history": [], "observation": "You are in the kitchen. You see a coin."}


def test_routing_is_stable_and_proportional():
    ids = [f"agent-{i}" for i in range(2000)]
    assert not any(routes_to_challenger(a, 0.0) for a in ids) and all(routes_to_challenger(a, 1.0) for a in ids)
    share = sum(routes_to_challenger(a, 0.25) for a in ids) / len(ids)
    assert 0.2 < share < 0.3
    assert [routes_to_challenger(a, 0.25) for a in ids] == [routes_to_challenger(a, 0.25) for a in ids]
    assert not routes_to_challenger(None, 0.5)


@pytest.fixture(scope="module")
def two_versions(pipeline_run):
    """Version 2 of the test model (same weights), aliased `challenger`; champion stays on 1."""
    import mlflow

    from harnessrl import registry

    with mlflow.start_run(experiment_id=registry.ensure_experiment("serve-models-test")):
        v2 = registry.register_critic(f"{pipeline_run['output_dir']}/model", MODEL, "challenger", {"test": "v2"})
    yield pipeline_run["model"]["version"], v2
    registry.client().set_registered_model_alias(MODEL, "champion", pipeline_run["model"]["version"])


@pytest.mark.integration
def test_challenger_share_and_alias_switch_under_load(two_versions):
    from harnessrl import registry
    from harnessrl.serving import app as serving

    v1, v2 = two_versions
    url = serving.start(f"models:/{MODEL}@champion", port=free_port(), challenger_uri=f"models:/{MODEL}@challenger",
                        challenger_share=0.5, reload_every_s=1.0)
    try:
        with httpx.Client(timeout=60) as http:
            info = http.get(f"{url}/v1/model").json()
            assert info["model"]["version"] == v1 and info["challenger"]["version"] == v2
            for i in range(16):
                agent = f"agent-{i}"
                body = http.post(f"{url}/v1/score", json={"agent_id": agent, "state": STATE,
                                                           "candidates": ["take coin", "move west"]}).json()
                assert body["model"]["version"] == (v2 if routes_to_challenger(agent, 0.5) else v1)

            codes: list[int] = []
            versions: list[str] = []
            stop = threading.Event()

            def load():  # a champion-routed agent scoring continuously, bounded in count
                agent = next(f"agent-{i}" for i in range(100) if not routes_to_challenger(f"agent-{i}", 0.5))
                with httpx.Client(timeout=60) as c:
                    for _ in range(400):
                        if stop.is_set():
                            break
                        r = c.post(f"{url}/v1/score", json={"agent_id": agent, "state": STATE,
                                                             "candidates": ["take coin", "move west"]})
                        codes.append(r.status_code)
                        if r.status_code == 200:
                            versions.append(r.json()["model"]["version"])

            workers = [threading.Thread(target=load) for _ in range(3)]
            for w in workers:
                w.start()
            time.sleep(2)
            registry.client().set_registered_model_alias(MODEL, "champion", v2)
            deadline = time.time() + 120
            while time.time() < deadline and (not versions or versions[-1] != v2):
                time.sleep(0.5)
            time.sleep(1)
            stop.set()
            for w in workers:
                w.join(timeout=120)
        assert codes and set(codes) == {200}, codes
        assert versions[0] == v1 and versions[-1] == v2
        assert http_version(url) == v2
    finally:
        serving.stop()


def http_version(url: str) -> str:
    return httpx.get(f"{url}/v1/model", timeout=30).json()["model"]["version"]
