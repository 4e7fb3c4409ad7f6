"""OpenAI Chat Completions conversations (one JSON object per JSONL line) -> episode and step rows.

Record: {"id" (or "episode_id"), "messages": [...], "tools"?, "model"?, "outcome"?, "metadata"?}.
Episode id: `stable_episode_id("openai-chat", id)`. The mapping rules shared with the other
conversation readers are in `formats/common.py`; what is specific to this format:

- system/developer messages before the first assistant turn: the system prompt; the first user
  message: the task; later user/system messages: `obs_text` of the next step.
- an assistant message is one step: its `tool_calls` (parallel calls included) are the step's
  calls, `content` (or `refusal`) is the answer when there are none; `reasoning_content` or
  `reasoning` is the reasoning; `finish_reason`/`usage`/`name` go to info.
- `tool` messages are joined to calls by `tool_call_id`; the format has no error flag, an
  optional boolean `is_error` on the tool message is honoured.
- `arguments` is kept verbatim; text that is not JSON is flagged `arguments_not_json`.
- other roles (e.g. legacy `function`): text kept as observation, flagged `unknown_role`.
"""

from __future__ import annotations

from typing import Any

from harnessrl.formats.common import (
    Ctx,
    Decided,
    Event,
    Flag,
    Header,
    Returned,
    Said,
    as_object,
    error_flag,
    optional_list,
    parse_with,
    pick,
    read_header,
    required_list,
    str_or_none,
)
from harnessrl.formats.native import ParsedEpisode, Quarantined

SOURCE_FORMAT = "openai-chat"
KNOWN_KEYS = {"id", "episode_id", "messages", "tools", "model"}


def _call(raw: Any, where: str, ctx: Ctx) -> dict[str, Any]:
    call = as_object(raw, where)
    fn = as_object(call.get("function"), f"{where}.function")
    return ctx.call(call.get("id"), fn.get("name"), fn.get("arguments"), f"{where}.function")


def _assistant(msg: dict[str, Any], where: str, ctx: Ctx) -> Decided:
    calls_raw = optional_list(msg.get("tool_calls"), f"{where}.tool_calls")
    calls = [_call(c, f"{where}.tool_calls[{j}]", ctx) for j, c in enumerate(calls_raw)]
    text = ctx.content(msg.get("content"), f"{where}.content") or ctx.text(msg.get("refusal"), f"{where}.refusal")
    reasoning = msg.get("reasoning_content") if msg.get("reasoning_content") is not None else msg.get("reasoning")
    return Decided(text, ctx.content(reasoning, f"{where}.reasoning"), calls,
                   pick(msg, "finish_reason", "usage", "name"))


def _message(raw: Any, where: str, ctx: Ctx) -> Event:
    msg = as_object(raw, where)
    role = str_or_none(msg.get("role"))
    if role == "assistant":
        return _assistant(msg, where, ctx)
    content = ctx.content(msg.get("content"), f"{where}.content")
    if role == "tool":
        call_id = ctx.text(msg.get("tool_call_id"), f"{where}.tool_call_id")
        return Returned(call_id, content, error_flag(msg.get("is_error"), f"{where}.is_error"))
    if role in ("system", "developer"):
        return Said("system", content)
    if role == "user":
        return Said("user", content)
    ctx.flag(Flag.UNKNOWN_ROLE)
    return Said("other", content)


def _convert(record: dict[str, Any], ctx: Ctx) -> tuple[Header, list[tuple[str, Event]]]:
    header = read_header(record, ctx, ("id", "episode_id"), "metadata", KNOWN_KEYS)
    header.model = ctx.text(record.get("model"), "model")
    header.tools = record.get("tools")
    messages = required_list(record, "messages")
    return header, [(f"messages[{i}]", _message(m, f"messages[{i}]", ctx)) for i, m in enumerate(messages)]


def parse_line(line: bytes, source_uri: str, line_no: int) -> ParsedEpisode | Quarantined:
    """One Chat Completions conversation -> an episode with its steps, or a quarantine reason."""
    return parse_with(SOURCE_FORMAT, _convert, line, source_uri, line_no)
