"""State rendering: the `Renderer`, built from a `RenderConfig`, is the one object that turns a
state into what the encoder sees, for the transitions stage, the service, evaluation and the
benchmarks alike.

A state is what the agent knew when it decided: the task, the last few (action, result)
pairs, and the current observation, written as text within a character budget and, optionally,
a token budget measured with the encoder's tokenizer (harnessrl.tokens). The configuration adds what
a sliding window loses: pinned results of chosen actions (a map, a recipe, a file listing read ten
steps ago) and a compact list of every action taken so far.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Mapping, Sequence

from harnessrl.config import RenderConfig
from harnessrl.errors import ConfigError


@dataclass(frozen=True)
class Turn:
    action: str
    result: str
    status: str = ""  # the source's status after the action (RenderConfig.status_from), "" when it gives none


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


def render_state(task: str, history: Sequence[Turn], observation: str, cfg: RenderConfig = RenderConfig()) -> str:
    """Render the decision context, most important first: task, current observation (swapped by
    `observation_first`), the pinned results (`pin`) and the list of actions done (`list_actions`),
    then the last `window` (action, result) pairs newest first. Encoders cut texts at a token limit,
    so what is lost is the oldest history. The newest result is not repeated when it is the observation.

    `max_tokens` (with `tokenizer`, the encoder's): keep only as many of the recent pairs as fit
    in that many tokens of the encoder, special tokens included, so that the encoder cuts
    nothing; everything before the recent pairs is always kept. Then `max_chars` applies as before.
    """
    window, max_chars, max_tokens, tokenizer = cfg.window, cfg.max_chars, cfg.max_tokens, cfg.tokenizer
    recent = list(history)[-window:] if window else []
    head = [f"Task: {task.strip()}"] if task.strip() else []
    if observation.strip():
        head.insert(0 if cfg.observation_first else len(head), f"Now: {observation.strip()}")
    head += _pinned(history, observation, cfg.pin, task) + (_done(history) if cfg.list_actions else [])
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


# ---- the state as segments -------------------------------------------------------------------
SEGMENT_ROLES = ("task", "observation", "last", "result", "actions", "status", "text", "detail")
# Roles whose sentence embedding the reader head reads (its semantic path); "actions" changes at every
# step (embedding it would cost an encoder pass per step) and is read through its tokens only.
EMBEDDED_ROLES = frozenset(r for r in SEGMENT_ROLES if r != "actions")


@dataclass(frozen=True)
class Segment:
    """One piece of a state: its role (SEGMENT_ROLES), its age (steps since it was produced, 0 for
    what holds now) and its text."""

    role: str
    age: int
    text: str


def state_segments(task: str, history: Sequence[Turn], observation: str, cfg: RenderConfig = RenderConfig()
                   ) -> tuple[Segment, ...]:
    """The state as segments, not one text: the task, the current observation (and, with
    `details`, its lines and sentences one by one), the last action, every
    distinct earlier result the episode produced that is not shown already (within
    `memory_results`: the `memory_newest` newest, then the longest of the rest, so a recipe or a map
    read long ago stays; no configured pin list), and the actions taken with their counts. Where the
    turns carry the source's status (`status_from`), the latest is a segment and each result says how
    its action moved it. Empty pieces are left out; each is cut at `segment_chars`."""
    cut = cfg.segment_chars

    def seg(role: str, age: int, text: str) -> Segment:
        text = text.strip()
        return Segment(role, age, text if len(text) <= cut else text[: cut - 3] + "...")

    out = [seg("task", 0, task), seg("observation", 0, observation)]
    out += [seg("detail", 0, part) for part in details(observation, cfg.details)]
    if history:
        out.append(seg("last", 1, history[-1].action))
    moved = _moves(history) if cfg.status_from else [""] * len(history)
    if cfg.status_from and history and history[-1].status:
        out.append(seg("status", 0, f"{cfg.status_from}: {history[-1].status}"
                                    + (f", {moved[-1]} after the last action" if moved[-1] else "")))
    shown = {task.strip(), observation.strip(), ""}
    found = []
    for age, (turn, move) in enumerate(zip(reversed(history), reversed(moved)), start=1):
        result = turn.result.strip()
        if result not in shown:
            shown.add(result)
            found.append((age, turn.action.strip(), result + (f" [{cfg.status_from} {move}]" if move else "")))
    keep = found[: cfg.memory_newest] + sorted(found[cfg.memory_newest:], key=lambda x: (-len(x[2]), x[0]))[
        : max(0, cfg.memory_results - cfg.memory_newest)]
    out += [seg("result", age, f"{action}: {result}") for age, action, result in sorted(keep)[: cfg.memory_results]]
    if cfg.memory_actions and history:
        out.append(seg("actions", 0, _done(history)[0][len("Done: "):]))
    return tuple(s for s in out if s.text)


def status_value(value: Any) -> str:
    """A status as the segments write it: numbers to 4 significant digits, text stripped; "" for none."""
    if value is None or isinstance(value, (dict, list)):
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{float(value):.4g}"
    return str(value).strip()


def _moves(history: Sequence[Turn]) -> list[str]:
    """Per turn, how its action moved a numeric status: up, down or unchanged ("" where the turn or the
    one before it gives none: the first turn has nothing to compare with)."""
    out, before = [], None
    for turn in history:
        try:
            now = float(turn.status) if turn.status else None
        except ValueError:
            now = None
        out.append("" if now is None or before is None else
                   "up" if now > before else "down" if now < before else "unchanged")
        before = now
    return out


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def details(text: str, limit: int) -> list[str]:
    """A text's distinct lines and sentences, the first `limit` of them; none when it has only one.
    One pooled embedding of a whole observation blurs the number or the line that decides; each
    part embedded apart keeps it."""
    if limit <= 0:
        return []
    parts = [s.strip() for line in text.splitlines() for s in _SENTENCE_END.split(line)]
    parts = list(dict.fromkeys(p for p in parts if p))
    return parts[:limit] if len(parts) > 1 else []


@dataclass(frozen=True)
class RequestState:
    """A request's state, parsed: the rendered text, its segments, and the turns and observation that
    the history features read (empty when the request sent already-rendered text: then the text is
    its one segment)."""

    text: str
    history: tuple[Turn, ...] = ()
    observation: str = ""
    segments: tuple[Segment, ...] = ()


class Renderer:
    """A state as the encoder sees it, its history features and the tool its actions call, from one
    `RenderConfig` (a pipeline's `render:` section, or the one a model card keeps)."""

    def __init__(self, cfg: RenderConfig | Mapping[str, Any] | None = None):
        self.cfg = cfg if isinstance(cfg, RenderConfig) else RenderConfig.model_validate(dict(cfg or {}))

    def text(self, task: str, history: Sequence[Turn], observation: str) -> str:
        return render_state(task, history, observation, self.cfg)

    def segments(self, task: str, history: Sequence[Turn], observation: str) -> tuple[Segment, ...]:
        if self.cfg.segments == "text":
            return (Segment("text", 0, self.text(task, history, observation)),)
        return state_segments(task, history, observation, self.cfg)

    def parse(self, state: "str | dict[str, Any] | RequestState") -> RequestState:
        """Already rendered text, or `{task, history[{action, observation}], observation}` rendered
        exactly as the transitions stage renders a logged step (the observation of a history item
        is the result of its action)."""
        if isinstance(state, RequestState):  # parsed already (evaluation: rows of the transitions table)
            return state
        if isinstance(state, str):
            return RequestState(state, segments=(Segment("text", 0, state),))
        if not isinstance(state, dict):
            raise ConfigError("state must be a string or an object with task/history/observation")
        history = tuple(
            Turn(str(h.get("action", "")), str(h.get("observation", h.get("result", ""))),
                 status_value(h.get("status")))
            for h in state.get("history") or []
        )
        observation, task = str(state.get("observation", "")), str(state.get("task", ""))
        return RequestState(self.text(task, history, observation), history, observation,
                            self.segments(task, history, observation))

    def tool(self, action: str) -> str:
        from harnessrl.features import tool_name

        return tool_name(action, self.cfg.tool_from)

    def features(self, history: Sequence[Turn], observation: str, candidates: Sequence[str]) -> list[list[float]]:
        """The history features (harnessrl.features) of each candidate, as training computed them."""
        from harnessrl.features import features_for

        return features_for(history, observation, candidates, self.cfg.tool_from)
