"""IQL: the loss functions on hand-computed numbers, one update step, and an exact one-step bandit."""

from __future__ import annotations

import math
import copy

import pytest
import torch

from harnessrl.algorithms.iql import (
    IQLConfig,
    IQLLearner,
    asymmetric_l2,
    pair_features,
    polyak_update,
    q_loss,
    q_target,
    value_loss,
)


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def T(*xs):
    return torch.tensor(xs, dtype=torch.float32)


# ---- losses -----------------------------------------------------------------------------------
def test_asymmetric_l2_hand_computed():
    # u < 0 weighted by 1 - tau = 0.3, u >= 0 by tau = 0.7: mean(0.3 * 4, 0.7 * 1)
    assert asymmetric_l2(T(-2.0, 1.0), 0.7).item() == pytest.approx(0.95)


def test_asymmetric_l2_zero_residual_counts_as_positive():
    assert asymmetric_l2(T(0.0, 3.0), 0.2).item() == pytest.approx((0.0 + 0.2 * 9.0) / 2)


def test_asymmetric_l2_half_is_half_mse():
    u = T(-1.0, 2.0, -3.0)
    assert asymmetric_l2(u, 0.5).item() == pytest.approx(0.5 * (1 + 4 + 9) / 3)


def test_value_loss_weights_target_above_v_by_tau():
    v = T(0.0)
    above = value_loss(T(1.0), v, 0.9).item()  # target above V: weight tau
    below = value_loss(T(-1.0), v, 0.9).item()  # target below V: weight 1 - tau
    assert above == pytest.approx(0.9)
    assert below == pytest.approx(0.1)


def test_q_target_hand_computed():
    y = q_target(r=T(1.0, -0.5), done=T(0.0, 0.0), v_next=T(2.0, 4.0), gamma=0.5)
    assert y.tolist() == pytest.approx([2.0, 1.5])


def test_q_target_done_ignores_v_next():
    y = q_target(r=T(1.0, 3.0), done=T(1.0, 1.0), v_next=T(100.0, float("-1e6")), gamma=0.99)
    assert y.tolist() == [1.0, 3.0]


def test_q_loss_hand_computed():
    # mse(q1, y) = ((1-0)^2 + (2-4)^2)/2 = 2.5 ; mse(q2, y) = ((0-0)^2 + (5-4)^2)/2 = 0.5
    assert q_loss(T(1.0, 2.0), T(0.0, 5.0), T(0.0, 4.0)).item() == pytest.approx(3.0)


def _linear(value: float) -> torch.nn.Linear:
    layer = torch.nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.fill_(value)
        layer.bias.fill_(value)
    return layer


def test_polyak_half_is_average():
    target, source = _linear(1.0), _linear(3.0)
    polyak_update(target, source, 0.5)
    assert target.weight.tolist() == [[2.0, 2.0]] and target.bias.tolist() == [2.0]
    assert source.weight.tolist() == [[3.0, 3.0]]


def test_polyak_one_copies():
    target, source = _linear(-7.0), _linear(0.25)
    polyak_update(target, source, 1.0)
    assert target.weight.tolist() == [[0.25, 0.25]] and target.bias.tolist() == [0.25]


def test_pair_features_shape_and_content():
    s = T(1.0, -2.0, 3.0).unsqueeze(0)
    a = T(4.0, 5.0, -1.0).unsqueeze(0)
    x = pair_features(s, a)
    assert x.shape == (1, 12)
    assert x[0].tolist() == [1, -2, 3, 4, 5, -1, 4, -10, -3, 3, 7, 4]


# ---- one learner ------------------------------------------------------------------------------
def _batch(n=16, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    s, a, s2 = (torch.randn(n, d, generator=g) for _ in range(3))
    r = torch.randn(n, generator=g)
    done = (torch.rand(n, generator=g) < 0.3).float()
    return s, a, r, s2, done


def test_update_reduces_loss_on_fixed_batch():
    torch.manual_seed(0)
    learner = IQLLearner(IQLConfig(state_dim=6, action_dim=6, hidden_dim=32, lr=3e-3, polyak=0.05))
    batch = _batch()
    first = learner.update(*batch)
    for _ in range(200):
        last = learner.update(*batch)
    assert set(first) == {"loss_q", "loss_v", "td_error", "q_mean", "q_abs_max", "v_mean", "adv_mean", "adv_std"}
    assert last["loss_q"] < 0.25 * first["loss_q"]
    assert last["loss_q"] + last["loss_v"] < first["loss_q"] + first["loss_v"]


def test_target_q_follows_q_by_polyak_rate():
    torch.manual_seed(0)
    rate = 0.1
    learner = IQLLearner(IQLConfig(state_dim=6, action_dim=6, hidden_dim=16, lr=1e-2, polyak=rate))
    batch = _batch()
    for _ in range(3):
        learner.update(*batch)
    old_target = copy.deepcopy(learner.target_q)
    learner.update(*batch)
    q_params = list(learner.core.q.parameters())
    moved = 0
    for t_new, t_old, q in zip(learner.target_q.parameters(), old_target.parameters(), q_params):
        assert torch.allclose(t_new, (1 - rate) * t_old + rate * q, atol=1e-6)
        assert not t_new.requires_grad
        before, after = (t_old - q).norm(), (t_new - q).norm()
        assert after <= before + 1e-7
        moved += int(after < before)
    assert moved > 0
    s, a = batch[0], batch[1]
    with torch.no_grad():
        q_out = learner.core.q.min_q(s, a)
        gap_old = (old_target.min_q(s, a) - q_out).abs().mean()
        gap_new = (learner.target_q.min_q(s, a) - q_out).abs().mean()
    assert gap_new < gap_old


def test_bf16_autocast_tracks_float32_and_keeps_float32_weights():
    """precision: bf16 is opt-in because it is less exact; it must still learn the same thing."""
    batch = _batch()
    runs = {}
    for bf16 in (False, True):
        torch.manual_seed(0)
        learner = IQLLearner(IQLConfig(state_dim=6, action_dim=6, hidden_dim=32, lr=3e-3, polyak=0.05, bf16=bf16))
        first = learner.update(*batch)
        for _ in range(200):
            last = learner.update(*batch)
        runs[bf16] = (first, last, learner)
    (f32_first, f32_last, _), (b_first, b_last, b_learner) = runs[False], runs[True]
    assert b_first["loss_q"] != f32_first["loss_q"]  # autocast really ran in bfloat16
    assert b_first["loss_q"] == pytest.approx(f32_first["loss_q"], rel=0.05)
    assert b_last["loss_q"] < 0.25 * b_first["loss_q"]
    assert abs(b_last["loss_q"] - f32_last["loss_q"]) < 0.1 * f32_first["loss_q"]
    assert all(p.dtype == torch.float32 for p in b_learner.core.parameters())
    assert b_learner.advantage.dtype == torch.float32


def test_one_step_bandit_recovers_rewards_and_expectile():
    torch.manual_seed(0)
    d, k = 8, 8
    g = torch.Generator().manual_seed(1)
    state = torch.randn(d, generator=g)
    actions = torch.randn(3, d, generator=g)
    rewards = T(1.0, 0.0, -1.0)
    s = state.repeat(3 * k, 1)
    a = actions.repeat(k, 1)  # every action logged k times
    r = rewards.repeat(k)
    done = torch.ones(3 * k)
    learner = IQLLearner(IQLConfig(state_dim=d, action_dim=d, hidden_dim=32, expectile=0.9, polyak=0.05, lr=3e-3))
    for _ in range(300):
        learner.update(s, a, r, s, done)
    with torch.no_grad():
        q = learner.core.q.min_q(state.repeat(3, 1), actions)
        v = learner.core.v(state.unsqueeze(0)).item()
    assert q.tolist() == pytest.approx([1.0, 0.0, -1.0], abs=0.1)
    assert 0.0 < v < 1.0
    # the 0.9-expectile m of {1, 0, -1}: 0.9 (1 - m) = 0.1 ((m - 0) + (m + 1))  ->  m = 8/11
    assert v == pytest.approx(8 / 11, abs=0.05)


# ---- candidate-set penalty ----------------------------------------------------------------------
def test_candidate_penalty_hand_computed():
    from harnessrl.algorithms.iql import candidate_penalty

    q_taken = torch.tensor([1.0, 0.0])
    q_cand = torch.tensor([[0.0, 5.0], [math.log(3.0), 0.0]])
    mask = torch.tensor([[True, False], [True, True]])
    # row 0: logsumexp(1, 0) - 1 = log(e + 1) - 1 ; row 1: logsumexp(0, log 3, 0) - 0 = log(5)
    expected = ((math.log(math.e + 1) - 1) + math.log(5.0)) / 2
    assert candidate_penalty(q_cand, mask, q_taken).item() == pytest.approx(expected, rel=1e-6)


def test_candidate_penalty_without_candidates_is_zero():
    from harnessrl.algorithms.iql import candidate_penalty

    q_taken = torch.tensor([2.0, -1.0])
    out = candidate_penalty(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), q_taken)
    assert out.item() == pytest.approx(0.0, abs=1e-7)


def test_penalty_keeps_untaken_candidates_below_taken_action():
    """One state, the logged action always taken (reward 0, terminal); two candidates never taken."""
    torch.manual_seed(0)
    d = 8
    s = torch.randn(1, d).repeat(64, 1)
    a = torch.randn(1, d).repeat(64, 1)
    cand = torch.randn(1, 2, d).repeat(64, 1, 1)
    mask = torch.ones(64, 2, dtype=torch.bool)
    r, done = torch.zeros(64), torch.ones(64)

    def gap(alpha: float) -> float:
        torch.manual_seed(1)
        learner = IQLLearner(IQLConfig(state_dim=d, action_dim=d, hidden_dim=32, lr=3e-3, polyak=0.05, alpha=alpha))
        for _ in range(300):
            m = learner.update(s, a, r, s, done, cand=cand, cand_mask=mask)
        with torch.no_grad():
            q_taken = learner.core.q.min_q(s[:1], a[:1]).item()
            q_cand = learner.core.q.min_q(s[:2], cand[0]).max().item()
        assert "cand_penalty" in m if alpha else "cand_penalty" not in m
        return q_taken - q_cand

    assert gap(alpha=1.0) > 0.5  # untaken candidates pushed clearly below the taken action
