"""Reading a record's fields: the per-record context (`Ctx`) and the coercion helpers.

A field of the wrong type raises `Bad` with its `Reason`; the reader boundary
(`boundary.parse_with`) turns it into a `Quarantined`.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from harnessrl.formats.flags import Flag
from harnessrl.formats.native import Reason, _Bad, _text, _tool_call

Bad = _Bad  # raised by readers; becomes a Quarantined at the boundary (`parse_with`)


class Ctx:
    """Per-record state: `lost` (-> lost_fields), flag counts (-> metadata ingest_flags) and the id
    to use when the record has none (`derived_id` of its file and line)."""

    def __init__(self, fallback_id: str = "") -> None:
        self.lost: list[str] = []
        self.flags: Counter[str] = Counter()
        self.fallback_id = fallback_id

    def text(self, value: Any, where: str, required: bool = False) -> str:
        """A scalar text field, bounded and flagged like the native reader does."""
        return _text(value, where, self.lost, required)

    def content(self, value: Any, where: str) -> str:
        """Text of a message content: a string, or a list of parts (`text`/`refusal` kept;
        images, files, ... become a `[type]` placeholder and are named in lost_fields)."""
        if value is None or isinstance(value, str) or not isinstance(value, (dict, list)):
            return self.text(value, where)
        parts = [value] if isinstance(value, dict) else value
        texts = [self.part(part, f"{where}[{i}]") for i, part in enumerate(parts)]
        return self.text("\n".join(t for t in texts if t), where)

    def part(self, part: Any, where: str) -> str:
        """One content part's text, or a `[type]` placeholder named in lost_fields."""
        if isinstance(part, str):
            return part
        if not isinstance(part, dict):
            raise Bad(Reason.WRONG_TYPE, f"{where} must be a string or an object")
        for key in ("text", "refusal"):
            value = part.get(key)
            if value is not None and not isinstance(value, (dict, list)):
                return str(value)
        kind = label(part.get("type"))
        self.lost.append(f"{where}:{kind}")
        return f"[{kind}]"

    def call(self, call_id: Any, name: Any, arguments: Any, where: str) -> dict[str, Any]:
        """A tool-call row. Object arguments become sorted JSON text first, so that they are bounded too."""
        if isinstance(arguments, (dict, list)):
            arguments = json.dumps(arguments, sort_keys=True)
        return _tool_call({"id": call_id, "name": name, "arguments": arguments}, where, self.lost)

    def flag(self, code: str) -> None:
        self.flags[code] += 1

    def unsupported(self, kind: Any, where: str) -> None:
        self.flag(Flag.UNSUPPORTED_ITEM)
        self.lost.append(f"{where}:unsupported:{label(kind)}")


def label(value: Any) -> str:
    """A short storable name for a `type`/key value of any JSON type (for lost_fields entries)."""
    if not isinstance(value, str) or not value:
        return type(value).__name__
    return value[:40].encode("utf-8", "replace").decode("utf-8")  # lone surrogates -> "?"


def str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def role_of(msg: dict[str, Any], key: str, where: str) -> str | None:
    """A message's role (or ATIF step's source): None when absent, a wrong type is quarantined
    (a `role` of 5 is a broken record, not an unknown speaker)."""
    value = msg.get(key)
    if value is not None and not isinstance(value, str):
        raise Bad(Reason.WRONG_TYPE, f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def as_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Bad(Reason.WRONG_TYPE, f"{where} must be an object, got {type(value).__name__}")
    return value


def optional_list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Bad(Reason.WRONG_TYPE, f"{where} must be a list, got {type(value).__name__}")
    return value


def required_list(record: dict[str, Any], key: str) -> list[Any]:
    """The record's list of messages/steps: missing, wrong type and empty each have their reason."""
    if key not in record:
        raise Bad(Reason.MISSING_STEPS, f"{key} is missing")
    value = optional_list(record[key], key)
    if not value:
        raise Bad(Reason.EMPTY_EPISODE, f"{key} is empty")
    return value


def error_flag(value: Any, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise Bad(Reason.WRONG_TYPE, f"{where} must be true or false")
    return value


def pick(source: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The keys of `source` that are present and not null (for a step's info)."""
    return {k: source[k] for k in keys if source.get(k) is not None}
