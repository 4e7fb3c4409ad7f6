"""Discrete tool-selection head: the losses on hand-computed numbers, and discrete IQL / CQL with
the AWR actor on a small exact MDP whose in-support optimum and IQL fixed point are computed here."""

from __future__ import annotations

import math

import pytest
import torch

from harnessrl.algorithms.discrete import (
    DiscreteConfig,
    DiscreteLearner,
    awr_loss,
    awr_weights,
    cql_penalty,
    cql_target,
    expected_q,
    expectile_value_loss,
    masked_max,
    policy_entropy,
    q_target,
)


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def T(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def B(*rows):
    return torch.tensor(rows, dtype=torch.bool)


# ---- losses -----------------------------------------------------------------------------------
def test_expectile_value_loss_reads_the_taken_action():
    target_q = torch.tensor([[1.0, 5.0], [3.0, -2.0]])
    # taken: 5 and 3; u = [5 - 3, 3 - 5] = [2, -2] -> (0.8 * 4 + 0.2 * 4) / 2
    assert expectile_value_loss(target_q, torch.tensor([1, 0]), T(3.0, 5.0), 0.8).item() == pytest.approx(2.0)
    # u = [2, -2] weighted 0.9 and 0.1 -> (0.9 * 4 + 0.1 * 4) / 2; the untaken entries never count
    target_q[0, 0], target_q[1, 1] = 1e6, -1e6
    assert expectile_value_loss(target_q, torch.tensor([1, 0]), T(3.0, 5.0), 0.9).item() == pytest.approx(2.0)
    # u = [1, -1]: (0.9 * 1 + 0.1 * 1) / 2
    assert expectile_value_loss(target_q, torch.tensor([1, 0]), T(4.0, 4.0), 0.9).item() == pytest.approx(0.5)


def test_iql_td_target_with_done():
    y = q_target(r=T(1.0, 2.0), done=T(0.0, 1.0), v_next=T(3.0, 100.0), gamma=0.5)
    assert y.tolist() == [2.5, 2.0]


def test_masked_max_hand_computed():
    q = torch.tensor([[1.0, 5.0, 2.0], [1.0, 5.0, 2.0], [-3.0, -4.0, -5.0]])
    assert masked_max(q, None).tolist() == [5.0, 5.0, -3.0]
    # row 1: tool 1 unavailable -> 2 ; row 2: no tool available (terminal s') -> 0, not -inf
    assert masked_max(q, B([True, True, True], [True, False, True], [False, False, False])).tolist() == [5.0, 2.0, 0.0]


def test_cql_target_max_over_available_tools_and_done():
    q_next = torch.tensor([[1.0, 4.0], [1.0, 4.0], [7.0, 9.0], [0.0, 0.0]])
    r, done = T(1.0, 1.0, -1.0, 0.5), T(0.0, 0.0, 1.0, 1.0)
    next_mask = B([True, True], [True, False], [True, True], [False, False])
    y = cql_target(r, done, q_next, 0.5, next_mask)
    # 1 + 0.5 * 4 ; 1 + 0.5 * 1 (tool 1 unavailable) ; done: r ; done with nothing available: r, no NaN
    assert y.tolist() == [3.0, 1.5, -1.0, 0.5]
    assert cql_target(r, done, q_next, 0.5).tolist() == [3.0, 3.0, -1.0, 0.5]


def test_cql_penalty_hand_computed_with_and_without_mask():
    q = torch.tensor([[0.0, math.log(3.0), 0.0], [1.0, 1.0, 1.0]])
    a = torch.tensor([0, 1])
    # row 0: log(1 + 3 + 1) - 0 ; row 1: log(3 e) - 1 = log 3
    assert cql_penalty(q, a).item() == pytest.approx((math.log(5.0) + math.log(3.0)) / 2, rel=1e-6)
    # row 0 without tool 1: log(1 + 1) ; row 1 without tool 2: log(2 e) - 1 = log 2
    mask = B([True, False, True], [True, True, False])
    assert cql_penalty(q, a, mask).item() == pytest.approx(math.log(2.0), rel=1e-6)
    # only the taken tool available: nothing to push down
    only = B([True, False, False], [False, True, False])
    assert cql_penalty(q, a, only).item() == pytest.approx(0.0, abs=1e-6)


def test_awr_weights_clipped_at_max():
    w = awr_weights(T(0.0, 1.0, -1.0, 50.0), beta=2.0, max_weight=5.0)
    assert w.tolist() == pytest.approx([1.0, 5.0, math.exp(-2.0), 5.0])  # exp(2) = 7.39 and exp(100) clip to 5


def test_awr_loss_is_weighted_nll_with_detached_weights():
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]], requires_grad=True)
    w = torch.tensor([2.0, 5.0], requires_grad=True)
    # pi(a=0 | row 0) = 1/4, pi(a=1 | row 1) = 1/2 -> -(2 log 1/4 + 5 log 1/2) / 2
    loss = awr_loss(logits, torch.tensor([0, 1]), w)
    assert loss.item() == pytest.approx((2 * math.log(4.0) + 5 * math.log(2.0)) / 2, rel=1e-6)
    loss.backward()
    assert w.grad is None and logits.grad is not None


def test_awr_loss_mask_renormalises_over_available_tools():
    logits = torch.tensor([[0.0, math.log(3.0), 5.0]])
    # tool 2 unavailable: pi(1) = 3 / 4
    assert awr_loss(logits, torch.tensor([1]), T(1.0), B([True, True, False])).item() == pytest.approx(math.log(4 / 3))


def test_expected_q_is_the_policy_mean():
    q, logits = torch.tensor([[4.0, 0.0, 9.0]]), torch.tensor([[0.0, math.log(3.0), 0.0]])
    assert expected_q(q, logits).item() == pytest.approx((4.0 + 9.0) / 5)
    assert expected_q(q, logits, B([True, True, False])).item() == pytest.approx(1.0)  # 1/4 * 4 + 3/4 * 0


def test_policy_entropy_hand_computed():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [50.0, 0.0, 0.0, 0.0]])
    h = policy_entropy(logits, B([True] * 4, [True, False, True, False], [True] * 4))
    assert h.tolist() == pytest.approx([math.log(4.0), math.log(2.0), 0.0], abs=1e-6)


def test_config_rejects_unknown_method():
    with pytest.raises(ValueError):
        DiscreteConfig(method="sac")


# ---- learner on random batches -------------------------------------------------------------
def _random_batch(n=32, d=6, k=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    s, s2 = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    a = torch.randint(0, k, (n,), generator=g)
    r = torch.randn(n, generator=g)
    done = (torch.rand(n, generator=g) < 0.3).float()
    mask = torch.rand(n, k, generator=g) < 0.6  # may exclude the taken tool: the learner adds it back
    next_mask = torch.rand(n, k, generator=g) < 0.6
    next_mask[done.bool()] = False  # terminal s': nothing available
    return s, a, r, s2, done, mask, next_mask


@pytest.mark.parametrize("method", ["iql", "cql"])
def test_update_metrics_and_entropy_bounds(method):
    torch.manual_seed(0)
    k = 5
    learner = DiscreteLearner(DiscreteConfig(state_dim=6, n_actions=k, hidden_dim=32, lr=3e-3, method=method,
                                             awr_beta=3.0, awr_max_weight=4.0))
    batch = _random_batch(k=k)
    first = learner.update(*batch)
    entropies = [first["policy_entropy"]]
    for _ in range(60):
        last = learner.update(*batch)
        entropies.append(last["policy_entropy"])
    extra = {"v_loss", "v_mean"} if method == "iql" else {"cql_penalty"}
    assert set(first) == {"q_loss", "actor_loss", "policy_entropy", "td_error", "q_mean", "adv_mean",
                          "awr_weight_mean", "awr_clip_frac"} | extra
    assert all(math.isfinite(v) for v in last.values())
    assert all(0.0 <= h <= math.log(k) + 1e-6 for h in entropies)
    assert entropies[-1] < entropies[0]  # the actor sharpens on a fixed batch
    assert last["q_loss"] < first["q_loss"]
    assert 0.0 < last["awr_weight_mean"] <= 4.0


def test_target_q_follows_q_by_polyak_rate():
    torch.manual_seed(0)
    learner = DiscreteLearner(DiscreteConfig(state_dim=6, n_actions=5, hidden_dim=16, lr=1e-2, polyak=0.1))
    before = [p.clone() for p in learner.target_q.parameters()]
    learner.update(*_random_batch())
    for t_new, t_old, q in zip(learner.target_q.parameters(), before, learner.core.q.parameters()):
        assert torch.allclose(t_new, 0.9 * t_old + 0.1 * q, atol=1e-6)
        assert not t_new.requires_grad


# ---- a small exact MDP ------------------------------------------------------------------------
# A 4-step tool chain, states one-hot. Tools: 0 "search" (reward 0, on to the next state; not
# available at the last state), 1 "answer/finish" (ends, reward FINISH[s]), 2 "bad tool" (reward
# -1, stays), 3 "special" (ends, reward 1). The behaviour policy takes the best tool only 40% (s0-s2)
# or 30% (s3) of the time and never takes the special tool before s3.
GAMMA = 0.9
SEARCH, FINISH_TOOL, BAD, SPECIAL = range(4)
FINISH = [0.0, 1.2, 0.3, 0.2]
COUNTS = {0: {SEARCH: 4, FINISH_TOOL: 4, BAD: 2},
          1: {SEARCH: 4, FINISH_TOOL: 4, BAD: 2},
          2: {SEARCH: 4, FINISH_TOOL: 4, BAD: 2},
          3: {FINISH_TOOL: 4, BAD: 3, SPECIAL: 3}}
AVAILABLE = B([True] * 4, [True] * 4, [True] * 4, [False, True, True, True])
BEST = {0: SEARCH, 1: FINISH_TOOL, 2: SEARCH, 3: SPECIAL}  # in-support optimum, from in_support_optimum()
STATES = torch.eye(4)


def step(s: int, a: int) -> tuple[float, int, float]:
    return {SEARCH: (0.0, s + 1, 0.0), FINISH_TOOL: (FINISH[s], s, 1.0), BAD: (-1.0, s, 0.0), SPECIAL: (1.0, s, 1.0)}[a]


def dataset():
    rows = [(s, a, *step(s, a)) for s, c in COUNTS.items() for a, n in c.items() for _ in range(n)]
    s, a, r, s2, done = zip(*rows)
    return (STATES[list(s)], torch.tensor(a), T(*r), STATES[list(s2)], T(*done),
            AVAILABLE[list(s)], AVAILABLE[list(s2)])


def expectile(values, weights, tau):
    """m with sum_i w_i |tau - 1(v_i < m)| (v_i - m) = 0, by bisection (the left side falls in m)."""
    lo, hi = min(values), max(values)
    for _ in range(60):
        m = (lo + hi) / 2
        f = sum(w * abs(tau - (v < m)) * (v - m) for v, w in zip(values, weights))
        lo, hi = (m, hi) if f > 0 else (lo, m)
    return (lo + hi) / 2


def tabular_fixed_point(backup):
    """Q(s, a) = r + gamma (1 - done) V(s') over the logged (s, a); V(s) = backup(Q(s, .), counts)."""
    V = [0.0] * 4
    for _ in range(200):
        Q = {}
        for s, c in COUNTS.items():
            for a in c:
                r, s2, done = step(s, a)
                Q[s, a] = r + GAMMA * (1 - done) * V[s2]
        V = [backup([Q[s, a] for a in c], list(c.values())) for s, c in COUNTS.items()]
    return Q, V


def in_support_optimum():
    return tabular_fixed_point(lambda q, n: max(q))


def iql_fixed_point(tau):
    return tabular_fixed_point(lambda q, n: expectile(q, n, tau))


TAU = 0.99


@pytest.fixture(scope="module")
def iql_learner():
    torch.manual_seed(0)
    learner = DiscreteLearner(DiscreteConfig(state_dim=4, n_actions=4, hidden_dim=64, gamma=GAMMA, expectile=TAU,
                                             polyak=0.05, lr=3e-3, method="iql", awr_beta=10.0))
    data = dataset()
    for _ in range(300):
        learner.update(*data)
    return learner


@pytest.fixture(scope="module")
def cql_learner():
    torch.manual_seed(0)
    learner = DiscreteLearner(DiscreteConfig(state_dim=4, n_actions=4, hidden_dim=64, gamma=GAMMA, polyak=0.05,
                                             lr=3e-3, method="cql", cql_alpha=0.5, awr_beta=10.0))
    data = dataset()
    for _ in range(300):
        learner.update(*data)
    return learner


def test_exact_solutions_of_the_chain():
    q_opt, v_opt = in_support_optimum()
    # by hand: V(s3) = 1 (special); V(s2) = 0.9 * 1 (search); V(s1) = 1.2 (finish beats 0.81); V(s0) = 0.9 * 1.2
    assert v_opt == pytest.approx([1.08, 1.2, 0.9, 1.0])
    assert {s: max(COUNTS[s], key=lambda a: q_opt[s, a]) for s in COUNTS} == BEST
    # the 0.99-expectile fixed point sits below the optimum, within 0.031 of it
    q_tau, v_tau = iql_fixed_point(TAU)
    assert all(0.0 < v_opt[s] - v_tau[s] < 0.031 for s in range(4))
    assert max(abs(q_tau[k] - q_opt[k]) for k in q_opt) < 0.031
    # 0.9 is much further off (V(s0) = 0.82): the expectile, not the network, sets this gap
    assert v_opt[0] - iql_fixed_point(0.9)[1][0] > 0.25


def test_iql_recovers_the_expectile_fixed_point_and_in_support_optimum(iql_learner):
    q_tau, v_tau = iql_fixed_point(TAU)
    q_opt, v_opt = in_support_optimum()
    q = iql_learner.q_values(STATES)
    with torch.no_grad():
        v = iql_learner.core.value(STATES)
    q_err = max(abs(q[s, a].item() - q_tau[s, a]) for s, a in q_tau)
    v_err = max(abs(v[s].item() - v_tau[s]) for s in range(4))
    assert q_err < 0.01 and v_err < 0.01  # measured: ~3e-5
    assert max(abs(q[s, a].item() - q_opt[s, a]) for s, a in q_opt) < 0.031 + 0.01
    assert max(abs(v[s].item() - v_opt[s]) for s in range(4)) < 0.031 + 0.01
    for s, best in BEST.items():  # the greedy in-data tool is the optimal one
        assert max(COUNTS[s], key=lambda a: q[s, a].item()) == best


def test_iql_awr_policy_is_the_clipped_advantage_reweighting_of_the_data(iql_learner):
    cfg = iql_learner.cfg
    p = iql_learner.probabilities(STATES, AVAILABLE)
    with torch.no_grad():
        tq, v = iql_learner.target_q.min_q(STATES), iql_learner.core.value(STATES)
    for s, counts in COUNTS.items():
        # the weighted-NLL optimum: pi(a | s) proportional to n(s, a) * min(exp(beta * A(s, a)), max_weight)
        w = {a: n * min(math.exp(cfg.awr_beta * (tq[s, a] - v[s]).item()), cfg.awr_max_weight) for a, n in counts.items()}
        for a in range(4):
            assert p[s, a].item() == pytest.approx(w.get(a, 0.0) / sum(w.values()), abs=0.02)
        assert p[s, BEST[s]].item() > 0.95  # the behaviour policy took it only 30-40% of the time
    assert p[:3, SPECIAL].max().item() < 0.01  # never taken before s3


def test_masked_tools_get_zero_probability(iql_learner):
    p = iql_learner.probabilities(STATES, AVAILABLE)
    assert p[3, SEARCH].item() == 0.0 and torch.isinf(iql_learner.q_values(STATES, AVAILABLE)[3, SEARCH])
    assert torch.allclose(p.sum(1), torch.ones(4))
    # masking the best tool renormalises over the rest, in the unmasked ratios
    mask = AVAILABLE.clone()
    mask[1, FINISH_TOOL] = False
    pm, pu = iql_learner.probabilities(STATES, mask), iql_learner.probabilities(STATES)
    assert pm[1, FINISH_TOOL].item() == 0.0
    rest = pu[1] * mask[1]
    assert torch.allclose(pm[1], rest / rest.sum(), atol=1e-6)
    assert pm[1, SEARCH].item() > 0.5


def test_cql_keeps_never_taken_tools_below_the_best_in_data_tool(cql_learner):
    q = cql_learner.q_values(STATES, AVAILABLE)
    for s in range(3):
        assert q[s, SPECIAL].item() < q[s, BEST[s]].item() - 1.0  # measured: ~6 below
        assert max(COUNTS[s], key=lambda a: q[s, a].item()) == BEST[s]
    assert q[3].argmax().item() == SPECIAL
    q_opt, _ = in_support_optimum()
    # conservative, yet the taken tools stay near their in-support values (measured: within 0.25)
    assert max(abs(q[s, a].item() - q_opt[s, a]) for s, a in q_opt) < 0.4


def test_cql_awr_policy_picks_the_best_in_data_tool(cql_learner):
    p = cql_learner.probabilities(STATES, AVAILABLE)
    for s, best in BEST.items():
        assert p[s, best].item() > 0.9
    assert p[3, SEARCH].item() == 0.0
    assert p[:3, SPECIAL].max().item() < 0.02


# ---- awr: the actor alone, weighted by the critic's advantage ---------------------------------
def _tabular_advantage(data, tau=TAU):
    """A(s, a) = Q_tau(s, a) - V_tau(s) of each logged row, from the exact IQL fixed point."""
    q_tau, v_tau = iql_fixed_point(tau)
    s, a = data[0].argmax(1).tolist(), data[1].tolist()
    return T(*[q_tau[si, ai] - v_tau[si] for si, ai in zip(s, a)])


def test_awr_head_fits_the_clipped_advantage_reweighting_of_the_data():
    torch.manual_seed(0)
    learner = DiscreteLearner(DiscreteConfig(state_dim=4, n_actions=4, hidden_dim=64, lr=3e-3, method="awr",
                                             awr_beta=10.0))
    data = dataset()
    adv = _tabular_advantage(data)
    for _ in range(300):
        metrics = learner.update(*data, adv=adv)
    assert set(metrics) == {"actor_loss", "policy_entropy", "adv_mean", "awr_weight_mean", "awr_clip_frac"}
    assert learner.core.q is None and learner.core.v is None  # one MLP: the policy
    p = learner.probabilities(STATES, AVAILABLE)
    q_tau, v_tau = iql_fixed_point(TAU)
    for s, counts in COUNTS.items():
        w = {a: n * min(math.exp(10.0 * (q_tau[s, a] - v_tau[s])), 100.0) for a, n in counts.items()}
        for a in range(4):
            assert p[s, a].item() == pytest.approx(w.get(a, 0.0) / sum(w.values()), abs=0.02)
        assert p[s, BEST[s]].item() > 0.9
    with pytest.raises(ValueError, match="no Q over tools"):
        learner.q_values(STATES)


def test_awr_head_needs_the_critics_advantage():
    learner = DiscreteLearner(DiscreteConfig(state_dim=4, n_actions=4, hidden_dim=8, method="awr"))
    with pytest.raises(ValueError, match="advantage"):
        learner.update(*dataset())


def test_awr_head_stepped_beside_the_iql_critic_picks_the_best_in_data_tool():
    """What training runs: the critic's update leaves its advantage for the actor on the same batch."""
    from harnessrl.algorithms.iql import IQLConfig, IQLLearner

    torch.manual_seed(0)
    critic = IQLLearner(IQLConfig(state_dim=4, action_dim=4, hidden_dim=64, gamma=GAMMA, expectile=TAU,
                                  polyak=0.05, lr=3e-3))
    head = DiscreteLearner(DiscreteConfig(state_dim=4, n_actions=4, hidden_dim=64, lr=3e-3, method="awr",
                                          awr_beta=10.0))
    s, a, r, s2, done, mask, _ = dataset()
    action_emb = torch.eye(4)[a]  # the action 'embedding' is the tool's one-hot
    for _ in range(500):
        critic.update(s, action_emb, r, s2, done)
        head.update(s, a, r, s2, done, mask, adv=critic.advantage)
    p = head.probabilities(STATES, AVAILABLE)
    for s_idx, best in BEST.items():
        assert p[s_idx, best].item() > 0.8, (s_idx, p[s_idx])
