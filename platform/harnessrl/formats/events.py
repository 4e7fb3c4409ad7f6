"""The events a conversation reader emits while it walks its own record shape.

Text that arrived (`Said`), a decision of the agent (`Decided`), a tool result (`Returned`),
feedback with no call (`Feedback`); `conversation.fold` turns them into step rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Said:
    """Text from the user ("user"), the system ("system") or anyone else ("other")."""

    role: str
    text: str


@dataclass
class Decided:
    """One decision: visible text, reasoning, tool-call rows (native `_tool_call`), extra info."""

    text: str
    reasoning: str
    calls: list[dict[str, Any]]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Returned:
    """A tool result, joined to its call by `call_id`."""

    call_id: str
    text: str
    is_error: bool


@dataclass
class Feedback:
    """A result of the latest decision that names no call (e.g. ATIF results without source_call_id)."""

    text: str


Event = Said | Decided | Returned | Feedback
