"""History features of a (state, candidate action) pair, and the tool vocabulary (the tool an
action calls: harnessrl.tool_naming).

Agents loop: the same action from the same situation, again and again. A rendered state
cannot say how often something was already tried, so the critic also reads a few numbers
computed from the episode so far. They are functions of the (action, result) turns and the
current observation only, so the transitions stage and serving (which rebuilds the turns from
the request's history) compute them with this one module and get identical inputs.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from harnessrl.render import Turn
from harnessrl.rewards import tool_names
from harnessrl.tool_naming import tool_name

FEATURE_NAMES = ("times_taken", "times_taken_here", "steps_since_new_result", "step_idx", "tool_uses")


def action_features(history: Sequence[Turn], observation: str, candidate: str, tool_from: str = "calls") -> list[float]:
    """FEATURE_NAMES for taking `candidate` after `history` while seeing `observation`.

    Counts are log1p-compressed so a loop of 50 does not dwarf everything the critic saw in training.
    """
    t = len(history)
    results = [h.result for h in history]
    taken = sum(h.action == candidate for h in history)
    taken_here = _times_taken_here(history, observation, candidate)
    seen: set[str] = set()
    last_new = 0
    for i, r in enumerate(results):
        if r not in seen:
            seen.add(r)
            last_new = i + 1
    tool = tool_name(candidate, tool_from)
    uses = sum(tool_name(h.action, tool_from) == tool for h in history)
    return [math.log1p(taken), math.log1p(taken_here), math.log1p(t - last_new), math.log1p(t), math.log1p(uses)]


def _times_taken_here(history: Sequence[Turn], observation: str, candidate: str) -> int:
    """How often `candidate` was taken while the agent saw `observation` (the result of the turn
    before; the first action's is unknown and counts as empty)."""
    before = [""] + [h.result for h in history[:-1]]
    here = observation.strip()
    return sum(h.action == candidate and b.strip() == here for h, b in zip(history, before))


def repeats_here(history: Sequence[Turn], observation: str, candidates: Sequence[str]) -> list[int]:
    """Indices of the candidates already taken from this same observation: choosing one again
    is how an agent loops (the serving and benchmark `avoid_repeats` rule skips them)."""
    return [i for i, c in enumerate(candidates) if _times_taken_here(history, observation, c)]


def features_for(history: Sequence[Turn], observation: str, candidates: Sequence[str],
                 tool_from: str = "calls") -> list[list[float]]:
    return [action_features(history, observation, c, tool_from) for c in candidates]


OTHER_TOOL = "<other>"


def defined_tools(tool_definitions: Any) -> list[str]:
    """The tools an episode's `tool_definitions` define, named as `tool_name` names a call
    (lower case), sorted: a tool the agent could call is a choice even if the logs never call it."""
    return sorted({name.lower() for name in tool_names(tool_definitions)})


def tool_vocabulary(counts: dict[str, int], max_tools: int, defined: Sequence[str] = ()) -> list[str]:
    """Tools by frequency (ties by name), then the `defined` tools never called (ties by name);
    past `max_tools` the rarest share one `<other>` slot, so defined-only tools go there first."""
    counts = {**{t: 0 for t in defined}, **counts}
    ranked = sorted(counts, key=lambda k: (-counts[k], k))
    return ranked if len(ranked) <= max_tools else ranked[: max_tools - 1] + [OTHER_TOOL]


def tool_ids(vocab: Sequence[str], tools: Sequence[str]) -> list[int]:
    index = {t: i for i, t in enumerate(vocab)}
    other = index.get(OTHER_TOOL, -1)
    return [index.get(t, other) for t in tools]
