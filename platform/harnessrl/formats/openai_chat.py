"""OpenAI Chat Completions conversations (one JSON object per JSONL line) -> episode and step rows.

Record: {"id" (or "episode_id"), "messages": [...], "tools"?, "model"?, "outcome"?, "metadata"?}.
Episode id: `stable_episode_id("openai-chat", id)`; a record without an id (exported
conversations, fine-tuning files) gets one derived from its file and line, flagged
`derived_episode_id`. The mapping rules shared with the other
conversation readers are in `formats/boundary.py`; what is specific to this format:

- system/developer messages before the first assistant turn: the system prompt; the first user
  message: the task; later user/system messages: `obs_text` of the next step.
- an assistant message is one step: its `tool_calls` (parallel calls included) are the step's
  calls, `content` (or `refusal`) is the answer when there are none; `reasoning_content` or
  `reasoning` is the reasoning; `finish_reason`/`usage`/`name` go to info.
- `tool` messages are joined to calls by `tool_call_id`; the format has no error flag, an
  optional boolean `is_error` on the tool message is honoured.
- `arguments` is kept verbatim; text that is not JSON is flagged `arguments_not_json`.
- the legacy (pre-`tools`) form: an assistant `function_call` {name, arguments} is the step's
  call, and the `function` message after it is its result (joined in order: the legacy API
  makes one call per turn and has no call ids; the call's id is its position, e.g.
  `messages[2].function_call`).
- other roles: text kept as observation, flagged `unknown_role`; a role that is not a string
  is a broken record (`wrong_type`).
"""

from __future__ import annotations

from typing import Any

from harnessrl.formats.boundary import parse_with
from harnessrl.formats.events import Decided, Event, Returned, Said
from harnessrl.formats.fields import (
    Ctx,
    as_object,
    error_flag,
    optional_list,
    pick,
    required_list,
    role_of,
)
from harnessrl.formats.flags import Flag
from harnessrl.formats.header import Header, read_header
from harnessrl.formats.native import ParsedEpisode, Quarantined

SOURCE_FORMAT = "openai-chat"
KNOWN_KEYS = {"id", "episode_id", "messages", "tools", "model"}


def _call(raw: Any, where: str, ctx: Ctx) -> dict[str, Any]:
    call = as_object(raw, where)
    fn = as_object(call.get("function"), f"{where}.function")
    return ctx.call(call.get("id"), fn.get("name"), fn.get("arguments"), f"{where}.function")


def _assistant(msg: dict[str, Any], where: str, ctx: Ctx, legacy: list[str]) -> Decided:
    calls_raw = optional_list(msg.get("tool_calls"), f"{where}.tool_calls")
    calls = [_call(c, f"{where}.tool_calls[{j}]", ctx) for j, c in enumerate(calls_raw)]
    if msg.get("function_call") is not None:
        fn = as_object(msg["function_call"], f"{where}.function_call")
        call_id = f"{where}.function_call"
        calls.append(ctx.call(call_id, fn.get("name"), fn.get("arguments"), call_id))
        legacy.append(call_id)
    text = ctx.content(msg.get("content"), f"{where}.content") or ctx.text(msg.get("refusal"), f"{where}.refusal")
    reasoning = msg.get("reasoning_content") if msg.get("reasoning_content") is not None else msg.get("reasoning")
    return Decided(text, ctx.content(reasoning, f"{where}.reasoning"), calls,
                   pick(msg, "finish_reason", "usage", "name"))


def _message(raw: Any, where: str, ctx: Ctx, legacy: list[str]) -> Event:
    """One message as an event; `legacy` holds the ids of legacy function calls not yet answered."""
    msg = as_object(raw, where)
    role = role_of(msg, "role", where)
    if role == "assistant":
        return _assistant(msg, where, ctx, legacy)
    content = ctx.content(msg.get("content"), f"{where}.content")
    if role == "tool":
        call_id = ctx.text(msg.get("tool_call_id"), f"{where}.tool_call_id")
        return Returned(call_id, content, error_flag(msg.get("is_error"), f"{where}.is_error"))
    if role == "function":  # no call id: the latest legacy call (none: an orphan result, flagged)
        return Returned(legacy.pop() if legacy else "", content, error_flag(msg.get("is_error"), f"{where}.is_error"))
    if role in ("system", "developer"):
        return Said("system", content)
    if role == "user":
        return Said("user", content)
    ctx.flag(Flag.UNKNOWN_ROLE)
    return Said("other", content)


def _convert(record: dict[str, Any], ctx: Ctx) -> tuple[Header, list[tuple[str, Event]]]:
    header = read_header(record, ctx, ("id", "episode_id"), "metadata", KNOWN_KEYS, derive_id=True)
    header.model = ctx.text(record.get("model"), "model")
    header.tools = record.get("tools")
    messages = required_list(record, "messages")
    legacy: list[str] = []
    return header, [(f"messages[{i}]", _message(m, f"messages[{i}]", ctx, legacy)) for i, m in enumerate(messages)]


def parse_line(line: bytes, source_uri: str, line_no: int, source_digest: str | None = None
               ) -> ParsedEpisode | Quarantined:
    """One Chat Completions conversation -> an episode with its steps, or a quarantine reason."""
    return parse_with(SOURCE_FORMAT, _convert, line, source_uri, line_no, source_digest)
