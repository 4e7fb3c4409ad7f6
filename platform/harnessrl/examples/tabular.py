"""Text-rendered tabular MDPs with exact Q*, logged in the native format (issue 13's check).

Why: on a task whose every state-action the logs cover and whose optimal values are known
exactly, a critic that reads its states must choose optimally and rank its values with Q*. If it
does not, what it sees (not the RL objective) is at fault. Three of gymnasium's toy-text MDPs, all
deterministic, each rendered in words in two wordings:

- `frozenlake`: FrozenLake-v1 4x4, `is_slippery=False` (holes end the episode, the goal gives 1);
  wording `a` describes what lies in each direction, `b` gives the position as numbers beside a
  static list of the holes (the state differs from its neighbours in one number).
- `cliffwalking`: CliffWalking-v1 4x12 (-1 per step, -100 and back to the start on the cliff).
- `taxi`: Taxi-v4 5x5 (-1 per step, -10 for a wrong pickup or drop-off, +20 for the delivery).

Values are in the units of a reward recipe (`default`: the logged reward x `source_reward`,
`-step_cost` per step, `success` / `failure` on the terminal step), with the pipeline's discount,
so that Q* is what the pipeline's critic estimates. Logs: an epsilon-greedy policy around Q* from
uniformly drawn non-terminal start states and a uniformly drawn first action ("exploring
starts"), every action of the task logged as
`candidates`; an episode ends on a terminal state (`agent_stop`) or at `max_steps` (truncated).

    python -m harnessrl.examples.tabular --task taxi --wording a --episodes 2000 --out /tmp/taxi.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

TASKS = ("frozenlake", "cliffwalking", "taxi")
WORDINGS = ("a", "b")


@dataclass(frozen=True)
class Step:
    next_state: int
    reward: float  # the environment's own reward (logged as the step's `reward`)
    terminal: bool


@dataclass
class TabularMDP:
    """A deterministic MDP with text renderings of its states and actions."""

    name: str
    wording: str
    task_text: str
    actions: tuple[str, ...]
    dynamics: dict[int, list[Step]]  # non-terminal state -> one Step per action
    observation: Callable[[int], str]
    success: Callable[[int], bool]  # for a terminal next state: did the episode succeed?
    reachable: tuple[int, ...]  # the non-terminal states scored (those an episode can be in)

    @cached_property
    def states(self) -> tuple[int, ...]:
        return tuple(sorted(self.dynamics))

    def reward(self, s: int, a: int, weights: dict[str, float]) -> float:
        """The reward recipe's reward of taking `a` in `s` (DESIGN §5 components, as rewards.py
        computes them for these logs: source x weight, -step_cost, the outcome on terminal steps)."""
        st = self.dynamics[s][a]
        r = weights.get("source_reward", 1.0) * st.reward - weights.get("step_cost", 0.0)
        if st.terminal:
            r += weights.get("success", 0.0) if self.success(st.next_state) else weights.get("failure", 0.0)
        return r

    def q_star(self, gamma: float, weights: dict[str, float], tol: float = 1e-10) -> np.ndarray:
        """Q*(s, a) for every state of `dynamics` (rows indexed by `states`), by value iteration."""
        index = {s: i for i, s in enumerate(self.states)}
        n_a = len(self.actions)
        R = np.array([[self.reward(s, a, weights) for a in range(n_a)] for s in self.states])
        nxt = np.array([[index.get(self.dynamics[s][a].next_state, -1) for a in range(n_a)] for s in self.states])
        term = np.array([[self.dynamics[s][a].terminal for a in range(n_a)] for s in self.states])
        V = np.zeros(len(self.states))
        for _ in range(100_000):
            Q = R + gamma * np.where(term | (nxt < 0), 0.0, V[np.maximum(nxt, 0)])
            V_new = Q.max(1)
            if np.max(np.abs(V_new - V)) < tol:
                return Q
            V = V_new
        raise RuntimeError(f"{self.name}: value iteration did not converge")

    def episodes(self, n: int, seed: int, epsilon: float, gamma: float, weights: dict[str, float],
                 max_steps: int) -> list[dict]:
        """`n` native-format episodes of the epsilon-greedy policy around Q* (ties at random)."""
        rng = random.Random(f"tabular:{self.name}:{self.wording}:{seed}")
        Q = self.q_star(gamma, weights)
        index = {s: i for i, s in enumerate(self.states)}
        out = []
        for e in range(n):
            s = rng.choice(self.reachable)
            steps, success, done = [], False, False
            while not done and len(steps) < max_steps:
                q = Q[index[s]]
                best = [a for a in range(len(self.actions)) if q[a] >= q.max() - 1e-9]
                explore = not steps or rng.random() < epsilon  # exploring starts: the first action at random
                a = rng.randrange(len(self.actions)) if explore else rng.choice(best)
                st = self.dynamics[s][a]
                done = st.terminal
                success = done and self.success(st.next_state)
                steps.append({"observation": self.observation(s), "action": self.actions[a],
                              "candidates": list(self.actions), "result": self.observation(st.next_state),
                              "reward": float(st.reward), "done": done, "info": {"state": int(s)}})
                s = st.next_state
            out.append({"episode_id": f"{self.name}-{self.wording}-{seed}-{e}", "task_id": f"{self.name}/{e}",
                        "group_id": f"{self.name}/{self.wording}/{e}", "task": self.task_text, "steps": steps,
                        "outcome": {"success": success}, "end_reason": "agent_stop" if done else "max_steps",
                        "metadata": {"task": self.name, "wording": self.wording}})
        return out


def _gym(env_id: str, **kwargs):
    import gymnasium as gym

    return gym.make(env_id, **kwargs).unwrapped


def _dynamics(env, terminal_states: set[int]) -> dict[int, list[Step]]:
    out = {}
    for s in range(env.observation_space.n):
        if s in terminal_states:
            continue
        row = []
        for a in range(env.action_space.n):
            ((p, s2, r, term),) = env.P[s][a]
            row.append(Step(int(s2), float(r), bool(term)))
        out[s] = row
    return out


# ---- FrozenLake ---------------------------------------------------------------------------------
_FL_CELL = {"S": "the start", "F": "frozen ice", "H": "a hole", "G": "the goal"}
_ORD = ("first", "second", "third", "fourth")


def frozenlake(wording: str = "a") -> TabularMDP:
    env = _gym("FrozenLake-v1", is_slippery=False, map_name="4x4")
    grid = [row.decode() if isinstance(row, bytes) else "".join(c.decode() for c in row) for row in env.desc]
    n = len(grid)
    cell = lambda s: grid[s // n][s % n]  # noqa: E731
    holes = [s for s in range(n * n) if cell(s) == "H"]
    goal = next(s for s in range(n * n) if cell(s) == "G")

    def look(r: int, c: int) -> str:
        return _FL_CELL[grid[r][c]] if 0 <= r < n and 0 <= c < n else "the shore"

    def obs_a(s: int) -> str:
        r, c = divmod(s, n)
        if cell(s) == "H":
            return f"You fell through the ice into a hole at row {r + 1}, column {c + 1}."
        if cell(s) == "G":
            return f"You reached the goal at row {r + 1}, column {c + 1}."
        return (f"You stand on the frozen lake at row {r + 1}, column {c + 1} ({_ORD[r]} row from the top, "
                f"{_ORD[c]} column from the left). North: {look(r - 1, c)}. South: {look(r + 1, c)}. "
                f"West: {look(r, c - 1)}. East: {look(r, c + 1)}.")

    def obs_b(s: int) -> str:
        r, c = divmod(s, n)
        where = f"You are at row {r + 1}, column {c + 1} of a {n}x{n} frozen lake."
        if cell(s) == "H":
            return where + " The ice broke: you are in a hole."
        if cell(s) == "G":
            return where + " You made it to the goal."
        hs = ", ".join(f"({h // n + 1}, {h % n + 1})" for h in holes)
        return f"{where} Holes at {hs}. The goal is at ({goal // n + 1}, {goal % n + 1})."

    terminal = set(holes) | {goal}
    dyn = _dynamics(env, terminal)
    texts = {"a": (("move left", "move down", "move right", "move up"),
                   "Walk across the frozen lake to the goal without falling into a hole.", obs_a),
             "b": (("go west", "go south", "go east", "go north"),
                   "Reach the goal cell of the lake; holes end the walk.", obs_b)}
    actions, task, obs = texts[wording]
    return TabularMDP("frozenlake", wording, task, actions, dyn, obs, lambda s: s == goal, tuple(sorted(dyn)))


# ---- CliffWalking -------------------------------------------------------------------------------
def cliffwalking(wording: str = "a") -> TabularMDP:
    env = _gym("CliffWalking-v1")
    rows, cols = env.shape
    goal = rows * cols - 1
    cliff = {s for s in range(rows * cols) if env._cliff[divmod(s, cols)]}

    def obs_a(s: int) -> str:
        r, c = divmod(s, cols)
        if s == goal:
            return f"You reached the goal at row {r + 1}, column {c + 1}."
        return (f"You are at row {r + 1}, column {c + 1} of a {rows} by {cols} grid. The cliff runs along the "
                "bottom row between the start (bottom left) and the goal (bottom right).")

    def obs_b(s: int) -> str:
        r, c = divmod(s, cols)
        x, y = c, rows - 1 - r
        if s == goal:
            return f"Position x={x}, y={y}: the goal."
        return f"Position x={x}, y={y} (origin at the bottom left). Cliff cells: y=0, x=1 to {cols - 2}. Goal: x={cols - 1}, y=0."

    dyn = _dynamics(env, cliff | {goal})
    texts = {"a": (("move up", "move right", "move down", "move left"),
                   "Walk from the start to the goal along the cliff edge without falling off.", obs_a),
             "b": (("north", "east", "south", "west"), "Get to the goal cell; stepping on the cliff sends you back.",
                   obs_b)}
    actions, task, obs = texts[wording]
    return TabularMDP("cliffwalking", wording, task, actions, dyn, obs, lambda s: s == goal, tuple(sorted(dyn)))


# ---- Taxi ---------------------------------------------------------------------------------------
_TAXI_COLOURS = ("red", "green", "yellow", "blue")
_TAXI_LETTERS = ("R", "G", "Y", "B")


def taxi(wording: str = "a") -> TabularMDP:
    env = _gym("Taxi-v4")

    def obs_a(s: int) -> str:
        r, c, p, d = env.decode(s)
        where = f"The taxi is at row {r + 1}, column {c + 1} of a 5 by 5 town."
        who = ("The passenger is in the taxi." if p == 4 else f"The passenger waits at the {_TAXI_COLOURS[p]} stand.")
        if p == d:
            who = f"The passenger got out at the {_TAXI_COLOURS[d]} stand."
        return f"{where} {who} The destination is the {_TAXI_COLOURS[d]} stand."

    def obs_b(s: int) -> str:
        r, c, p, d = env.decode(s)
        rider = "riding" if p == 4 else f"at pickup point {_TAXI_LETTERS[p]}"
        return f"Cab at x={c}, y={r}. Rider: {rider}. Drop-off point: {_TAXI_LETTERS[d]}."

    # The delivery ends the episode (terminal); states with the passenger at the destination and
    # not in the taxi are never entered.
    reachable = tuple(s for s in range(500) if env.decode(s)[2] != env.decode(s)[3])
    dyn = _dynamics(env, set())
    dyn = {s: dyn[s] for s in reachable}
    texts = {"a": (("drive south", "drive north", "drive east", "drive west", "pick up the passenger",
                    "drop off the passenger"), "Pick up the passenger and drive them to their destination.", obs_a),
             "b": (("south", "north", "east", "west", "pickup", "dropoff"),
                   "Deliver the rider to the drop-off point.", obs_b)}
    actions, task, obs = texts[wording]
    return TabularMDP("taxi", wording, task, actions, dyn, obs, lambda s: True, reachable)


BUILDERS = {"frozenlake": frozenlake, "cliffwalking": cliffwalking, "taxi": taxi}
# Episodes that cover every state-action of each task several times at epsilon 0.3 (exploring starts).
DEFAULT_EPISODES = {"frozenlake": 300, "cliffwalking": 600, "taxi": 2500}
MAX_STEPS = {"frozenlake": 25, "cliffwalking": 60, "taxi": 60}


def build(task: str, wording: str = "a") -> TabularMDP:
    if task not in BUILDERS:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    if wording not in WORDINGS:
        raise ValueError(f"unknown wording {wording!r}; known: {', '.join(WORDINGS)}")
    return BUILDERS[task](wording)


def coverage(mdp: TabularMDP, episodes: list[dict]) -> float:
    """Share of the reachable state-action pairs the logs take at least once."""
    seen = {(s["info"]["state"], s["action"]) for e in episodes for s in e["steps"]}
    want = {(s, a) for s in mdp.reachable for a in mdp.actions}
    return len(seen & want) / len(want)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harnessrl.examples.tabular", description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=TASKS, required=True)
    p.add_argument("--wording", choices=WORDINGS, default="a")
    p.add_argument("--episodes", type=int)
    p.add_argument("--epsilon", type=float, default=0.3)
    p.add_argument("--gamma", type=float, default=0.95, help="the pipeline's train.gamma")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from harnessrl.rewards import load_recipe

    mdp = build(args.task, args.wording)
    eps = mdp.episodes(args.episodes or DEFAULT_EPISODES[args.task], args.seed, args.epsilon, args.gamma,
                       load_recipe("default").model_dump(), MAX_STEPS[args.task])
    with open(args.out, "w") as fh:
        for e in eps:
            fh.write(json.dumps(e) + "\n")
    print(json.dumps({"episodes": len(eps), "steps": sum(len(e["steps"]) for e in eps),
                      "coverage": round(coverage(mdp, eps), 4), "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
