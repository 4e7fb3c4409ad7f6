"""State rendering: one function, used by the transitions stage and by serving alike.

A state is what the agent knew when it decided: the task, the last few (action, result)
pairs, and the current observation, written as text within a character budget and, optionally,
a token budget measured with the encoder's tokenizer (harnessrl.tokens). A `Layout` adds what a
sliding window loses: pinned results of chosen actions (a map, a recipe, a file listing read ten
steps ago) and a compact list of every action taken so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Mapping, Sequence

from harnessrl.errors import ConfigError


@dataclass(frozen=True)
class Turn:
    action: str
    result: str


@dataclass(frozen=True)
class Layout:
    """What a rendered state holds besides the task, the observation and the recent window.

    pin: glob patterns over action texts (case-insensitive, e.g. `read map`, `cat *`); the latest
      result of each matching action stays in the state while the window slides past it.
    list_actions: a `Done:` line listing every action taken so far, in order of first use, with
      a count when repeated (what was tried, and how often: the sign of a loop).
    observation_first: the current observation before the task (an encoder that cuts at its
      token limit then keeps what changed).
    """

    pin: tuple[str, ...] = ()
    list_actions: bool = False
    observation_first: bool = False

    @classmethod
    def from_config(cls, render: Mapping[str, Any]) -> "Layout":
        """From a RenderConfig dump (a model's `render` meta; older models have no such keys)."""
        return cls(tuple(render.get("pin") or ()), bool(render.get("list_actions")),
                   bool(render.get("observation_first")))


def _pinned(history: Sequence[Turn], observation: str, patterns: Sequence[str], task: str = "") -> list[str]:
    """`Pinned > action: result` for the latest turn matching each pattern, in pattern order; a
    turn is pinned once, and not when its result is already shown (the current observation, or
    the task: a game's `task` command answers with the task text)."""
    shown = {task.strip()}
    lines, used = [], set()
    for pattern in patterns:
        p = pattern.strip().lower()
        for i in range(len(history) - 1, -1, -1):
            if fnmatchcase(history[i].action.strip().lower(), p):
                turn, result = history[i], history[i].result.strip()
                if i not in used and result and result not in shown and not (
                        i == len(history) - 1 and result == observation.strip()):
                    lines.append(f"Pinned > {turn.action.strip()}: {result}")
                used.add(i)
                break
    return lines


def _done(history: Sequence[Turn]) -> list[str]:
    counts: dict[str, int] = {}
    for turn in history:
        counts[turn.action.strip()] = counts.get(turn.action.strip(), 0) + 1
    if not counts:
        return []
    return ["Done: " + "; ".join(a if n == 1 else f"{a} (x{n})" for a, n in counts.items())]


def render_state(task: str, history: Sequence[Turn], observation: str, window: int = 4, max_chars: int = 2000,
                 max_tokens: int | None = None, tokenizer: str | None = None, layout: Layout = Layout()) -> str:
    """Render the decision context, most important first: task, current observation (swapped by
    `layout.observation_first`), the pinned results and the list of actions done (`layout`), then
    the recent (action, result) pairs newest first. Encoders cut texts at a token limit, so what
    is lost is the oldest history. The newest result is not repeated when it is the observation.

    `max_tokens` (with `tokenizer`, the encoder's): keep only as many of the recent pairs as fit
    in that many tokens of the encoder, special tokens included, so that the encoder cuts
    nothing; everything before the recent pairs is always kept. Then `max_chars` applies as before.
    """
    recent = list(history)[-window:] if window else []
    head = [f"Task: {task.strip()}"] if task.strip() else []
    if observation.strip():
        head.insert(0 if layout.observation_first else len(head), f"Now: {observation.strip()}")
    head += _pinned(history, observation, layout.pin, task) + (_done(history) if layout.list_actions else [])
    turns = []
    for i in range(len(recent) - 1, -1, -1):
        turn = recent[i]
        result = turn.result.strip()
        if i == len(recent) - 1 and result == observation.strip():
            result = ""
        turns.append(f"> {turn.action.strip()}" + (f" -> {result}" if result else ""))
    keep = len(turns) if max_tokens is None else _turns_that_fit(head, turns, len(history), max_tokens, tokenizer)
    text = _join(head, turns[:keep], len(history))
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def _join(head: list[str], turns: list[str], n_history: int) -> str:
    marker = [f"({n_history - len(turns)} earlier steps)"] if n_history > len(turns) else []
    return "\n".join(head + turns + marker)


def _turns_that_fit(head: list[str], turns: list[str], n_history: int, max_tokens: int, tokenizer: str | None) -> int:
    """The most newest-first turns whose rendering fits in `max_tokens`: from cached per-line
    counts, checked on the whole text unless the tokenizer splits at whitespace (then exact)."""
    from harnessrl import tokens

    if not tokenizer:
        raise ConfigError("render.max_tokens needs render.tokenizer (the encoder whose tokenizer counts)")

    def lines(ls: list[str]) -> int:
        return sum(tokens.count_pieces(tokenizer, line) for line in ls)

    budget = max_tokens - tokens.special_tokens(tokenizer) - lines(head)
    keep, used = 0, 0
    for k, line in enumerate(turns, start=1):
        used += tokens.count_pieces(tokenizer, line)
        marker = [f"({n_history - k} earlier steps)"] if n_history > k else []
        if used + lines(marker) > budget:
            break
        keep = k
    if tokens.splits_on_whitespace(tokenizer):  # the estimate is exact
        return keep
    while keep > 0 and tokens.count_text(tokenizer, _join(head, turns[:keep], n_history)) > max_tokens:
        keep -= 1
    return keep


@dataclass(frozen=True)
class RequestState:
    """A request's state, parsed: the rendered text, and the turns and observation that the
    history features read (empty when the request sent already-rendered text)."""

    text: str
    history: tuple[Turn, ...] = ()
    observation: str = ""


def parse_request_state(state: str | dict[str, Any], window: int, max_chars: int, max_tokens: int | None = None,
                        tokenizer: str | None = None, layout: Layout = Layout()) -> RequestState:
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
    text = render_state(str(state.get("task", "")), history, observation, window, max_chars, max_tokens, tokenizer,
                        layout)
    return RequestState(text, history, observation)


def state_from_request(state: str | dict[str, Any], window: int, max_chars: int, max_tokens: int | None = None,
                       tokenizer: str | None = None, layout: Layout = Layout()) -> str:
    return parse_request_state(state, window, max_chars, max_tokens, tokenizer, layout).text
