"""One episode's steps -> (s, a, r, s', done) transitions with rendered states and rewards.

Pure and per-episode, so the pipeline can run it in parallel over episode groups.
"""

from __future__ import annotations

import json
from typing import Any

from harnessrl.encoders import text_hash
from harnessrl.features import defined_tools
from harnessrl.render import Renderer, Turn, status_value
from harnessrl.rewards import RewardRecipe


def untaken_candidates(action: str, candidates: list[str] | None, limit: int | None = None) -> list[str]:
    """The step's alternatives to the taken action, at most `limit`, chosen by content hash
    (a stable, order-independent sample when a step offers more)."""
    others = {c for c in candidates or () if c != action}
    return sorted(others, key=text_hash)[:limit]


def episode_transitions(
    episode: dict[str, Any],
    steps: list[dict[str, Any]],
    recipe: RewardRecipe,
    renderer: Renderer | None = None,
) -> list[dict[str, Any]]:
    """States are rendered by `renderer` (default settings when None), as the service renders a
    request. `features` are the taken action's history features, `candidate_features` those of each
    untaken candidate in `untaken_candidates` order (the encode stage keeps a prefix of it)."""
    renderer = renderer or Renderer()
    steps = sorted(steps, key=lambda s: s["step_idx"])
    n = len(steps)
    task = episode.get("task_text") or ""
    # The result of step t is its own result text, else what the agent saw next.
    results = [
        s.get("result_text") or (steps[t + 1].get("obs_text") or "" if t + 1 < n else "") for t, s in enumerate(steps)
    ]
    turns = [Turn(s["action_text"], results[t], _status(s.get("info"), renderer.cfg.status_from)) for t, s in
             enumerate(steps)]
    # Rewards per kept step: a safety stop ends the episode at its step (done), later steps are dropped.
    defined = defined_tools(episode.get("tool_definitions"))
    scored = recipe.evaluate(episode, steps)
    components, rewards, rtg, stop = scored.components, scored.rewards, scored.return_to_go, scored.terminate_at
    out = []
    for t, s in enumerate(steps[: len(components)]):
        obs = s.get("obs_text") or ""
        next_obs = steps[t + 1].get("obs_text") or "" if t + 1 < n else results[t]
        out.append(
            {
                "episode_id": episode["episode_id"],
                "step_idx": int(s["step_idx"]),
                "task_id": episode.get("task_id"),
                "group_id": episode.get("group_id"),
                "state_text": renderer.text(task, turns[:t], obs),
                "action_text": s["action_text"],
                "tool": renderer.tool(s["action_text"]),
                "defined_tools": defined,
                "features": renderer.features(turns[:t], obs, [s["action_text"]])[0],
                "reward": rewards[t],
                "reward_components": components[t],
                "next_state_text": renderer.text(task, turns[: t + 1], next_obs),
                "done": bool(s.get("terminated")) or t == stop,
                "truncated": bool(s.get("truncated")) and t != stop,
                "return_to_go": rtg[t],
                "outcome_success": episode.get("outcome_success"),
                "candidates": s.get("candidates"),
                "candidate_features": renderer.features(
                    turns[:t], obs, untaken_candidates(s["action_text"], s.get("candidates"))),
                "info": s.get("info") or "{}",
                "state_segments": _segments(renderer.segments(task, turns[:t], obs)),
                "next_state_segments": _segments(renderer.segments(task, turns[: t + 1], next_obs)),
            }
        )
    return out


def _status(info: str | dict | None, key: str | None) -> str:
    """The source's status after a step: `key` of its info (a JSON object in the steps table), else its
    `status` (what a request's history item calls it: decision logs turned into logs keep it there)."""
    if not key or not info:
        return ""
    if isinstance(info, str):
        try:
            info = json.loads(info)
        except ValueError:
            return ""
    return status_value(info.get(key, info.get("status"))) if isinstance(info, dict) else ""


def _segments(segments) -> list[dict[str, Any]]:
    return [{"role": s.role, "age": s.age, "text": s.text} for s in segments]
