"""Events -> a `Conversation`: task, system prompt and step rows (`fold`).

The mapping rules are in `boundary.py`'s docstring (task, step, obs_text, result_text).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harnessrl.formats.events import Decided, Event, Feedback, Returned, Said
from harnessrl.formats.fields import Ctx
from harnessrl.formats.flags import Flag
from harnessrl.formats.native import render_action


@dataclass
class _Draft:
    decided: Decided
    obs: list[str]
    flags: list[str]
    answered: set[int] = field(default_factory=set)  # id() of the call rows that got a result
    feedback: list[str] = field(default_factory=list)


@dataclass
class Conversation:
    task: str
    system: str
    steps: list[dict[str, Any]]


class _Folder:
    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.system: list[str] = []
        self.task: str | None = None
        self.drafts: list[_Draft] = []
        self.pending: list[str] = []
        self.pending_flags: list[str] = []
        self.open_calls: dict[str, tuple[_Draft, dict[str, Any]]] = {}

    def flag(self, code: str, into: list[str]) -> None:
        into.append(code)
        self.ctx.flag(code)

    def said(self, ev: Said) -> None:
        if not ev.text.strip():
            return
        if not self.drafts and ev.role == "system":
            self.system.append(ev.text)
        elif not self.drafts and ev.role == "user" and self.task is None:
            self.task = ev.text
        else:
            self.pending.append(ev.text)

    def decided(self, ev: Decided, where: str) -> None:
        if not ev.text.strip() and not ev.calls:
            self.ctx.flag(Flag.EMPTY_TURN)
            if ev.reasoning:
                self.ctx.lost.append(f"{where}.reasoning:empty_turn")
            return
        draft = _Draft(ev, self.pending, self.pending_flags)
        self.pending, self.pending_flags = [], []
        for call in ev.calls:
            if call["call_id"]:
                self.open_calls[call["call_id"]] = (draft, call)  # a reused id: the older call stays open
            if not call["arguments_parse_ok"]:
                self.flag(Flag.ARGUMENTS_NOT_JSON, draft.flags)
        self.drafts.append(draft)

    def returned(self, ev: Returned) -> None:
        hit = self.open_calls.pop(ev.call_id, None) if ev.call_id else None
        if hit is None:
            self.pending.append(ev.text)
            self.flag(Flag.TOOL_RESULT_WITHOUT_CALL, self.pending_flags)
            return
        draft, call = hit
        call["result_text"], call["is_error"] = ev.text, ev.is_error
        draft.answered.add(id(call))

    def feedback(self, ev: Feedback) -> None:
        if self.drafts:
            self.drafts[-1].feedback.append(ev.text)
        else:
            self.pending.append(ev.text)

    def finish(self) -> Conversation:
        if self.drafts:  # text after the last decision is that decision's result
            self.drafts[-1].feedback.extend(self.pending)
            self.drafts[-1].flags.extend(self.pending_flags)
        steps = [self._row(d, i) for i, d in enumerate(self.drafts)]
        return Conversation(self.task or "", join(self.system), steps)  # bounded with the header's part

    def _row(self, draft: _Draft, idx: int) -> dict[str, Any]:
        ev = draft.decided
        for call in ev.calls:
            if id(call) not in draft.answered:
                self.flag(Flag.CALL_WITHOUT_RESULT, draft.flags)
        info = dict(ev.info)
        if draft.flags:
            info["flags"] = draft.flags
        reasoning = [ev.reasoning, ev.text] if ev.calls else [ev.reasoning]
        results = [render_results(ev.calls, draft.answered)] + draft.feedback
        where = f"steps[{idx}]"
        return {
            "step_idx": idx,
            "obs_text": self.ctx.text(join(draft.obs), f"{where}.obs_text"),
            "action_text": render_action("" if ev.calls else ev.text, ev.calls),
            "action_reasoning": self.ctx.text(join(reasoning), f"{where}.action_reasoning"),
            "tool_calls": ev.calls,
            "result_text": self.ctx.text(join(results), f"{where}.result_text"),
            "reward": None,
            "candidates": None,
            "info": json.dumps(info, sort_keys=True),
        }


def join(texts: Iterable[str]) -> str:
    return "\n\n".join(t for t in texts if t.strip())


def render_results(calls: list[dict[str, Any]], answered: set[int]) -> str:
    """The results of one step in call order; a lone successful result is kept as it is."""
    done = [c for c in calls if id(c) in answered]
    if len(calls) == 1 and done and not done[0]["is_error"]:
        return done[0]["result_text"]
    return "\n".join(f"{c['name']}{' [error]' if c['is_error'] else ''}: {c['result_text']}" for c in done)


def fold(events: Iterable[tuple[str, Event]], ctx: Ctx) -> Conversation:
    """(where, event) pairs in log order -> task, system prompt and step rows (DESIGN §3)."""
    folder = _Folder(ctx)
    for where, ev in events:
        if isinstance(ev, Said):
            folder.said(ev)
        elif isinstance(ev, Decided):
            folder.decided(ev, where)
        elif isinstance(ev, Returned):
            folder.returned(ev)
        else:
            folder.feedback(ev)
    return folder.finish()
