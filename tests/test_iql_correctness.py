"""IQL correctness on a small MDP whose values are known exactly.

FrozenLake 4x4 (deterministic; `tests/mdp_logs.py`) is logged by a known behaviour policy into
the native JSONL format, parsed with `parse_line`, turned into transitions by
`episode_transitions` (window 0, reward 1 on reaching the goal and 0 otherwise), encoded with
the real all-MiniLM-L6-v2, and learned in-process by `IQLLearner`. The learned V and Q are then
compared with value iteration on the true dynamics whose max is restricted to the actions the
logs hold in each state (the in-support optimum, which is what IQL with expectile -> 1 targets).

Rendering note: with `window=0` `render_state` still appends "(t earlier steps)" after the first
step (deliberate, see `test_window_zero_keeps_only_marker`), so the rendered text is a function
of (cell, t), not of the cell alone. In the MiniLM space the marker moves a state further (~0.11)
than a move to the neighbouring cell does (~0.06-0.10), which would make this a test of
generalising across step counts rather than of IQL. The tests therefore check that each row's
state is exactly `render_state(task, [], observation)` plus that marker, and train on the
marker-free text (what `render_state` gives at step 0): a Markov state, one text per cell.

Bounds (values lie in [0, 1]; gamma = 0.9, so neighbouring cells differ by >= 0.05 in value):
* V on visited non-terminal cells: mean error <= 0.05, max <= 0.12. The exact tabular IQL fixed
  point at expectile 0.95 is itself 0.017 (mean) / 0.031 (max) below the in-support optimum, so
  the rest of the budget is for function approximation over near-identical sentence embeddings.
* Q on in-data (cell, action) pairs: mean <= 0.05, max <= 0.15.
* Greedy in-support policy: matches value iteration on >= 80% of cells whose in-support optimum
  is unique by a margin of 0.02.
* Conservative penalty: Q of every never-taken action below Q of the data's best action.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import numpy as np
import pytest
import torch

import mdp_logs as M
from harnessrl.algorithms.iql import IQLConfig, IQLLearner
from harnessrl.formats.native import ParsedEpisode, parse_line
from harnessrl.transitions import untaken_candidates
from harnessrl.config import RenderConfig
from harnessrl.render import Renderer
from harnessrl.rewards import RewardRecipe
from harnessrl.transitions import episode_transitions

GAMMA = 0.9
EXPECTILE = 0.95
N_EPISODES = 300
MAX_STEPS = 25
SEED = 0
TRAIN = dict(steps=4000, batch_size=64)
NET = dict(hidden_dim=64, lr=1e-3, polyak=0.05)
ALPHA = 1.0  # the pipeline's default candidate-penalty weight (config.py, quickstart.yaml)

V_MEAN_BOUND, V_MAX_BOUND = 0.05, 0.12
Q_MEAN_BOUND, Q_MAX_BOUND = 0.05, 0.15
GREEDY_MIN_MATCH, GREEDY_MARGIN = 0.8, 0.02

RECIPE = RewardRecipe(name="frozenlake", success=1.0, failure=0.0, step_cost=0.0, source_reward=0.0)
MARKER = re.compile(r"\n\((\d+) earlier steps\)$")
RENDER = Renderer(RenderConfig(window=0, max_chars=4000))
CELL_TEXT = {RENDER.text(M.TASK, [], M.observation(s)): s for s in range(M.N_STATES)}
ACTION_ID = {t: a for a, t in enumerate(M.ACTION_TEXT)}


@pytest.fixture(scope="module", autouse=True)
def threads():
    # One intra-op thread: the nets are tiny, and on a shared 2-core box two threads contend
    # badly with other processes (measured 9 ms vs 440 ms per update under load).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cell_of(state_text: str) -> tuple[int, int]:
    """(cell, number of earlier steps in the marker) of a rendered window-0 state."""
    m = MARKER.search(state_text)
    return CELL_TEXT[state_text[: m.start()] if m else state_text], int(m.group(1)) if m else 0


# ---- data -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def logged():
    """Native lines -> parsed episodes -> transitions, with each row's cells and action ids."""
    lines = M.log_episodes(N_EPISODES, seed=SEED, max_steps=MAX_STEPS)
    episodes, rows = [], []
    for i, line in enumerate(lines):
        parsed = parse_line(line, "memory://frozenlake.jsonl", i + 1)
        assert isinstance(parsed, ParsedEpisode), parsed
        episodes.append(parsed)
        rows += episode_transitions(parsed.episode, parsed.steps, RECIPE, RENDER)
    s = np.array([cell_of(r["state_text"])[0] for r in rows])
    s2 = np.array([cell_of(r["next_state_text"])[0] for r in rows])
    a = np.array([ACTION_ID[r["action_text"]] for r in rows])
    counts: dict[int, Counter] = {}
    for si, ai in zip(s, a):
        counts.setdefault(int(si), Counter())[int(ai)] += 1
    return {"lines": lines, "episodes": episodes, "rows": rows, "s": s, "a": a, "s2": s2,
            "r": np.array([r["reward"] for r in rows], np.float32),
            "done": np.array([r["done"] for r in rows], np.float32),
            "counts": counts, "support": {c: set(k) for c, k in counts.items()}}


@pytest.fixture(scope="module")
def exact(logged):
    v_sup, q_sup = M.value_iteration(GAMMA, logged["support"])
    v_opt, q_opt = M.value_iteration(GAMMA)
    return {"v_sup": v_sup, "q_sup": q_sup, "v_opt": v_opt, "q_opt": q_opt,
            "v_fixed": M.iql_fixed_point(GAMMA, EXPECTILE, logged["counts"]),
            "v_behaviour": M.iql_fixed_point(GAMMA, 0.5, logged["counts"]),
            "visited": sorted(logged["counts"])}


@pytest.fixture(scope="module")
def embedded(logged):
    """Real MiniLM embeddings of the 16 cell texts and the 4 action texts."""
    from harnessrl.encoders import load_encoder

    model, identity = load_encoder()
    assert identity.dim == 384
    cells = model.encode(list(CELL_TEXT), convert_to_numpy=True)
    actions = model.encode(list(M.ACTION_TEXT), convert_to_numpy=True)
    order = np.argsort(list(CELL_TEXT.values()))  # rows indexed by cell id
    return torch.from_numpy(cells[order]), torch.from_numpy(actions)


def train(logged, embedded, alpha: float, seed: int = SEED) -> dict:
    """In-process IQL on the logged transitions (minibatches drawn like jobs/train.py does)."""
    cell_emb, act_emb = embedded
    torch.manual_seed(seed)
    cfg = IQLConfig(gamma=GAMMA, expectile=EXPECTILE, alpha=alpha, **NET)
    learner = IQLLearner(cfg)
    s, a, s2 = (torch.from_numpy(logged[k]) for k in ("s", "a", "s2"))
    r, done = torch.from_numpy(logged["r"]), torch.from_numpy(logged["done"])
    # Untaken candidates chosen as the encode stage does; every step offers all 4 actions.
    cand_ids = torch.tensor([[ACTION_ID[c] for c in untaken_candidates(row["action_text"], row["candidates"], 16)]
                             for row in logged["rows"]])
    assert cand_ids.shape == (len(logged["rows"]), 3)
    mask = torch.ones(TRAIN["batch_size"], 3, dtype=torch.bool)
    gen = torch.Generator().manual_seed(seed)
    start = time.time()
    for _ in range(TRAIN["steps"]):
        idx = torch.randint(len(r), (TRAIN["batch_size"],), generator=gen)
        cand = act_emb[cand_ids[idx]] if alpha > 0 else None
        metrics = learner.update(cell_emb[s[idx]], act_emb[a[idx]], r[idx], cell_emb[s2[idx]], done[idx],
                                 cand=cand, cand_mask=mask if alpha > 0 else None)
    with torch.no_grad():
        v = learner.core.v(cell_emb).numpy().astype(float)
        q = torch.stack([learner.core.q.min_q(cell_emb, act_emb[i].expand(M.N_STATES, -1))
                         for i in M.ACTIONS], dim=1).numpy().astype(float)
    return {"v": v, "q": q, "metrics": metrics, "seconds": time.time() - start}


@pytest.fixture(scope="module")
def plain(logged, embedded):
    return train(logged, embedded, alpha=0.0)


@pytest.fixture(scope="module")
def penalised(logged, embedded):
    return train(logged, embedded, alpha=ALPHA)


# ---- measures ---------------------------------------------------------------------------------
def value_errors(v: np.ndarray, exact: dict) -> np.ndarray:
    cells = exact["visited"]
    return np.abs(v[cells] - exact["v_sup"][cells])


def q_errors(q: np.ndarray, logged: dict, exact: dict) -> np.ndarray:
    return np.array([abs(q[s, a] - exact["q_sup"][s, a]) for s in exact["visited"] for a in logged["support"][s]])


def greedy_matches(q: np.ndarray, logged: dict, exact: dict) -> list[bool]:
    """Per cell whose in-support optimum is unique by GREEDY_MARGIN: does argmax over the in-data
    actions of the learned Q pick it?"""
    out = []
    for s in exact["visited"]:
        acts = sorted(logged["support"][s])
        true_q = exact["q_sup"][s, acts]
        top = np.sort(true_q)[::-1]
        if len(acts) > 1 and top[0] - top[1] > GREEDY_MARGIN:
            out.append(acts[int(np.argmax(q[s, acts]))] == acts[int(np.argmax(true_q))])
    return out


def unseen_gaps(q: np.ndarray, logged: dict, exact: dict) -> list[tuple[int, int, float]]:
    """(cell, unseen action, Q(best in-data action) - Q(unseen action)) for every never-taken action."""
    out = []
    for s in exact["visited"]:
        best = max(logged["support"][s], key=lambda a: exact["q_sup"][s, a])
        out += [(s, u, float(q[s, best] - q[s, u])) for u in sorted(set(M.ACTIONS) - logged["support"][s])]
    return out


# ---- the MDP and its logs -----------------------------------------------------------------------
def test_frozenlake_copy_matches_gymnasium():
    gym = pytest.importorskip("gymnasium")
    env = gym.make("FrozenLake-v1", map_name="4x4", is_slippery=False).unwrapped
    assert tuple(b"".join(row).decode() for row in env.desc) == M.MAP
    for s in M.NON_TERMINAL:
        for a in M.ACTIONS:
            ((prob, s2, reward, terminated),) = env.P[s][a]
            assert prob == 1.0
            assert (s2, float(reward), terminated) == M.step(s, a), (s, a)


def test_logs_become_the_intended_transitions(logged):
    rows = logged["rows"]
    assert len(logged["episodes"]) == N_EPISODES
    for row in rows:
        s, t = cell_of(row["state_text"])
        assert t == row["step_idx"]  # window 0 still counts earlier steps (see module docstring)
        s2, reward, terminal = M.step(s, ACTION_ID[row["action_text"]])
        assert cell_of(row["next_state_text"])[0] == s2
        assert row["reward"] == reward  # 1 exactly on entering the goal, as in value iteration
        assert row["done"] == terminal  # holes and the goal terminate
        assert row["truncated"] == (not terminal and row["step_idx"] == MAX_STEPS - 1)
        assert row["candidates"] == list(M.ACTION_TEXT)
    # The behaviour policy never takes the forbidden action, and covers every other one.
    for s, acts in logged["support"].items():
        assert M.FORBIDDEN[s] not in acts
        assert acts == set(M.ACTIONS) - {M.FORBIDDEN[s]}
    assert set(logged["support"]) == set(M.NON_TERMINAL)
    assert {0.0, 1.0} == set(np.unique(logged["r"]))


def test_exact_values_and_that_the_bounds_can_fail(logged, exact):
    v_sup, v_opt, cells = exact["v_sup"], exact["v_opt"], exact["visited"]
    assert np.all(v_sup <= v_opt + 1e-12)
    # Down at cell 10 (the unique optimum, one step from the goal's neighbour) is never taken:
    assert exact["v_opt"][10] == pytest.approx(GAMMA) and v_sup[10] == pytest.approx(GAMMA ** 3)
    # The tabular IQL fixed point at EXPECTILE sits just below the in-support optimum...
    gap = np.abs(exact["v_fixed"][cells] - v_sup[cells])
    assert gap.mean() < 0.5 * V_MEAN_BOUND and gap.max() < 0.5 * V_MAX_BOUND
    # ... while wrong value tables break the bounds: shifted, the unrestricted optimum (at the
    # cells it differs), and the behaviour policy's own value (expectile 0.5).
    assert value_errors(v_sup + 0.5, exact).mean() > V_MEAN_BOUND
    differ = [s for s in cells if v_opt[s] - v_sup[s] > 1e-9]
    assert np.abs(v_opt[differ] - v_sup[differ]).min() > V_MAX_BOUND
    assert value_errors(exact["v_behaviour"], exact).mean() > V_MEAN_BOUND
    assert value_errors(exact["v_behaviour"], exact).max() > V_MAX_BOUND


# ---- plain IQL: V, Q and the greedy policy --------------------------------------------------------
def test_iql_values_approach_in_support_optimum(plain, logged, exact):
    ev = value_errors(plain["v"], exact)
    eq = q_errors(plain["q"], logged, exact)
    print(f"\nplain IQL ({plain['seconds']:.1f}s): V err mean {ev.mean():.4f} max {ev.max():.4f}; "
          f"Q err mean {eq.mean():.4f} max {eq.max():.4f}")
    assert ev.mean() <= V_MEAN_BOUND and ev.max() <= V_MAX_BOUND
    assert eq.mean() <= Q_MEAN_BOUND and eq.max() <= Q_MAX_BOUND
    # IQL targets the in-support optimum, not the true one, where they differ (cell 10: 0.729 vs 0.9)
    assert abs(plain["v"][10] - exact["v_sup"][10]) < abs(plain["v"][10] - exact["v_opt"][10])


def test_iql_greedy_in_support_policy_matches_value_iteration(plain, logged, exact):
    matches = greedy_matches(plain["q"], logged, exact)
    print(f"\ngreedy in-support policy matches on {sum(matches)}/{len(matches)} cells")
    assert len(matches) >= 8
    assert np.mean(matches) >= GREEDY_MIN_MATCH


# ---- candidate-set penalty ------------------------------------------------------------------------
def test_penalty_keeps_unseen_actions_below_best_data_action(penalised, plain, logged, exact):
    with_pen = unseen_gaps(penalised["q"], logged, exact)
    without = unseen_gaps(plain["q"], logged, exact)
    below = lambda gaps: sum(g > 0 for _, _, g in gaps)  # noqa: E731
    print(f"\nunseen action below the data's best: alpha={ALPHA}: {below(with_pen)}/{len(with_pen)} "
          f"(min gap {min(g for *_, g in with_pen):.3f}); alpha=0: {below(without)}/{len(without)} "
          f"(min gap {min(g for *_, g in without):.3f})")
    assert len(with_pen) == len(M.NON_TERMINAL)
    assert below(with_pen) == len(with_pen), [x for x in with_pen if x[2] <= 0]


def test_without_penalty_some_unseen_action_outranks_the_data(plain, logged, exact):
    """The contrast: plain IQL leaves Q of never-taken actions unconstrained. Here "move down"
    generalises from the cells where it is good to cells 1 and 3 (where it enters a hole) and 10
    (where it is truly better but never logged): 4 of 11 unseen actions outrank the data's best
    action at seeds 0, 1 and 2."""
    gaps = unseen_gaps(plain["q"], logged, exact)
    assert any(g <= 0 for *_, g in gaps), gaps


@pytest.mark.xfail(strict=True, reason=(
    "BUG: iql.py candidate_penalty/IQLLearner.update: the CQL term's gradient also raises Q of the "
    "taken action above its TD target (at equilibrium Q(s,a) - y = alpha (beta(a) - softmax_a Q) / (2 beta(a))); "
    "with expectile near 1, V picks the inflated in-data Q and bootstrapping compounds it by ~1/(1-gamma): "
    "at alpha=1, V > 1.1 on every cell although no return exceeds 1 (one reason the default is now 0)"))
def test_penalty_keeps_in_support_values(penalised, exact):
    """A conservative critic may lean low, but its values must stay feasible (returns lie in
    [0, 1]) and near the in-support optimum."""
    v, cells = penalised["v"], exact["visited"]
    ev = value_errors(v, exact)
    print(f"\npenalised IQL alpha={ALPHA} ({penalised['seconds']:.1f}s): V err mean {ev.mean():.4f} "
          f"max {ev.max():.4f}; V range [{v[cells].min():.3f}, {v[cells].max():.3f}]; "
          f"V by cell {np.round(v[cells], 2).tolist()} vs in-support {np.round(exact['v_sup'][cells], 2).tolist()}")
    assert v[cells].max() <= 1.05 and v[cells].min() >= -0.05
    assert ev.mean() <= 2 * V_MEAN_BOUND
