"""The behaviour prior (harnessrl.behaviour_prior): the logs' policy over a step's candidates, cloned
listwise; saved beside a reader critic's weights and loaded with it; the critic ranks by
score + w * log pi_beta when asked to."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from harnessrl.algorithms.reader import ReaderConfig
from harnessrl.encoders import BUILTIN_MINILM

PATHS = {"semantic": False, "tokens": True, "match": True}


def _constructed(n: int = 64) -> list[dict]:
    """Steps where the logged agent takes the candidate the observation names: the match path sees it."""
    items = ["apple", "knife", "coin", "fridge", "lamp", "book", "key", "map"]
    out = []
    for i in range(n):
        want, other = items[i % 8], items[(i * 3 + 1) % 8]
        if other == want:
            other = items[(i + 1) % 8]
        out.append({"segments": [("task", 0, "Tidy the room."), ("observation", 0, f"You see a {want} here.")],
                    "candidates": [f"take {want}", f"take {other}"], "gold": 0})
    return out


def test_examples_put_the_taken_action_first_and_skip_steps_without_alternatives():
    from harnessrl.behaviour_prior import examples

    rows = {"s": [["a"], ["b"], ["c"]], "action": ["go", "look", "open"],
            "cand": [["look", "go", "look"], [], ["open"]]}
    got = examples(rows)
    assert [e["candidates"] for e in got] == [["go", "look"]] and got[0]["gold"] == 0 and got[0]["segments"] == ["a"]


def test_the_prior_learns_the_logs_choice_and_gives_log_probabilities(torch_one_thread):
    from harnessrl.behaviour_prior import log_probabilities, train_listwise

    train, test = _constructed(64), _constructed(80)[64:]
    net, inputs, progress = train_listwise(train, lambda ts: np.zeros((len(ts), 8), np.float32), BUILTIN_MINILM,
                                           PATHS, steps=150, batch=16)
    assert progress["steps"] == 150 and progress["final_loss"] < 0.3, progress
    lp = log_probabilities(net, inputs, [e["segments"] for e in test], [e["candidates"] for e in test])
    for row in lp:
        assert len(row) == 2 and all(x <= 0 for x in row)
        assert sum(math.exp(x) for x in row) == pytest.approx(1.0, abs=1e-5)
    assert np.mean([row[0] > row[1] for row in lp]) >= 0.9


def test_a_reader_critic_saves_and_loads_its_prior_with_equal_log_probabilities(tmp_path, torch_one_thread):
    import torch

    from harnessrl.algorithms.reader import ReaderNetwork
    from harnessrl.behaviour_prior import PRIOR_WEIGHTS
    from harnessrl.heads.reader import ReaderHead, ReaderScorer, _inputs

    cfg = ReaderConfig(semantic=False, tokens=True, dim=16, hidden_dim=16)
    torch.manual_seed(0)
    net, prior = ReaderNetwork(cfg), ReaderNetwork(cfg)
    for p in [*net.parameters(), *prior.parameters()]:
        p.data.normal_(0, 0.3)
    scorer = ReaderScorer(net, _inputs(cfg, BUILTIN_MINILM, None), (prior, _inputs(cfg, BUILTIN_MINILM, None)))
    card = SimpleNamespace(head_config=cfg.to_dict(), identity=SimpleNamespace(model_name=BUILTIN_MINILM))

    bare = tmp_path / "bare"
    bare.mkdir()
    ReaderHead().save(str(bare), ReaderScorer(net, _inputs(cfg, BUILTIN_MINILM, None)))
    assert not (bare / PRIOR_WEIGHTS).exists() and not ReaderHead().load(str(bare), card).has_prior

    ReaderHead().save(str(tmp_path), scorer)
    loaded = ReaderHead().load(str(tmp_path), card)
    assert loaded.has_prior
    states = [SimpleNamespace(segments=[SimpleNamespace(role="task", age=0, text="Reach the goal."),
                                        SimpleNamespace(role="observation", age=0, text=f"You are at row {r}.")])
              for r in (1, 2)]
    cands = [["go east", "go south", "go west"], ["go north"]]
    want = scorer.prior_logprobs(states, cands, None)
    got = loaded.prior_logprobs(states, cands, None)
    assert [len(x) for x in got] == [3, 1] and got[1] == pytest.approx([0.0], abs=1e-6)
    assert np.ptp(want[0]) > 1e-3
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
