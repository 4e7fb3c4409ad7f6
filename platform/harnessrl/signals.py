"""The signals table (DESIGN §3): what a source said about an outcome or a step, kept verbatim.

Rewards are a recipe over signals, and recipes change; the signals themselves must not. So
ingest keeps every outcome entry (`success`, `score`, a judge's verdict, ...), every step's
logged `reward` and every entry of its `info` (tests_passed, syntax_ok, usage, ...) as one
row each, with the value as JSON text, in long format: a later outcome file adds rows, it
never overwrites the ones the log carried. Our own ingest flags (`info.flags`) are not signals.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from harnessrl.formats.native import MAX_FIELD_CHARS

EPISODE, STEP = "episode", "step"
OUTCOMES_FILE = "outcomes_file"  # `source` of the rows joined from `--outcomes`
INGEST_KEYS = frozenset({"flags"})  # info keys ingest itself writes


def _row(episode_id: str, target: str, step_idx: int | None, name: Any, value: Any, source: str) -> dict[str, Any]:
    text = json.dumps(value, sort_keys=True)  # ASCII escapes: lone surrogates stay storable
    name = str(name).encode("utf-8", "replace").decode("utf-8")
    return {"episode_id": episode_id, "target": target, "step_idx": step_idx, "name": name,
            "value_json": text[:MAX_FIELD_CHARS], "value_truncated": len(text) > MAX_FIELD_CHARS, "source": source}


def outcome_signals(episode_id: str, outcome: Any, source: str) -> list[dict[str, Any]]:
    """One row per entry of an outcome object; anything else that was given is kept as `outcome`."""
    if outcome is None:
        return []
    items = outcome.items() if isinstance(outcome, dict) else [("outcome", outcome)]
    return [_row(episode_id, EPISODE, None, k, v, source) for k, v in items]


def step_signals(steps: Iterable[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """A step's logged reward and its info entries (step rows as the readers build them)."""
    rows = []
    for s in steps:
        eid, idx = s["episode_id"], int(s["step_idx"])
        if s.get("reward") is not None:
            rows.append(_row(eid, STEP, idx, "reward", s["reward"], source))
        info = json.loads(s.get("info") or "{}")
        rows.extend(_row(eid, STEP, idx, k, v, source) for k, v in info.items() if k not in INGEST_KEYS)
    return rows


def episode_signals(episode: dict[str, Any], steps: list[dict[str, Any]], outcome: Any,
                    joined: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """All signal rows of one parsed episode; `joined` is its entry of the outcomes file, if any."""
    source = episode["source_format"]
    rows = outcome_signals(episode["episode_id"], outcome, source) + step_signals(steps, source)
    if joined:
        rows += outcome_signals(episode["episode_id"], {k: v for k, v in joined.items() if v is not None},
                                OUTCOMES_FILE)
    return rows
