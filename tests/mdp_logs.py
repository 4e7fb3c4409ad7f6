"""A tiny MDP with exactly computable values, logged by a known behaviour policy into the
native JSONL format: the ground truth for the IQL correctness tests.

The MDP is a faithful copy of gymnasium's `FrozenLake-v1` with `map_name="4x4"` and
`is_slippery=False` (deterministic): the same map, the same action numbering
(0 left, 1 down, 2 right, 3 up), moves off the grid leave the agent in place, reward 1 on
entering the goal and 0 otherwise, and the episode ends on entering a hole or the goal.
`tests/test_iql_correctness.py::test_frozenlake_copy_matches_gymnasium` checks the copy
against gymnasium itself when gymnasium is installed.

    S F F F        states are numbered row * 4 + column:   0  1  2  3
    F H F H                                                 4  5  6  7
    F F F H                                                 8  9 10 11
    H F F G                                                12 13 14 15

The behaviour policy is "safe exploration": with probability 1/2 it follows a fixed reasonable
policy (`FIXED`), otherwise it picks uniformly among the actions it allows in that state. It
never takes the action `FORBIDDEN[s]` in state s, so that action is logged as an untaken
candidate only: in-support values differ from the true optimum there (at state 10 the
forbidden action, down, is the unique optimal one), and the conservative penalty has unseen
actions to act on (most forbidden actions step into a hole).
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict

import numpy as np

MAP = ("SFFF", "FHFH", "FFFH", "HFFG")
N_ROWS = N_COLS = 4
N_STATES = N_ROWS * N_COLS
LEFT, DOWN, RIGHT, UP = range(4)
ACTIONS = (LEFT, DOWN, RIGHT, UP)
ACTION_TEXT = ("move left", "move down", "move right", "move up")
TASK = "Walk across the frozen lake to the goal without falling into a hole."

HOLES = frozenset(r * N_COLS + c for r, row in enumerate(MAP) for c, ch in enumerate(row) if ch == "H")
GOAL = next(r * N_COLS + c for r, row in enumerate(MAP) for c, ch in enumerate(row) if ch == "G")
START = 0
TERMINAL = HOLES | {GOAL}
NON_TERMINAL = tuple(s for s in range(N_STATES) if s not in TERMINAL)

# A reasonable fixed policy (shortest safe path avoiding the forbidden actions) ...
FIXED = {0: DOWN, 1: LEFT, 2: DOWN, 3: LEFT, 4: DOWN, 6: DOWN, 8: RIGHT, 9: DOWN, 10: LEFT, 13: RIGHT, 14: RIGHT}
# ... and the one action the behaviour policy never takes in each state.
FORBIDDEN = {0: UP, 1: DOWN, 2: LEFT, 3: DOWN, 4: RIGHT, 6: RIGHT, 8: DOWN, 9: UP, 10: DOWN, 13: LEFT, 14: UP}
assert all(FIXED[s] != FORBIDDEN[s] for s in NON_TERMINAL)
assert set(FIXED) == set(FORBIDDEN) == set(NON_TERMINAL)

_ORD = ("first", "second", "third", "fourth")
_CELL = {"S": "the start", "F": "frozen ice", "H": "a hole", "G": "the goal"}


def rc(s: int) -> tuple[int, int]:
    return divmod(s, N_COLS)


def step(s: int, a: int) -> tuple[int, float, bool]:
    """FrozenLake's deterministic dynamics: (next state, reward, terminated)."""
    r, c = rc(s)
    if a == LEFT:
        c = max(c - 1, 0)
    elif a == DOWN:
        r = min(r + 1, N_ROWS - 1)
    elif a == RIGHT:
        c = min(c + 1, N_COLS - 1)
    elif a == UP:
        r = max(r - 1, 0)
    else:
        raise ValueError(a)
    s2 = r * N_COLS + c
    return s2, float(s2 == GOAL), s2 in TERMINAL


def _look(r: int, c: int) -> str:
    return _CELL[MAP[r][c]] if 0 <= r < N_ROWS and 0 <= c < N_COLS else "the shore"


def observation(s: int) -> str:
    """The state as text: position plus what lies in each direction (unique per cell)."""
    r, c = rc(s)
    if s in HOLES:
        return f"You fell through the ice into a hole at row {r + 1}, column {c + 1}."
    if s == GOAL:
        return f"You reached the goal at row {r + 1}, column {c + 1}."
    return (f"You stand on the frozen lake at row {r + 1}, column {c + 1} "
            f"({_ORD[r]} row from the top, {_ORD[c]} column from the left). "
            f"North: {_look(r - 1, c)}. South: {_look(r + 1, c)}. West: {_look(r, c - 1)}. East: {_look(r, c + 1)}.")


def behaviour(s: int, rng: random.Random, p_fixed: float = 0.5) -> int:
    if rng.random() < p_fixed:
        return FIXED[s]
    return rng.choice([a for a in ACTIONS if a != FORBIDDEN[s]])


def log_episodes(n: int, seed: int, max_steps: int = 25, random_start: bool = True) -> list[bytes]:
    """`n` episodes of the behaviour policy as native JSONL lines.

    Every step logs all four actions as `candidates` and, as `result`, the observation it led
    to (so the last step of an episode cut by `max_steps` still has its true next state).
    Episodes that enter a hole or the goal end with `end_reason: agent_stop` (terminated);
    the others with `max_steps` (truncated, bootstrapped).
    """
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        s = rng.choice(NON_TERMINAL) if random_start else START
        steps, success, done = [], False, False
        while not done and len(steps) < max_steps:
            a = behaviour(s, rng)
            s2, reward, done = step(s, a)
            success = s2 == GOAL
            steps.append({"observation": observation(s), "action": ACTION_TEXT[a],
                          "candidates": list(ACTION_TEXT), "result": observation(s2), "done": done})
            s = s2
        record = {"episode_id": f"frozenlake-{seed}-{i}", "task": TASK, "steps": steps,
                  "outcome": {"success": success}, "end_reason": "agent_stop" if done else "max_steps"}
        lines.append(json.dumps(record).encode())
    return lines


# ---- exact values ----------------------------------------------------------------------------
def support_from_pairs(pairs) -> dict[int, set[int]]:
    """In-data actions per state from (state, action) pairs."""
    out: dict[int, set[int]] = defaultdict(set)
    for s, a in pairs:
        out[s].add(a)
    return dict(out)


def value_iteration(gamma: float, support: dict[int, set[int]] | None = None,
                    tol: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    """V and Q (N_STATES x 4) of the optimal policy restricted to `support[s]` (all actions when
    None). Terminal states have V = 0. States with an empty support keep V = 0."""
    V = np.zeros(N_STATES)
    while True:
        Q = np.zeros((N_STATES, len(ACTIONS)))
        for s in NON_TERMINAL:
            for a in ACTIONS:
                s2, r, term = step(s, a)
                Q[s, a] = r + (0.0 if term else gamma * V[s2])
        V_new = np.zeros(N_STATES)
        for s in NON_TERMINAL:
            acts = ACTIONS if support is None else sorted(support.get(s, ()))
            V_new[s] = max((Q[s, a] for a in acts), default=0.0)
        if np.max(np.abs(V_new - V)) < tol:
            return V_new, Q
        V = V_new


def expectile(values: np.ndarray, weights: np.ndarray, tau: float) -> float:
    """The tau-expectile m of a discrete distribution: tau E[(x-m)+] = (1-tau) E[(m-x)+]."""
    lo, hi = float(values.min()), float(values.max())
    for _ in range(100):
        m = (lo + hi) / 2
        up = tau * np.sum(weights * np.clip(values - m, 0, None))
        down = (1 - tau) * np.sum(weights * np.clip(m - values, 0, None))
        lo, hi = (m, hi) if up > down else (lo, m)
    return (lo + hi) / 2


def iql_fixed_point(gamma: float, tau: float, counts: dict[int, Counter], tol: float = 1e-12) -> np.ndarray:
    """The exact (tabular) IQL fixed point on deterministic dynamics: V(s) is the tau-expectile of
    Q(s, a) = r + gamma V(s') under the logged action frequencies `counts[s]`."""
    V = np.zeros(N_STATES)
    while True:
        V_new = np.zeros(N_STATES)
        for s, cnt in counts.items():
            acts = sorted(cnt)
            q = np.array([(lambda s2, r, t: r + (0.0 if t else gamma * V[s2]))(*step(s, a)) for a in acts])
            w = np.array([cnt[a] for a in acts], dtype=float)
            V_new[s] = expectile(q, w / w.sum(), tau)
        if np.max(np.abs(V_new - V)) < tol:
            return V_new
        V = V_new
