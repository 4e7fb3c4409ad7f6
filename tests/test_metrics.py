"""Offline evaluation metrics on constructed data whose answer is known by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harnessrl import metrics as M


# ---- split ------------------------------------------------------------------------------------
GROUPS = [f"task-{i % 20}" for i in range(200)]  # 20 groups, 10 rows each, interleaved


def test_split_no_group_in_both_and_covers_all_rows():
    train, held = M.split_by_group(GROUPS, 0.25, seed=7)
    assert not np.any(train & held) and np.all(train | held)
    train_groups = {g for g, t in zip(GROUPS, train) if t}
    held_groups = {g for g, h in zip(GROUPS, held) if h}
    assert not train_groups & held_groups
    assert len(held_groups) == 5 and held.sum() == 50  # round(0.25 * 20) groups of 10 rows


def test_split_is_deterministic_and_independent_of_row_order():
    _, held = M.split_by_group(GROUPS, 0.3, seed=1)
    _, again = M.split_by_group(GROUPS, 0.3, seed=1)
    assert np.array_equal(held, again)
    reversed_ids = GROUPS[::-1]
    _, held_rev = M.split_by_group(reversed_ids, 0.3, seed=1)
    assert {g for g, h in zip(GROUPS, held) if h} == {g for g, h in zip(reversed_ids, held_rev) if h}


def test_split_seed_changes_the_split():
    held_sets = {frozenset(g for g, h in zip(GROUPS, M.split_by_group(GROUPS, 0.3, seed=s)[1]) if h)
                 for s in range(5)}
    assert len(held_sets) > 1


def test_split_keeps_at_least_one_group_on_each_side():
    _, held = M.split_by_group(["a", "a", "b"], 0.1)
    assert held.sum() in (1, 2) and len({g for g, h in zip("aab", held) if h}) == 1
    train, _ = M.split_by_group(["a", "b"], 0.9)
    assert train.sum() == 1
    assert M.split_by_group(["a", "b"], 0.0)[1].sum() == 0
    assert M.split_by_group(["a", "b"], 1.0)[0].sum() == 0


def test_split_rejects_bad_fraction():
    with pytest.raises(ValueError):
        M.split_by_group(["a"], 1.5)


# ---- TD error and value scale -----------------------------------------------------------------
def test_td_error_hand_computed():
    # targets: 1 + 0.9 * 2 = 2.8 ; 0 (terminal, V' ignored) ; -1 + 0.9 * 0 = -1
    out = M.td_error(q=[3.0, 0.5, -1.0], r=[1.0, 0.0, -1.0], done=[False, True, False],
                     v_next=[2.0, 100.0, 0.0], gamma=0.9)
    # deltas q - target: 0.2, 0.5, 0.0
    assert out["td_mae"] == pytest.approx(0.7 / 3)
    assert out["td_rmse"] == pytest.approx(math.sqrt((0.04 + 0.25) / 3))
    assert out["td_bias"] == pytest.approx(0.7 / 3)


def test_td_error_perfect_critic_is_zero_and_empty_is_nan():
    assert M.td_error([1.5], [1.5], [True], [9.0], 0.99)["td_mae"] == 0.0
    assert math.isnan(M.td_error([], [], [], [], 0.9)["td_mae"])


def test_value_scale_against_reward_bound():
    out = M.value_scale([-5.0, 1.0, 3.0], r_max=1.0, gamma=0.9)
    assert out["reward_bound"] == pytest.approx(10.0)
    assert out["v_max_abs"] == 5.0 and out["v_mean_abs"] == pytest.approx(3.0)
    assert out["v_bound_ratio"] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        M.reward_bound(1.0, 1.0)


# ---- Spearman ---------------------------------------------------------------------------------
def test_spearman_monotone_transform_is_one_and_reversed_is_minus_one():
    x = np.array([0.3, -2.0, 5.0, 1.1, 0.0])
    assert M.spearman(x, np.exp(x) * 10 - 3) == pytest.approx(1.0)
    assert M.spearman(x, -x ** 3) == pytest.approx(-1.0)


def test_spearman_ties_hand_computed():
    # ranks x: 1, 2.5, 2.5, 4 ; ranks y: 1, 3, 2, 4 ; Pearson of ranks = 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10)
    assert M.average_ranks([1, 2, 2, 3]).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert M.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / math.sqrt(10), abs=1e-12)


def test_spearman_matches_scipy_on_random_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 5, 60), rng.integers(0, 4, 60)
    assert M.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def test_spearman_degenerate_cases_are_nan():
    assert math.isnan(M.spearman([1.0], [2.0]))
    assert math.isnan(M.spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError):
        M.spearman([1, float("nan")], [1, 2])


# ---- selection lift ---------------------------------------------------------------------------
def test_selection_lift_three_tasks_by_hand():
    tasks = ["A", "A", "A", "B", "B", "C", "C", "D"]
    scores = [0.9, 0.1, 0.5, 0.2, 0.8, 0.3, 0.7, 5.0]
    success = [1, 0, 0, 1, 0, 0, 1, 1]
    out = M.selection_lift(tasks, scores, success)
    # picked: A0 (1), B1 (0), C1 (1) -> 2/3 ; means: 1/3, 1/2, 1/2 -> 4/9 ; D has one attempt: skipped
    assert out["n_tasks"] == 3
    assert out["selected_success"] == pytest.approx(2 / 3)
    assert out["mean_success"] == pytest.approx(4 / 9)
    assert out["selection_lift"] == pytest.approx(2 / 9)


def test_selection_lift_bad_critic_is_negative_and_ties_are_fair():
    out = M.selection_lift(["A", "A", "B", "B"], [0.0, 1.0, 2.0, 2.0], [True, False, True, False])
    # A picks the failure (0); B ties, credited 1/2 ; means 1/2, 1/2
    assert out["selected_success"] == pytest.approx(0.25)
    assert out["selection_lift"] == pytest.approx(-0.25)


def test_selection_lift_without_repeated_tasks_is_nan():
    out = M.selection_lift(["A", "B"], [1.0, 2.0], [True, False])
    assert out["n_tasks"] == 0 and math.isnan(out["selection_lift"])


# ---- top-1, tools, entropy --------------------------------------------------------------------
def test_top1_rate_hand_computed():
    scores = [[0.1, 0.9, 0.2], [0.5, 0.4], [1.0, 1.0, 0.0], [3.0, 1.0]]
    expert = [1, 1, 0, None]  # hit, miss, tie of two (1/2), unknown (skipped)
    out = M.top1_rate(scores, expert)
    assert out["n_steps"] == 3
    assert out["top1"] == pytest.approx(1.5 / 3)
    assert out["random_top1"] == pytest.approx((1 / 3 + 1 / 2 + 1 / 3) / 3)


def test_top1_constant_scorer_earns_exactly_random():
    scores = [[0.0] * k for k in (2, 3, 4, 5)]
    out = M.top1_rate(scores, [0, 2, 3, 1])
    assert out["top1"] == pytest.approx(out["random_top1"])


def test_invalid_tool_rate_hand_computed():
    valid = np.array([[1, 1, 0], [0, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=bool)
    # tool 2 invalid at step 0, tool 1 valid, tool 1 invalid, tool 7 out of vocabulary
    assert M.invalid_tool_rate([2, 1, 1, 7], valid) == pytest.approx(0.75)
    assert M.invalid_tool_rate([0, 1, 0, 2], valid) == 0.0


def test_policy_entropy_uniform_one_hot_and_mix():
    uniform = np.full((2, 4), 0.25)
    assert M.policy_entropy(uniform)["entropy"] == pytest.approx(math.log(4))
    assert M.policy_entropy(uniform)["entropy_norm"] == pytest.approx(1.0)
    one_hot = np.eye(4)[[0, 0, 0]]
    out = M.policy_entropy(one_hot)
    assert out["entropy"] == 0.0 and out["marginal_entropy_norm"] == 0.0
    # confident per state but using two tools half the time each
    two = np.eye(4)[[0, 1]]
    out = M.policy_entropy(two)
    assert out["entropy"] == 0.0 and out["marginal_entropy"] == pytest.approx(math.log(2))
    assert out["marginal_entropy_norm"] == pytest.approx(0.5)


def test_policy_entropy_rejects_non_distributions():
    with pytest.raises(ValueError):
        M.policy_entropy(np.array([[0.5, 0.6]]))


# ---- latency, OOD, loops ------------------------------------------------------------
def test_latency_summary_on_1_to_100_ms():
    out = M.latency_summary(np.arange(1, 101) / 1000.0)
    assert out["p50_ms"] == pytest.approx(50.5)
    assert out["p95_ms"] == pytest.approx(95.05)
    assert out["p99_ms"] == pytest.approx(99.01)
    assert out["mean_ms"] == pytest.approx(50.5) and out["n"] == 100


def test_ood_rate_and_nearest_cosine_distance():
    ref = np.array([[1.0, 0.0], [0.0, 1.0]])
    queries = np.array([[2.0, 0.0], [1.0, 1.0], [-1.0, 0.0]])
    d = M.nearest_cosine_distance(queries, ref, chunk=2)
    assert d == pytest.approx([0.0, 1 - 1 / math.sqrt(2), 1.0], abs=1e-6)
    assert M.ood_rate(d, 0.2) == pytest.approx(2 / 3)
    assert M.ood_rate([0.1, 0.3], 0.3) == 0.0


def test_has_loop_and_loop_rate():
    assert M.has_loop(["look", "look", "look"])
    assert M.has_loop(["a", "north", "south", "north", "south", "north", "south", "b"])
    assert not M.has_loop(["north", "south", "north", "south", "east"])  # two repeats only
    assert not M.has_loop(["a", "b", "c", "d", "a", "b", "c", "d", "a", "b", "c", "d"])  # period 4 > 3
    assert M.loop_rate([["x"] * 3, ["a", "b"], [], ["y", "z"] * 3]) == pytest.approx(0.5)


# ---- table ------------------------------------------------------------------------------------
def test_format_table_aligns_flattens_and_formats():
    text = M.format_table({"td": {"mae": 0.123456}, "n_tasks": 3, "lift": float("nan")}, title="held-out")
    lines = text.splitlines()
    assert lines[0] == "held-out"
    assert lines[1].split() == ["metric", "value"]
    assert [line.split() for line in lines[3:]] == [["td/mae", "0.1235"], ["n_tasks", "3"], ["lift", "n/a"]]
    assert len({len(line) for line in lines[1:]}) == 1  # every row the same width: aligned


def test_wilson_interval():
    assert M.wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = M.wilson_interval(5, 10)
    assert lo < 0.5 < hi and abs((0.5 - lo) - (hi - 0.5)) < 1e-12  # symmetric at p = 0.5
    lo, hi = M.wilson_interval(10, 10)
    assert hi == 1.0 and abs(lo - 0.7225) < 1e-3  # 10/10 is not certainty
    lo, hi = M.wilson_interval(0, 18)
    assert lo == 0.0 and abs(hi - 0.1759) < 1e-3
    assert M.wilson_interval(7, 18)[1] < M.wilson_interval(17, 18)[0]  # 0.39 vs 0.94: separated
