"""History features and tool names: hand-computed values, and identical inputs in training
(transitions stage) and serving (the critic rebuilding turns from a request)."""

from __future__ import annotations

import math

import pytest
import torch

from harnessrl.algorithms.iql import IQLConfig, IQLNetwork
from harnessrl.critic import best_allowed
from harnessrl.features import (FEATURE_NAMES, OTHER_TOOL, action_features, features_for, repeats_here, tool_ids,
                                tool_vocabulary)
from harnessrl.config import RenderConfig
from harnessrl.render import Renderer, Turn
from harnessrl.rewards import RewardRecipe
from harnessrl.tool_naming import tool_name
from harnessrl.transitions import episode_transitions, untaken_candidates

L = math.log1p


@pytest.mark.parametrize("action, mode, tool", [
    ("search({\"q\": \"x\"})", "calls", "search"),
    ("fs.read_file({})", "calls", "fs.read_file"),
    ("The answer is 4.", "calls", "answer"),
    ("take coin", "first_word", "take"),
    ("  Open door", "first_word", "open"),
    ("", "first_word", "answer"),
])
def test_tool_name(action, mode, tool):
    assert tool_name(action, mode) == tool


def test_action_features_by_hand():
    # obs before each action: a1 <- "" (unknown), a2 <- "r1", a1 <- "r2", a2 <- "r1"
    history = [Turn("go north", "r1"), Turn("go south", "r2"), Turn("go north", "r1"), Turn("look", "r1")]
    f = action_features(history, "r1", "go south", tool_from="first_word")
    # go south taken once, from "r1" (the result before it) which is the current observation
    # results r1, r2, r1, r1: the last new one came at step 2, so 4 - 2 = 2 steps since
    # tool "go" used 3 times
    assert f == pytest.approx([L(1), L(1), L(2), L(4), L(3)])
    f = action_features(history, "r9", "go north", tool_from="first_word")
    assert f == pytest.approx([L(2), L(0), L(2), L(4), L(3)])


def test_repeats_here_are_the_candidates_taken_from_this_observation():
    history = [Turn("go north", "r1"), Turn("go south", "r2"), Turn("go north", "r1"), Turn("look", "r1")]
    # seen "r1" before: go south (after turn 1) and look (after turn 3); go north only from "" and "r2"
    assert repeats_here(history, "r1", ["go north", "go south", "look", "eat"]) == [1, 2]
    assert repeats_here(history, " r2 ", ["go north", "go south", "look"]) == [0]  # compared stripped
    assert repeats_here(history, "", ["go north", "look"]) == [0]  # the first action: taken from nothing seen
    assert repeats_here([], "r1", ["go north"]) == []
    # the same count the times_taken_here feature reads (index 1)
    for i, cand in enumerate(["go north", "go south", "look", "eat"]):
        taken_here = action_features(history, "r1", cand, "first_word")[1] > 0
        assert taken_here == (i in repeats_here(history, "r1", ["go north", "go south", "look", "eat"]))


def test_best_allowed_passes_over_avoided_unless_nothing_is_left():
    assert best_allowed([0.1, 0.9, 0.5]) == 1
    assert best_allowed([0.1, 0.9, 0.5], [1]) == 2
    assert best_allowed([0.1, 0.9, 0.5], [1, 2]) == 0
    assert best_allowed([0.1, 0.9, 0.5], [0, 1, 2]) == 1  # all avoided: the best of all
    assert best_allowed([0.3, 0.3], [5]) == 0  # ties: the first; unknown indices ignored


def test_no_history_is_all_zero():
    assert action_features([], "anything", "x") == [0.0] * len(FEATURE_NAMES)


def test_tool_vocabulary_caps_with_other_slot():
    counts = {"take": 5, "open": 5, "move": 9, "look": 1, "read": 2}
    assert tool_vocabulary(counts, 10) == ["move", "open", "take", "read", "look"]
    vocab = tool_vocabulary(counts, 3)
    assert vocab == ["move", "open", OTHER_TOOL]
    assert tool_ids(vocab, ["open", "look", "move"]) == [1, 2, 0]


def test_training_and_serving_compute_identical_features():
    obs = ["start", "hall", "hall", "kitchen", "kitchen"]
    actions = ["go east", "look", "go east", "take pan", "look"]
    steps = [{"step_idx": i, "obs_text": obs[i], "action_text": a, "terminated": i == 4,
              "candidates": ["go east", "look", "take pan", "go west"]} for i, a in enumerate(actions)]
    episode = {"episode_id": "e", "task_text": "cook", "outcome_success": True, "terminated": True}
    render = Renderer(RenderConfig(window=2, max_chars=500, tool_from="first_word"))
    rows = episode_transitions(episode, steps, RewardRecipe(), render)
    for t, row in enumerate(rows):
        request = {"task": "cook", "observation": obs[t],
                   "history": [{"action": actions[i], "observation": obs[i + 1]} for i in range(t)]}
        parsed = render.parse(request)
        assert parsed.text == row["state_text"]
        cands = untaken_candidates(row["action_text"], row["candidates"])
        served = features_for(parsed.history, parsed.observation, [row["action_text"], *cands], "first_word")
        assert served[0] == row["features"]  # same function, same inputs: exactly equal
        assert served[1:] == row["candidate_features"]
        assert row["tool"] == tool_name(row["action_text"], "first_word")
    assert rows[2]["features"][0] == pytest.approx(L(1))  # "go east" was taken once before step 2


def test_feature_standardisation_is_stored_in_the_network():
    cfg = IQLConfig(state_dim=3, action_dim=3, hidden_dim=8, feature_dim=2)
    torch.manual_seed(0)
    net = IQLNetwork(cfg)
    plain = IQLNetwork(cfg)
    plain.load_state_dict(net.state_dict())
    mean, std = torch.tensor([1.0, -2.0]), torch.tensor([2.0, 0.0])  # a constant column stays unscaled
    net.q.set_feature_stats(mean, std)
    s, a, f = torch.randn(5, 3), torch.randn(5, 3), torch.randn(5, 2)
    expected = plain.q.min_q(s, a, (f - mean) / torch.tensor([2.0, 1.0]))
    assert torch.allclose(net.q.min_q(s, a, f), expected)
    assert "q.feat_mean" in net.state_dict() and "q.feat_std" in net.state_dict()


def test_unequal_state_and_action_dims_concatenate():
    cfg = IQLConfig(state_dim=6, action_dim=4, hidden_dim=8, feature_dim=1)
    net = IQLNetwork(cfg)
    q1, q2, v, v2, qc = net(torch.randn(3, 6), torch.randn(3, 4), torch.randn(3, 6), torch.randn(3, 1),
                            torch.randn(3, 2, 4), torch.randn(3, 2, 1))
    assert q1.shape == q2.shape == v.shape == v2.shape == (3,) and qc[0].shape == (3, 2)
    assert net.q.q1[0].in_features == 6 + 4 + 1
