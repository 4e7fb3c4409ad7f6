"""Generate a reproducible corpus of TextWorldExpress episodes in harnessrl's native JSONL format.

Why this exists
---------------
harnessrl learns critics (value / advantage estimates over candidate actions) from the logs
that LLM agents leave behind. To develop and test that without a fleet of real agents we need
logs that look like agent logs -- an observation, a set of candidate actions, the action taken,
a reward, an outcome -- *and* that carry a ground truth a critic can be scored against. Text
games give both: TextWorldExpress (TWX) is fast (a step is ~0.2 ms), lists the valid actions at
every step (our `candidates`), and ships a scripted gold agent per game family that we use as
the expert.

What is logged
--------------
Each episode is produced by a behaviour policy that mixes the expert with errors, so the corpus
holds successes and failures, long and short episodes, and good and bad actions taken from the
same kind of state:

* ``careful``  (~25 %): expert 0.9, random valid action 0.1
* ``mistaken`` (~50 %): expert 0.35, plausible mistake 0.55, random 0.1
* ``flailing`` (~25 %): expert 0.2, random 0.8

A *plausible mistake* is a valid action with the expert action's verb and another object or
direction ("take red apple" -> "take blue pen", "move north" -> "move south"), i.e. the kind of
error an LLM agent makes, rather than uniform noise. Where no such action exists the agent takes
another random valid action (logged as behaviour "random"); where no expert action is known it
acts at random. Episodes are capped at ``MAX_STEPS``: ``end_reason`` is "agent_stop" when the game
ended (success or failure, last step ``done``) and "max_steps" when cut off (truncated).

The expert label (``info.expert_action``) is for evaluation only. TWX's gold path holds only from
the start state, so after every deviation we re-plan: the episode's history is replayed into a
second ("shadow") game in its own JVM and the family's Java gold agent is asked for a path from
there (``<Family>GoldAgent(game).mkGoldPath(scala.util.Random(k))``). Its path starts with the
history; the remainder is the continuation. We re-plan only after a deviation (some agents are
scripts that restart from any state), drop commands that are not currently valid (the scripts
contain redundant ones), retry a few RNG seeds when a random-walking agent gives up, and record
``null`` when no continuation exists. Three repairs, each found by checking that following the
labels from perturbed states succeeds: map reader's gold agent always navigates from the
*start* room, so its expert is re-implemented here (breadth-first routes over the game's rooms);
sorting's gold agent takes already-boxed objects out again, so those pairs are dropped; and when
a gold agent aborts on a state its script did not expect (cookingworld, when the agent already
holds an ingredient), a one-step look-ahead over put/take/open actions finds the shortest
continuation that works. Information actions the agent already took (``task``,
``read map``, ``read cookbook``, ``read math problem``, and ``look around`` -- the reset
observation *is* the room description, and moving prints the new room) are stripped from
continuations, otherwise the labels would teach no-op reading loops. ``read instructions book``
(pecking order) changes content as the task advances, so it is stripped only when it was
already read since the score last changed.

Reproducibility
---------------
Everything is a deterministic function of the master seed: task ``j`` of a fold takes its
family from a shuffled round of all eight (``random.Random(f"{seed}:{fold}:round:{j // 8}")``),
and draws its game seed (from the fold's seeds: train 0-999, test 20000-20999; redrawn if the
gold agent cannot solve the game from the start) and its number of attempts (1-3) from
``random.Random(f"{seed}:{fold}:task:{j}")``; attempt ``a`` draws its agent kind and every
behaviour choice from ``random.Random(f"{seed}:{fold}:{j}:{a}")``;
the gold agent gets explicitly seeded ``scala.util.Random`` instances (the package's own
``generateGoldPath`` uses an unseeded one, so we never rely on it). Episodes are written in order,
so ``--limit k`` yields exactly the first ``k`` lines of the full files. Output is gzip with
``mtime=0`` and no file name, JSON with sorted keys, so a rebuild is bit-for-bit identical
(given the same zlib).

Usage::

    python -m harnessrl.examples.twx --out platform/harnessrl/examples/data
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import io
import json
import os
import random
import sys
import time
from typing import Any, Iterator

from harnessrl.examples.twx_expert import (FAMILIES, FAMILY_PARAMS, MAX_STEPS, _drop_unusable, _Engine, _gold_key,
                                            _InfoTracker, _verb)

GENERATOR = "harnessrl.examples.twx"
GENERATOR_VERSION = 1
AGENT_NAME = "twx-behaviour-mix"

DEFAULT_SEED = 0
DEFAULT_TRAIN_EPISODES = 300
DEFAULT_TEST_EPISODES = 80

# (name, share of episodes, P(expert), P(plausible mistake)); the rest is a random valid action.
AGENT_KINDS: tuple[tuple[str, float, float, float], ...] = (
    ("careful", 0.25, 0.90, 0.00),
    ("mistaken", 0.50, 0.35, 0.55),
    ("flailing", 0.25, 0.20, 0.00),
)
# Number of attempts per task (same family + seed, different behaviour draws).
_ATTEMPT_CHOICES = (1, 2, 3)
_ATTEMPT_WEIGHTS = (0.4, 0.35, 0.25)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _mistake_pool(expert: str, candidates: list[str]) -> tuple[str, list[str]]:
    """(behaviour label, actions) of a plausible mistake: the other candidates with the expert's
    verb; else every other candidate (a random action); else the expert itself."""
    same_verb = [c for c in candidates if c != expert and _verb(c) == _verb(expert)]
    if same_verb:
        return "mistake", same_verb
    others = [c for c in candidates if c != expert]
    if others:
        return "random", others
    return "expert", [expert]


@dataclasses.dataclass(frozen=True)
class BehaviourStep:
    """A behaviour agent's choice at one step, as the mixture it draws from: `parts` are
    (label, weight, actions) in order. `sample` draws u = rng.random(), takes the first part whose
    cumulative weight passes u (the last one otherwise) and then rng.choice of its actions, except
    that an "expert" part is the expert itself, taken without a draw: exactly the generator's
    draws. `probabilities` reads the same parts, so a logprob computed from it is that of the
    draw `sample` makes (bench/twx.py's rerank protocol sends both to the critic)."""

    parts: tuple[tuple[str, float, tuple[str, ...]], ...]

    def sample(self, rng: random.Random) -> tuple[str, str]:
        """(action, behaviour label)."""
        u = rng.random()
        acc = 0.0
        for i, (label, weight, actions) in enumerate(self.parts):
            acc += weight
            if u < acc or i == len(self.parts) - 1:
                return (actions[0] if label == "expert" else rng.choice(actions)), label
        raise AssertionError("unreachable: a step has at least one part")

    def probabilities(self) -> dict[str, float]:
        """P(action) over the actions the agent can take (every candidate when a random part has
        weight), in first-seen order: sum over parts of weight * (share of the part's actions)."""
        out: dict[str, float] = {}
        for _label, weight, actions in self.parts:
            for a in actions:
                out[a] = out.get(a, 0.0) + weight / len(actions)
        return out


def behaviour_step(p_expert: float, p_mistake: float, expert: str | None, candidates: list[str]) -> BehaviourStep:
    """The generator's behaviour agent (AGENT_KINDS' P(expert), P(plausible mistake)) at a step:
    P(a) = p_expert [a = expert] + p_mistake P_mistake(a) + (1 - p_expert - p_mistake) / |candidates|,
    P_mistake uniform over `_mistake_pool`; uniform over the candidates when no expert is known."""
    if not candidates:
        raise ValueError("a step needs at least one candidate action")
    cands = tuple(candidates)
    if expert is None:
        return BehaviourStep((("random", 1.0, cands),))
    label, pool = _mistake_pool(expert, candidates)
    return BehaviourStep((("expert", p_expert, (expert,)), (label, p_mistake, tuple(pool)),
                          ("random", 1.0 - p_expert - p_mistake, cands)))


def _draw_agent(rng: random.Random) -> tuple[str, float, float]:
    u = rng.random()
    acc = 0.0
    for name, share, p_expert, p_mistake in AGENT_KINDS:
        acc += share
        if u < acc:
            return name, p_expert, p_mistake
    name, _, p_expert, p_mistake = AGENT_KINDS[-1]
    return name, p_expert, p_mistake


def _run_episode(engine: _Engine, family: str, fold: str, seed: int, attempt: int, rng: random.Random) -> dict:
    agent, p_expert, p_mistake = _draw_agent(rng)
    env = engine.env
    obs, info = env.reset(
        seed=seed, gameFold=fold, gameName=family, gameParams=FAMILY_PARAMS[family], generateGoldPath=False
    )
    task = str(info["taskDescription"])
    history: list[str] = []
    tracker = _InfoTracker()
    plan: list[str] | None = None  # None: (re-)plan before the next step
    steps: list[dict] = []
    score = float(info["score"])
    done = False
    for t in range(MAX_STEPS):
        candidates = [str(a) for a in info["validActions"]]
        cand_set = set(candidates)
        if plan is not None:
            _drop_unusable(plan, cand_set, tracker)
        if not plan:  # deviated, or the plan ran dry before the game ended
            plan = engine.plan(family, fold, seed, history, _gold_key(seed, t), candidates) or []
            _drop_unusable(plan, cand_set, tracker)
        expert = plan[0] if plan else None

        action, behaviour = behaviour_step(p_expert, p_mistake, expert, candidates).sample(rng)

        if expert is not None and action == expert:
            plan.pop(0)
        else:
            plan = None  # deviated (or no expert known): re-plan from the new state

        new_obs, reward, done, info = env.step(action)
        new_score = float(info["score"])
        tracker.record(action, score_changed=new_score != score)
        score = new_score
        history.append(action)
        steps.append(
            {
                "observation": str(obs),
                "action": action,
                "reward": round(float(reward), 6),
                "candidates": candidates,
                "info": {"expert_action": expert, "behaviour": behaviour, "score": round(score, 6)},
                "done": bool(done),
            }
        )
        obs = new_obs
        if done:
            break
    steps[-1]["result"] = str(obs)

    group = f"{family}/{fold}/{seed}"
    return {
        "episode_id": f"twx-{family}-{fold}-{seed}-a{attempt}",
        "task_id": group,
        "group_id": group,
        "task": task,
        "agent_name": AGENT_NAME,
        "steps": steps,
        "outcome": {"success": bool(info["tasksuccess"]), "score": round(score, 6)},
        "end_reason": "agent_stop" if done else "max_steps",
        "metadata": {
            "family": family,
            "fold": fold,
            "seed": seed,
            "attempt": attempt,
            "agent": agent,
            "generator": GENERATOR,
            "generator_version": GENERATOR_VERSION,
        },
    }


def _iter_episodes(engine: _Engine, fold: str, master_seed: int, n_episodes: int) -> Iterator[dict]:
    used: set[tuple[str, int]] = set()
    produced = 0
    j = 0
    while produced < n_episodes:
        # Families are dealt in shuffled rounds of all eight, so even a small fold is balanced.
        round_order = list(FAMILIES)
        random.Random(f"{master_seed}:{fold}:round:{j // len(FAMILIES)}").shuffle(round_order)
        family = round_order[j % len(FAMILIES)]
        trng = random.Random(f"{master_seed}:{fold}:task:{j}")
        while True:
            seed = trng.choice(engine.seeds[fold])
            if (family, seed) in used:
                continue
            used.add((family, seed))
            # Skip games whose gold agent cannot solve them from the start.
            if engine.plan(family, fold, seed, [], _gold_key(seed, 0)):
                break
        n_attempts = trng.choices(_ATTEMPT_CHOICES, weights=_ATTEMPT_WEIGHTS)[0]
        for attempt in range(n_attempts):
            if produced >= n_episodes:
                break
            rng = random.Random(f"{master_seed}:{fold}:{j}:{attempt}")
            yield _run_episode(engine, family, fold, seed, attempt, rng)
            produced += 1
        j += 1


def _write_jsonl_gz(path: str, lines: list[str]) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as gz:
        for line in lines:
            gz.write(line.encode("utf-8"))
            gz.write(b"\n")
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def summarize(episodes: list[dict]) -> dict:
    """Corpus statistics: counts, success rates, step shares."""
    by_family = collections.Counter(e["metadata"]["family"] for e in episodes)
    by_agent: dict[str, dict[str, float]] = {}
    for kind in sorted({e["metadata"]["agent"] for e in episodes}):
        eps = [e for e in episodes if e["metadata"]["agent"] == kind]
        by_agent[kind] = {
            "episodes": len(eps),
            "success_rate": sum(e["outcome"]["success"] for e in eps) / len(eps),
            "mean_steps": sum(len(e["steps"]) for e in eps) / len(eps),
        }
    steps = [s for e in episodes for s in e["steps"]]
    n_steps = max(len(steps), 1)
    n_eps = max(len(episodes), 1)
    return {
        "episodes": len(episodes),
        "steps": len(steps),
        "by_family": dict(sorted(by_family.items())),
        "by_agent": by_agent,
        "success_rate": sum(e["outcome"]["success"] for e in episodes) / n_eps,
        "mean_steps": len(steps) / n_eps,
        "truncated_share": sum(e["end_reason"] == "max_steps" for e in episodes) / n_eps,
        "action_equals_expert_share": sum(s["action"] == s["info"]["expert_action"] for s in steps) / n_steps,
        "expert_label_share": sum(s["info"]["expert_action"] is not None for s in steps) / n_steps,
        "groups_with_multiple_attempts": sum(
            c >= 2 for c in collections.Counter(e["group_id"] for e in episodes).values()
        ),
    }


def generate(
    out_dir: str | os.PathLike,
    seed: int = DEFAULT_SEED,
    train_episodes: int = DEFAULT_TRAIN_EPISODES,
    test_episodes: int = DEFAULT_TEST_EPISODES,
    limit: int | None = None,
) -> dict:
    """Write `out_dir`/twx_train.jsonl.gz and twx_test.jsonl.gz; return a summary per fold.

    `limit` caps each file at its first `limit` episodes (same bytes as the full file's first
    `limit` lines).
    """
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.monotonic()
    summary: dict[str, Any] = {"gold_agent_calls": 0, "gold_agent_failures": 0, "expert_repairs": 0}
    for fold, n in (("train", train_episodes), ("test", test_episodes)):
        if limit is not None:
            n = min(n, limit)
        engine = _Engine()
        try:
            episodes = list(_iter_episodes(engine, fold, seed, n))
        finally:
            engine.close()
        path = os.path.join(os.fspath(out_dir), f"twx_{fold}.jsonl.gz")
        _write_jsonl_gz(path, [_dumps(e) for e in episodes])
        summary[fold] = summarize(episodes)
        summary[fold]["path"] = path
        summary[fold]["bytes"] = os.path.getsize(path)
        summary["gold_agent_calls"] += engine.gold_calls
        summary["gold_agent_failures"] += engine.gold_failures
        summary["expert_repairs"] += engine.repairs
    summary["seconds"] = round(time.monotonic() - t0, 1)
    return summary


def _format_summary(summary: dict) -> str:
    lines = []
    for fold in ("train", "test"):
        s = summary[fold]
        lines.append(
            f"{fold}: {s['episodes']} episodes, {s['steps']} steps -> {s['path']} ({s['bytes']} bytes)\n"
            f"  success rate {s['success_rate']:.3f}, mean steps {s['mean_steps']:.1f}, "
            f"truncated {s['truncated_share']:.3f}\n"
            f"  action == expert in {s['action_equals_expert_share']:.3f} of steps, "
            f"expert label on {s['expert_label_share']:.3f}, "
            f"{s['groups_with_multiple_attempts']} tasks with >=2 attempts\n"
            f"  families: {s['by_family']}"
        )
        for kind, a in s["by_agent"].items():
            lines.append(
                f"  {kind:9s} {a['episodes']:4d} episodes, success {a['success_rate']:.3f}, "
                f"mean steps {a['mean_steps']:.1f}"
            )
    lines.append(
        f"gold agent: {summary['gold_agent_calls']} calls, {summary['gold_agent_failures']} gave up, "
        f"{summary['expert_repairs']} one-step repairs; "
        f"{summary['seconds']} s"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harnessrl.examples.twx", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="master seed")
    parser.add_argument("--train-episodes", type=int, default=DEFAULT_TRAIN_EPISODES)
    parser.add_argument("--test-episodes", type=int, default=DEFAULT_TEST_EPISODES)
    parser.add_argument("--limit", type=int, default=None, help="write only the first K episodes of each file")
    args = parser.parse_args(argv)
    summary = generate(
        args.out,
        seed=args.seed,
        train_episodes=args.train_episodes,
        test_episodes=args.test_episodes,
        limit=args.limit,
    )
    print(_format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
