"""State rendering: one function, used by the transitions stage and by serving alike.

A state is what the agent knew when it decided: the task, the last few (action, result)
pairs, and the current observation, written as text within a character budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from harnessrl.errors import ConfigError


@dataclass(frozen=True)
class Turn:
    action: str
    result: str


def render_state(task: str, history: Sequence[Turn], observation: str, window: int = 4, max_chars: int = 2000) -> str:
    """Render the decision context, most important first: task, current observation, then the
    recent (action, result) pairs newest first. Encoders cut texts at a token limit, so what is
    lost is the oldest history. The newest result is not repeated when it is the observation.
    """
    recent = list(history)[-window:] if window else []
    lines = [f"Task: {task.strip()}"] if task.strip() else []
    if observation.strip():
        lines.append(f"Now: {observation.strip()}")
    for i in range(len(recent) - 1, -1, -1):
        turn = recent[i]
        result = turn.result.strip()
        if i == len(recent) - 1 and result == observation.strip():
            result = ""
        lines.append(f"> {turn.action.strip()}" + (f" -> {result}" if result else ""))
    if len(history) > len(recent):
        lines.append(f"({len(history) - len(recent)} earlier steps)")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


@dataclass(frozen=True)
class RequestState:
    """A request's state, parsed: the rendered text, and the turns and observation that the
    history features read (empty when the request sent already-rendered text)."""

    text: str
    history: tuple[Turn, ...] = ()
    observation: str = ""


def parse_request_state(state: str | dict[str, Any], window: int, max_chars: int) -> RequestState:
    """Already rendered text, or `{task, history[{action, observation}], observation}` rendered
    exactly as the transitions stage renders a logged step (the observation of a history item
    is the result of its action)."""
    if isinstance(state, str):
        return RequestState(state)
    if not isinstance(state, dict):
        raise ConfigError("state must be a string or an object with task/history/observation")
    history = tuple(
        Turn(str(h.get("action", "")), str(h.get("observation", h.get("result", ""))))
        for h in state.get("history") or []
    )
    observation = str(state.get("observation", ""))
    return RequestState(render_state(str(state.get("task", "")), history, observation, window, max_chars),
                        history, observation)


def state_from_request(state: str | dict[str, Any], window: int, max_chars: int) -> str:
    return parse_request_state(state, window, max_chars).text
