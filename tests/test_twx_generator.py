"""The TextWorldExpress example corpus: the committed sample is well formed, and it rebuilds bit for bit.

The sample checks run everywhere; only the regeneration needs `textworld_express` and Java.
"""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import pytest

from conftest import twx_unavailable

DATA = Path(__file__).resolve().parents[1] / "platform" / "harnessrl" / "examples" / "data"
FILES = {"train": DATA / "twx_train.jsonl.gz", "test": DATA / "twx_test.jsonl.gz"}

# Information actions whose content never changes in an episode; the reset observation is the
# room description, so "look around" counts as taken from the start.
INFO_ACTIONS = {"look around", "task", "read map", "read cookbook", "read math problem"}
FAMILIES = {"cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "peckingorder", "simonsays"}


def _lines(path: Path) -> list[bytes]:
    with gzip.open(path, "rb") as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def sample() -> dict[str, list[dict]]:
    return {fold: [json.loads(line) for line in _lines(path)] for fold, path in FILES.items()}


def _check_episode(e: dict, fold: str) -> None:
    assert set(e) == {
        "episode_id", "task_id", "group_id", "task", "agent_name", "steps", "outcome", "end_reason", "metadata",
    }, e.keys()
    m = e["metadata"]
    assert set(m) == {"family", "fold", "seed", "attempt", "agent", "generator", "generator_version"}
    assert m["fold"] == fold and m["family"] in FAMILIES
    assert m["agent"] in {"careful", "mistaken", "flailing"}
    assert m["generator"] == "harnessrl.examples.twx" and m["generator_version"] == 1
    assert (0 <= m["seed"] < 1000) if fold == "train" else (m["seed"] >= 20000)
    group = f"{m['family']}/{fold}/{m['seed']}"
    assert e["task_id"] == e["group_id"] == group
    assert e["episode_id"] == f"twx-{m['family']}-{fold}-{m['seed']}-a{m['attempt']}"
    assert isinstance(e["task"], str) and e["task"]
    assert e["agent_name"] == "twx-behaviour-mix"
    assert set(e["outcome"]) == {"success", "score"} and isinstance(e["outcome"]["success"], bool)
    assert e["end_reason"] in {"agent_stop", "max_steps"}

    steps = e["steps"]
    assert steps
    taken = {"look around"}
    for i, s in enumerate(steps):
        last = i == len(steps) - 1
        assert set(s) == {"observation", "action", "reward", "candidates", "info", "done"} | (
            {"result"} if last else set()
        ), (e["episode_id"], i, s.keys())
        assert isinstance(s["observation"], str)
        assert isinstance(s["reward"], (int, float))
        assert s["candidates"] and all(isinstance(c, str) for c in s["candidates"])
        assert s["action"] in s["candidates"]
        info = s["info"]
        assert set(info) == {"expert_action", "behaviour", "score"}
        assert info["behaviour"] in {"expert", "mistake", "random"}
        expert = info["expert_action"]
        if expert is not None:
            assert expert in s["candidates"], (e["episode_id"], i, expert)
            assert not (expert in INFO_ACTIONS and expert in taken), (e["episode_id"], i, expert)
        if info["behaviour"] == "expert":
            assert s["action"] == expert
        if s["action"] in INFO_ACTIONS:
            taken.add(s["action"])
        assert s["done"] is (last and e["end_reason"] == "agent_stop")
    # Rewards are score deltas, so they add up to the final score.
    assert sum(s["reward"] for s in steps) == pytest.approx(e["outcome"]["score"], abs=1e-4)
    assert steps[-1]["info"]["score"] == e["outcome"]["score"]
    if e["outcome"]["success"]:
        assert e["end_reason"] == "agent_stop"


def test_committed_sample_is_well_formed(sample):
    for fold, episodes in sample.items():
        assert episodes, fold
        for e in episodes:
            _check_episode(e, fold)
    ids = [e["episode_id"] for eps in sample.values() for e in eps]
    assert len(ids) == len(set(ids))


def test_committed_sample_has_the_spread_evaluation_needs(sample):
    episodes = [e for eps in sample.values() for e in eps]
    outcomes = {e["outcome"]["success"] for e in episodes}
    assert outcomes == {True, False}
    assert len({e["metadata"]["family"] for e in episodes}) >= 6
    assert {e["metadata"]["fold"] for e in episodes} == {"train", "test"}
    assert {e["end_reason"] for e in episodes} == {"agent_stop", "max_steps"}
    for fold, eps in sample.items():
        attempts = collections.Counter(e["group_id"] for e in eps)
        assert max(attempts.values()) >= 2, f"no task with several attempts in {fold}"
    steps = [s for e in episodes for s in e["steps"]]
    success = sum(e["outcome"]["success"] for e in episodes) / len(episodes)
    equal = sum(s["action"] == s["info"]["expert_action"] for s in steps) / len(steps)
    labelled = sum(s["info"]["expert_action"] is not None for s in steps) / len(steps)
    assert 0.25 <= success <= 0.75, success
    assert equal < 0.6, equal
    assert labelled > 0.9, labelled
    assert {s["info"]["behaviour"] for s in steps} == {"expert", "mistake", "random"}


@pytest.mark.skipif(twx_unavailable() is not None, reason=str(twx_unavailable()))
def test_first_episodes_rebuild_bit_for_bit(tmp_path):
    from harnessrl.examples.twx import generate

    k = 3
    summary = generate(tmp_path, limit=k)
    for fold, committed in FILES.items():
        rebuilt = _lines(tmp_path / committed.name)
        assert len(rebuilt) == k
        assert rebuilt == _lines(committed)[:k], f"{fold}: regenerated episodes differ from the committed sample"
        assert summary[fold]["episodes"] == k
    with open(tmp_path / "twx_train.jsonl.gz", "rb") as f:
        header = f.read(10)
    assert header[4:8] == b"\0\0\0\0", "gzip mtime must be 0"
    assert header[3] & 0x08 == 0, "gzip header must not carry a file name"
