"""The native JSONL format (one episode per line, DESIGN §4) -> episode and step rows.

`parse_line` never raises on bad input: it returns either a `ParsedEpisode` or a
`Quarantined` record with a reason code, so every input line is accounted for.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

SOURCE_FORMAT = "native"
MAX_FIELD_CHARS = 50_000  # longer text fields are cut and flagged in `lost_fields`
TRUNCATING_END_REASONS = {"max_steps", "timeout", "truncated"}


class Reason:
    """Quarantine reason codes (stable strings: they are counted and filtered on)."""

    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    MISSING_EPISODE_ID = "missing_episode_id"
    MISSING_STEPS = "missing_steps"
    EMPTY_EPISODE = "empty_episode"
    STEP_WITHOUT_ACTION = "step_without_action"
    WRONG_TYPE = "wrong_type"
    DUPLICATE_EPISODE_ID = "duplicate_episode_id"
    NON_FINITE_NUMBER = "non_finite_number"  # NaN, Infinity or a number too large for a float (reward, score)
    # Used by the other readers (formats/boundary.py, formats/detect.py):
    UNSUPPORTED_VERSION = "unsupported_version"  # e.g. an ATIF schema_version other than ATIF-v1.x
    UNKNOWN_FORMAT = "unknown_format"  # a record whose shape no reader recognises
    PARSER_ERROR = "parser_error"  # a reader bug caught at the boundary; tests assert it never happens
    # Set by ingest itself, before any reader sees the bytes (pipelines/ingest.py):
    CORRUPT_FILE = "corrupt_file"  # a .gz that does not decompress: the rest of the file is unreadable
    LINE_TOO_LONG = "line_too_long"  # a line over the ingest's max_line_bytes: skipped, never held whole


@dataclass
class ParsedEpisode:
    episode: dict[str, Any]
    steps: list[dict[str, Any]]
    outcome: Any = None  # the record's outcome object as read: kept verbatim in the signals table


@dataclass
class Quarantined:
    reason: str
    detail: str


class _Bad(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def stable_episode_id(source_format: str, native_id: str) -> str:
    """Stable across re-ingests of the same logs, whatever the file is called."""
    return hashlib.sha256(f"{source_format}\x00{native_id}".encode()).hexdigest()[:24]


def _text(value: Any, field: str, lost: list[str], required: bool = False) -> str:
    if value is None:
        if required:
            raise _Bad(Reason.WRONG_TYPE, f"{field} is missing")
        return ""
    if isinstance(value, (dict, list)):
        raise _Bad(Reason.WRONG_TYPE, f"{field} must be a string, got {type(value).__name__}")
    text = value if isinstance(value, str) else str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from JSON escapes: not storable as UTF-8
        lost.append(f"{field}:invalid_unicode")
        text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > MAX_FIELD_CHARS:
        lost.append(f"{field}:truncated:{len(text)}")
        text = text[:MAX_FIELD_CHARS]
    return text


def _number(value: Any, field: str) -> float | None:
    """A finite number or None. Python's JSON reader accepts NaN, Infinity and 1e999; such a value
    would turn every return computed through it into NaN, so the record is quarantined instead."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(Reason.WRONG_TYPE, f"{field} must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an integer with hundreds of digits
        raise _Bad(Reason.NON_FINITE_NUMBER, f"{field} is too large for a float") from None
    if not math.isfinite(number):
        raise _Bad(Reason.NON_FINITE_NUMBER, f"{field} is {number!r}, not a finite number")
    return number


def _tool_call(raw: Any, where: str, lost: list[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _Bad(Reason.WRONG_TYPE, f"{where} must be an object")
    args = raw.get("arguments", "")
    if isinstance(args, (dict, list)):
        args_text, parse_ok = json.dumps(args, sort_keys=True), True
    else:
        args_text = _text(args, f"{where}.arguments", lost)
        try:
            json.loads(args_text or "{}")
            parse_ok = True
        except ValueError:
            parse_ok = False  # kept verbatim, flagged
    return {
        "call_id": _text(raw.get("id"), f"{where}.id", lost),
        "name": _text(raw.get("name"), f"{where}.name", lost, required=True),
        "arguments_json": args_text,
        "arguments_parse_ok": parse_ok,
        "result_text": _text(raw.get("result"), f"{where}.result", lost),
        "is_error": bool(raw.get("is_error", False)),
    }


def render_action(action: str, tool_calls: list[dict[str, Any]]) -> str:
    """Canonical action text: the action if given, else the tool calls as `name(arguments)`."""
    if action.strip():
        return action
    return "; ".join(f"{c['name']}({c['arguments_json']})" for c in tool_calls)


def _step(raw: Any, idx: int, lost: list[str]) -> dict[str, Any]:
    where = f"steps[{idx}]"
    if not isinstance(raw, dict):
        raise _Bad(Reason.WRONG_TYPE, f"{where} must be an object")
    calls_raw = raw.get("tool_calls") or []
    if not isinstance(calls_raw, list):
        raise _Bad(Reason.WRONG_TYPE, f"{where}.tool_calls must be a list")
    calls = [_tool_call(c, f"{where}.tool_calls[{j}]", lost) for j, c in enumerate(calls_raw)]
    action = _text(raw.get("action"), f"{where}.action", lost)
    if not action.strip() and not calls:
        raise _Bad(Reason.STEP_WITHOUT_ACTION, f"{where} has neither action nor tool_calls")
    candidates = raw.get("candidates")
    if candidates is not None:
        if not isinstance(candidates, list):
            raise _Bad(Reason.WRONG_TYPE, f"{where}.candidates must be a list")
        candidates = [_text(c, f"{where}.candidates", lost, required=True) for c in candidates]
    info = raw.get("info") or {}
    if not isinstance(info, dict):
        raise _Bad(Reason.WRONG_TYPE, f"{where}.info must be an object")
    return {
        "step_idx": idx,
        "obs_text": _text(raw.get("observation"), f"{where}.observation", lost),
        "action_text": render_action(action, calls),
        "action_reasoning": _text(raw.get("thought"), f"{where}.thought", lost),
        "tool_calls": calls,
        "result_text": _text(raw.get("result"), f"{where}.result", lost),
        "reward": _number(raw.get("reward"), f"{where}.reward"),
        "candidates": candidates,
        "info": json.dumps(info, sort_keys=True),
        "done": bool(raw.get("done", False)),
    }


def _episode(record: dict[str, Any], source_uri: str, line_no: int) -> ParsedEpisode:
    native_id = record.get("episode_id")
    if native_id is None or (isinstance(native_id, str) and not native_id.strip()):
        raise _Bad(Reason.MISSING_EPISODE_ID, "episode_id is missing or empty")
    if not isinstance(native_id, (str, int)) or isinstance(native_id, bool):
        raise _Bad(Reason.WRONG_TYPE, "episode_id must be a string or integer")
    native_id = str(native_id)
    try:
        native_id.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a JSON escape: no stable id can be made
        raise _Bad(Reason.INVALID_UTF8, "episode_id is not valid Unicode") from None
    if "steps" not in record:
        raise _Bad(Reason.MISSING_STEPS, "steps is missing")
    if not isinstance(record["steps"], list):
        raise _Bad(Reason.WRONG_TYPE, "steps must be a list")
    if not record["steps"]:
        raise _Bad(Reason.EMPTY_EPISODE, "steps is empty")

    lost: list[str] = []
    steps = [_step(s, i, lost) for i, s in enumerate(record["steps"])]
    outcome = record.get("outcome") or {}
    if not isinstance(outcome, dict):
        raise _Bad(Reason.WRONG_TYPE, "outcome must be an object")
    success = outcome.get("success")
    if success is not None and not isinstance(success, bool):
        raise _Bad(Reason.WRONG_TYPE, "outcome.success must be true or false")
    score = _number(outcome.get("score"), "outcome.score")
    end_reason = _text(record.get("end_reason"), "end_reason", lost) or (
        "agent_stop" if steps[-1]["done"] else "unknown"
    )
    # Out of budget (or no word on how it ended): keep bootstrapping past the last step.
    truncated = end_reason in TRUNCATING_END_REASONS or end_reason == "unknown"
    terminated = not truncated
    for s in steps:
        s.pop("done")
        s["terminated"] = terminated and s is steps[-1]
        s["truncated"] = truncated and s is steps[-1]

    episode_id = stable_episode_id(SOURCE_FORMAT, native_id)
    for s in steps:
        s["episode_id"] = episode_id
    tools = record.get("tools")
    known = {"episode_id", "task_id", "group_id", "task", "system_prompt", "tools", "steps",
             "outcome", "end_reason", "agent_name", "model", "metadata"}
    extra = {k: v for k, v in record.items() if k not in known}
    metadata = record.get("metadata") or {}
    if extra:
        metadata = {**(metadata if isinstance(metadata, dict) else {"metadata": metadata}), "extra": extra}
    task_id = _text(record.get("task_id"), "task_id", lost) or native_id
    episode = {
        "episode_id": episode_id,
        "native_id": native_id,
        "group_id": _text(record.get("group_id"), "group_id", lost) or task_id,
        "task_id": task_id,
        "task_text": _text(record.get("task"), "task", lost),
        "system_prompt": _text(record.get("system_prompt"), "system_prompt", lost),
        "tool_definitions": json.dumps(tools if tools is not None else []),
        "agent_name": _text(record.get("agent_name"), "agent_name", lost),
        "model": _text(record.get("model"), "model", lost),
        "n_steps": len(steps),
        "end_reason": end_reason,
        "terminated": terminated,
        "truncated": truncated,
        "evaluable": success is not None,
        "outcome_success": success,
        "outcome_score": score,
        "source_format": SOURCE_FORMAT,
        "source_uri": source_uri,
        "source_line": line_no,
        "metadata": json.dumps(metadata, sort_keys=True),
        "lost_fields": lost,
    }
    return ParsedEpisode(episode, steps, record.get("outcome"))


def load_record(line: bytes) -> dict[str, Any] | Quarantined:
    """Bytes -> a JSON object, or the reason why not (every reader's first step)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Quarantined(Reason.INVALID_UTF8, f"byte {exc.start}: {exc.reason}")
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Quarantined(Reason.INVALID_JSON, (str(exc) or type(exc).__name__)[:200])
    if not isinstance(record, dict):
        return Quarantined(Reason.NOT_AN_OBJECT, f"top level is {type(record).__name__}")
    return record


def parse_line(line: bytes, source_uri: str, line_no: int, source_digest: str | None = None
               ) -> ParsedEpisode | Quarantined:
    """One native JSONL line -> an episode with its steps, or a quarantine reason. `source_digest`
    (the file's content digest) is not used: a native record must name its episode_id."""
    record = load_record(line)
    if isinstance(record, Quarantined):
        return record
    try:
        return _episode(record, source_uri, line_no)
    except _Bad as bad:
        return Quarantined(bad.reason, bad.detail)
