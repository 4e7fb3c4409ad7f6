"""The tool an action calls: one rule per `render.tool_from`, used by the transitions stage, the
history features, evaluation, serving and the benchmarks alike.

Standard library only: bench/cross_probe.py imports it on GPU machines that have torch and
sentence-transformers but none of this package's other dependencies (pydantic, Ray, MLflow).
"""

from __future__ import annotations

import re
from typing import Literal

ToolFrom = Literal["calls", "first_word"]  # render.tool_from
ANSWER = "answer"  # the tool of an action that calls none: a reply, a final answer, a game command
_CALL = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\(")
_WORD = re.compile(r"^\s*([^\s(]+)")


def tool_name(action: str, tool_from: str = "calls") -> str:
    """The tool an action text calls: `name(...)` as the native format renders tool calls
    (`calls`), or the first word, for text games whose commands are verbs (`first_word`)."""
    pattern = _CALL if tool_from == "calls" else _WORD
    m = pattern.match(action)
    return m.group(1).lower() if m else ANSWER
