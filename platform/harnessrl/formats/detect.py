"""Which reader a source needs, from the shape of its first record; and the readers by name.

`detect_format` looks at one record only (the first JSONL line, or the whole document for a
pretty-printed ATIF file); when the given bytes hold no complete record it falls back to key
markers in the text. It returns `UNKNOWN` rather than guessing, so the caller can stop with a
clear error or ask for an explicit format, and `EMPTY` for a file with nothing but whitespace. A plain conversation of only user/assistant string
messages fits both message formats: it is read as "openai-chat" (the readers agree on it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from harnessrl.formats import anthropic, atif, native, openai_chat, openai_responses
from harnessrl.formats.native import ParsedEpisode, Quarantined

# (line, source_uri, line_no, source_digest) -> an episode or a quarantine; see formats/boundary.py
Parser = Callable[[bytes, str, int, "str | None"], "ParsedEpisode | Quarantined"]

PARSERS: dict[str, Parser] = {
    "native": native.parse_line,
    "openai-chat": openai_chat.parse_line,
    "openai-responses": openai_responses.parse_line,
    "anthropic": anthropic.parse_line,
    "atif": atif.parse_line,
}
FORMATS = tuple(PARSERS)
UNKNOWN = "unknown"
EMPTY = "empty"  # no record at all: nothing to read, nothing to quarantine

RESPONSES_ITEMS = {"message", "reasoning", "function_call", "function_call_output"}
ANTHROPIC_BLOCKS = {"tool_use", "tool_result", "thinking", "redacted_thinking", "server_tool_use"}
CHAT_ROLES = {"system", "developer", "tool", "function"}

# Markers for a prefix that is not a complete record (a long first line, a cut document), in order.
SNIFF = [
    ("atif", re.compile(r'"schema_version"\s*:\s*"ATIF|"step_id"\s*:')),
    ("native", re.compile(r'"steps"\s*:\s*\[')),
    ("anthropic", re.compile(r'"type"\s*:\s*"(tool_use|tool_result|thinking|redacted_thinking)"|"input_schema"\s*:'
                             r'|"tool_use_id"\s*:')),
    ("openai-responses", re.compile(r'"type"\s*:\s*"(function_call|function_call_output|reasoning)"|"call_id"\s*:'
                                    r'|"instructions"\s*:|"object"\s*:\s*"response"')),
    ("openai-chat", re.compile(r'"tool_call_id"\s*:|"tool_calls"\s*:|"role"\s*:\s*"(system|developer|tool)"'
                               r'|"function(_call)?"\s*:\s*\{')),
]


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _kinds(objects: list[dict[str, Any]], key: str) -> set[str]:
    return {o[key] for o in objects if isinstance(o.get(key), str)}


def classify(record: Any) -> str:
    """The format of one parsed record, or UNKNOWN."""
    if not isinstance(record, dict):
        return UNKNOWN
    version = record.get("schema_version")
    steps = _dicts(record.get("steps"))
    if (isinstance(version, str) and version.upper().startswith("ATIF")) or any(
        "source" in s or "step_id" in s for s in steps
    ):
        return "atif"
    if isinstance(record.get("steps"), list):
        return "native"
    items = [i for key in ("input", "items", "output") for i in _dicts(record.get(key))]
    item_lists = isinstance(record.get("input"), str) or any(
        isinstance(record.get(key), list) for key in ("input", "items", "output"))
    if (record.get("object") == "response" or _kinds(items, "type") & RESPONSES_ITEMS
            or (item_lists and "messages" not in record)):
        return "openai-responses"
    messages = _dicts(record.get("messages"))
    if not isinstance(record.get("messages"), list):
        return UNKNOWN
    if _kinds([b for m in messages for b in _dicts(m.get("content"))], "type") & ANTHROPIC_BLOCKS:
        return "anthropic"
    if _kinds(messages, "role") & CHAT_ROLES or any(
            "tool_calls" in m or "tool_call_id" in m or "function_call" in m for m in messages):
        return "openai-chat"
    return "anthropic" if "system" in record else "openai-chat"


def _first_record(text: str) -> Any:
    for candidate in (text, text.split("\n", 1)[0]):
        try:
            return json.loads(candidate)
        except (ValueError, RecursionError):
            continue
    return None


def detect_format(first_bytes: bytes) -> str:
    """One of `FORMATS` for the first record in `first_bytes`, `UNKNOWN`, or `EMPTY`."""
    text = first_bytes.decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    if not text:
        return EMPTY
    record = _first_record(text)
    if record is not None:
        return classify(record)
    return next((name for name, marker in SNIFF if marker.search(text)), UNKNOWN)
