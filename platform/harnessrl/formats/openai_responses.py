"""OpenAI Responses API items (one JSON object per JSONL line) -> episode and step rows.

Record: {"id" (or "episode_id"), "input": str | [items], "items"?: [items], "output"?: [items],
"instructions"?, "tools"?, "model"?, "outcome"?, "metadata"?}; the three item lists are read in
that order. Episode id: `stable_episode_id("openai-responses", id)`; a record without an id gets
one derived from its file and line, flagged `derived_episode_id`.
Shared rules: `formats/boundary.py`.

Items are flat, so a decision is a run of consecutive model-side items (`reasoning`, assistant
`message`, `function_call`) with no input item between them: parallel function calls and the
reasoning that led to them form one step. `reasoning` text (summary and content parts) is the
step's reasoning; `encrypted_content` is opaque and named in lost_fields. `function_call_output`
is joined by `call_id` (an optional boolean `is_error` is honoured: the format has no error flag).
`instructions` and system/developer messages before the first decision: the system prompt.
Other item types (web_search_call, computer_call, ...) are dropped and flagged `unsupported_item`.
"""

from __future__ import annotations

from typing import Any

from harnessrl.formats.boundary import parse_with
from harnessrl.formats.events import Decided, Event, Returned, Said
from harnessrl.formats.fields import (
    Bad,
    Ctx,
    as_object,
    error_flag,
    optional_list,
    role_of,
    str_or_none,
)
from harnessrl.formats.flags import Flag
from harnessrl.formats.header import Header, read_header
from harnessrl.formats.native import ParsedEpisode, Quarantined, Reason

SOURCE_FORMAT = "openai-responses"
ITEM_LISTS = ("input", "items", "output")
KNOWN_KEYS = {"id", "episode_id", "instructions", "tools", "model", *ITEM_LISTS}


def _items(record: dict[str, Any]) -> list[tuple[str, Any]]:
    if all(record.get(key) is None for key in ITEM_LISTS):
        raise Bad(Reason.MISSING_STEPS, "none of input / items / output is given")
    items: list[tuple[str, Any]] = []
    for key in ITEM_LISTS:
        value = record.get(key)
        if key == "input" and isinstance(value, str):
            value = [{"type": "message", "role": "user", "content": value}]
        items += [(f"{key}[{i}]", item) for i, item in enumerate(optional_list(value, key))]
    if not items:
        raise Bad(Reason.EMPTY_EPISODE, "no items")
    return items


class _Turn:
    """The model-side items of one decision, collected until an input item arrives."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, Any]] = []

    def event(self) -> tuple[str, Event]:
        return self.where, Decided("\n\n".join(self.texts), "\n\n".join(self.reasoning), self.calls)


def _reasoning(item: dict[str, Any], where: str, ctx: Ctx) -> str:
    if item.get("encrypted_content") is not None:
        ctx.lost.append(f"{where}.encrypted_content:opaque")
    summary = ctx.content(item.get("summary"), f"{where}.summary")
    content = ctx.content(item.get("content"), f"{where}.content")
    return "\n\n".join(t for t in (summary, content) if t)


def _input_event(item: dict[str, Any], kind: str | None, where: str, ctx: Ctx) -> Event | None:
    """The event of an input-side item, or None for an item type that is not mapped."""
    if kind == "function_call_output":
        call_id = ctx.text(item.get("call_id"), f"{where}.call_id")
        output = ctx.content(item.get("output"), f"{where}.output")
        return Returned(call_id, output, error_flag(item.get("is_error"), f"{where}.is_error"))
    if kind != "message":
        ctx.unsupported(item.get("type"), where)
        return None
    role = role_of(item, "role", where)
    content = ctx.content(item.get("content"), f"{where}.content")
    if role in ("system", "developer"):
        return Said("system", content)
    if role == "user":
        return Said("user", content)
    ctx.flag(Flag.UNKNOWN_ROLE)
    return Said("other", content)


def _events(items: list[tuple[str, Any]], ctx: Ctx) -> list[tuple[str, Event]]:
    events: list[tuple[str, Event]] = []
    turn: _Turn | None = None
    for where, raw in items:
        item = as_object(raw, where)
        kind = str_or_none(item.get("type")) or ("message" if "role" in item else None)
        role = role_of(item, "role", where)
        if kind in ("reasoning", "function_call") or (kind == "message" and role == "assistant"):
            turn = turn or _Turn(where)
            if kind == "reasoning":
                turn.reasoning.append(_reasoning(item, where, ctx))
            elif kind == "function_call":
                call_id = item.get("call_id") if item.get("call_id") is not None else item.get("id")
                turn.calls.append(ctx.call(call_id, item.get("name"), item.get("arguments"), where))
            else:
                turn.texts.append(ctx.content(item.get("content"), f"{where}.content"))
            continue
        event = _input_event(item, kind, where, ctx)
        if event is None:
            continue  # an unmapped item neither ends nor starts a decision
        if turn is not None:
            events.append(turn.event())
            turn = None
        events.append((where, event))
    if turn is not None:
        events.append(turn.event())
    return events


def _convert(record: dict[str, Any], ctx: Ctx) -> tuple[Header, list[tuple[str, Event]]]:
    header = read_header(record, ctx, ("id", "episode_id"), "metadata", KNOWN_KEYS, derive_id=True)
    header.model = ctx.text(record.get("model"), "model")
    header.tools = record.get("tools")
    header.system_prompt = ctx.content(record.get("instructions"), "instructions")
    return header, _events(_items(record), ctx)


def parse_line(line: bytes, source_uri: str, line_no: int, source_digest: str | None = None
               ) -> ParsedEpisode | Quarantined:
    """One Responses API conversation -> an episode with its steps, or a quarantine reason."""
    return parse_with(SOURCE_FORMAT, _convert, line, source_uri, line_no, source_digest)
