"""Anthropic Messages conversations (one JSON object per JSONL line) -> episode and step rows.

Record: {"id" (or "episode_id"), "messages": [...], "system"?: str | text blocks, "tools"?,
"model"?, "outcome"?, "metadata"?}. Episode id: `stable_episode_id("anthropic", id)`; a record
without an id gets one derived from its file and line, flagged `derived_episode_id`.
Shared rules: `formats/boundary.py`. Specific to this format:

- an assistant message is one step: `tool_use` (and `server_tool_use`) blocks are its calls
  (`input` object -> sorted JSON text), `text` blocks its answer, `thinking` blocks its reasoning;
  `redacted_thinking` is opaque and named in lost_fields. `stop_reason`/`usage`/`model` go to info.
- a user message's `tool_result` blocks are joined by `tool_use_id`; `is_error` becomes the call's
  `is_error` (and `[error]` in the step's result text); its other blocks are observation text
  (the first user text before any assistant turn is the task; images become `[image]`).
- other block types are dropped and flagged `unsupported_item`; other roles `unknown_role`; a
  role that is not a string is a broken record (`wrong_type`).
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
    pick,
    required_list,
    role_of,
    str_or_none,
)
from harnessrl.formats.flags import Flag
from harnessrl.formats.header import Header, read_header
from harnessrl.formats.native import ParsedEpisode, Quarantined, Reason

SOURCE_FORMAT = "anthropic"
KNOWN_KEYS = {"id", "episode_id", "messages", "system", "tools", "model"}
TOOL_USE = ("tool_use", "server_tool_use")


def _blocks(msg: dict[str, Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    content = msg.get("content")
    if content is None:
        return []
    if isinstance(content, dict):
        raise Bad(Reason.WRONG_TYPE, f"{where}.content must be a string or a list of blocks")
    if not isinstance(content, list):  # a string (or a scalar, written as text like elsewhere)
        return [(f"{where}.content", {"type": "text", "text": content})]
    return [(f"{where}.content[{i}]", as_object(b, f"{where}.content[{i}]")) for i, b in enumerate(content)]


def _assistant(msg: dict[str, Any], where: str, ctx: Ctx) -> Decided:
    texts, thinking, calls = [], [], []
    for at, block in _blocks(msg, where):
        kind = str_or_none(block.get("type"))
        if kind == "text":
            texts.append(ctx.text(block.get("text"), f"{at}.text"))
        elif kind == "thinking":
            thinking.append(ctx.text(block.get("thinking"), f"{at}.thinking"))
        elif kind == "redacted_thinking":
            ctx.lost.append(f"{at}:redacted_thinking")
        elif kind in TOOL_USE:
            calls.append(ctx.call(block.get("id"), block.get("name"), block.get("input"), at))
        else:
            ctx.unsupported(block.get("type"), at)
    return Decided("\n\n".join(texts), "\n\n".join(thinking), calls, pick(msg, "stop_reason", "usage", "model"))


def _user(msg: dict[str, Any], where: str, role: str, ctx: Ctx) -> list[tuple[str, Event]]:
    events: list[tuple[str, Event]] = []
    texts: list[str] = []
    for at, block in _blocks(msg, where):
        kind = str_or_none(block.get("type"))
        if kind == "tool_result":
            call_id = ctx.text(block.get("tool_use_id"), f"{at}.tool_use_id")
            text = ctx.content(block.get("content"), f"{at}.content")
            events.append((at, Returned(call_id, text, error_flag(block.get("is_error"), f"{at}.is_error"))))
        elif kind in ("text", "image", "document"):
            texts.append(ctx.part(block, at))
        else:
            ctx.unsupported(block.get("type"), at)
    events.append((where, Said(role, ctx.text("\n".join(texts), f"{where}.content"))))
    return events


def _message(raw: Any, where: str, ctx: Ctx) -> list[tuple[str, Event]]:
    msg = as_object(raw, where)
    role = role_of(msg, "role", where)
    if role == "assistant":
        return [(where, _assistant(msg, where, ctx))]
    if role not in ("user", "system"):
        ctx.flag(Flag.UNKNOWN_ROLE)
        role = "other"
    return _user(msg, where, role, ctx)


def _convert(record: dict[str, Any], ctx: Ctx) -> tuple[Header, list[tuple[str, Event]]]:
    header = read_header(record, ctx, ("id", "episode_id"), "metadata", KNOWN_KEYS, derive_id=True)
    header.model = ctx.text(record.get("model"), "model")
    header.tools = record.get("tools")
    header.system_prompt = ctx.content(record.get("system"), "system")
    messages = required_list(record, "messages")
    return header, [ev for i, m in enumerate(messages) for ev in _message(m, f"messages[{i}]", ctx)]


def parse_line(line: bytes, source_uri: str, line_no: int, source_digest: str | None = None
               ) -> ParsedEpisode | Quarantined:
    """One Anthropic Messages conversation -> an episode with its steps, or a quarantine reason."""
    return parse_with(SOURCE_FORMAT, _convert, line, source_uri, line_no, source_digest)
