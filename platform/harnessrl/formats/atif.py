"""ATIF v1.x trajectories (Agent Trajectory Interchange Format, Harbor RFC 0001) -> episode and step rows.

One trajectory is one JSON document (often a pretty-printed `trajectory.json`): pass the whole
document as `line`. Written from the RFC (v1.4 text, plus the v1.5-1.7 additions seen in the
wild: `trajectory_id`, `agent.tool_definitions`, message/content as a list of content parts).

Episode id: `stable_episode_id("atif", session_id)` (`trajectory_id` when there is no session_id).
`schema_version` other than ATIF-v1.x is quarantined (`unsupported_version`); a missing one is
accepted. Shared rules: `formats/boundary.py`. Specific to this format:

- `system` steps before the first agent step: the system prompt; the first `user` step: the task;
  later user/system messages (and system-step observations): `obs_text` of the next agent step.
- an `agent` step is one step: `tool_calls` (function_name, arguments object -> sorted JSON text)
  are its calls, `message` the answer when there are none, `reasoning_content` the reasoning.
- `observation.results` are joined to calls by `source_call_id`; results without one are the step's
  own feedback (appended to result_text). ATIF has no error flag: an `is_error` boolean on the
  result (or in its `extra`) is honoured. Subagent references are rendered as text.
- `metrics` scalars, `model_name`, `reasoning_effort`, `timestamp` and `extra` go to the step's
  info; token-id and logprob lists are dropped and named in lost_fields.
- outcome, task_id, group_id, end_reason: on the root or in the root `extra` (ATIF has none);
  `agent.version`, `schema_version`, `notes`, `final_metrics` go to metadata `atif`; embedded
  `subagent_trajectories` are not read (named in lost_fields).
"""

from __future__ import annotations

import json
import re
from typing import Any

from harnessrl.formats.boundary import parse_with
from harnessrl.formats.events import Decided, Event, Feedback, Returned, Said
from harnessrl.formats.fields import (
    Bad,
    Ctx,
    as_object,
    error_flag,
    label,
    optional_list,
    pick,
    required_list,
    role_of,
)
from harnessrl.formats.flags import Flag
from harnessrl.formats.header import Header, read_header
from harnessrl.formats.native import ParsedEpisode, Quarantined, Reason

SOURCE_FORMAT = "atif"
VERSION = re.compile(r"(ATIF-)?v?1(\.\d+)*")
KNOWN_KEYS = {"schema_version", "session_id", "trajectory_id", "agent", "steps", "notes", "final_metrics",
              "subagent_trajectories"}


def _check_version(record: dict[str, Any]) -> str | None:
    version = record.get("schema_version")
    if version is not None and not (isinstance(version, str) and VERSION.fullmatch(version)):
        raise Bad(Reason.UNSUPPORTED_VERSION, f"schema_version {str(version)[:40]!r} is not ATIF-v1.x")
    return version


def _metrics(value: Any, where: str, ctx: Ctx) -> dict[str, Any]:
    metrics = as_object(value, where) if value is not None else {}
    for key, v in metrics.items():
        if isinstance(v, list):
            ctx.lost.append(f"{where}.{label(key)}:dropped:{len(v)}")
    return {k: v for k, v in metrics.items() if not isinstance(v, list)}


def _agent_step(step: dict[str, Any], where: str, ctx: Ctx) -> Decided:
    calls_raw = optional_list(step.get("tool_calls"), f"{where}.tool_calls")
    calls = []
    for j, raw in enumerate(calls_raw):
        call = as_object(raw, f"{where}.tool_calls[{j}]")
        calls.append(ctx.call(call.get("tool_call_id"), call.get("function_name"), call.get("arguments"),
                              f"{where}.tool_calls[{j}]"))
    info = pick(step, "model_name", "reasoning_effort", "timestamp", "extra")
    metrics = _metrics(step.get("metrics"), f"{where}.metrics", ctx)
    if metrics:
        info["metrics"] = metrics
    return Decided(ctx.content(step.get("message"), f"{where}.message"),
                   ctx.content(step.get("reasoning_content"), f"{where}.reasoning_content"), calls, info)


def _result(raw: Any, where: str, from_agent: bool, role: str, ctx: Ctx) -> Event:
    result = as_object(raw, where)
    text = ctx.content(result.get("content"), f"{where}.content")
    refs = result.get("subagent_trajectory_ref")
    if refs is not None:
        text = "\n".join(t for t in (text, ctx.text(f"[subagent: {json.dumps(refs)}]", f"{where}.ref")) if t)
    extra = result.get("extra") if isinstance(result.get("extra"), dict) else {}
    is_error = error_flag(result.get("is_error", extra.get("is_error")), f"{where}.is_error")
    call_id = result.get("source_call_id")
    if call_id is not None and from_agent:
        return Returned(ctx.text(call_id, f"{where}.source_call_id"), text, is_error)
    return Feedback(text) if from_agent else Said(role, text)


def _step(raw: Any, where: str, ctx: Ctx) -> list[tuple[str, Event]]:
    step = as_object(raw, where)
    source = role_of(step, "source", where)
    events: list[tuple[str, Event]] = []
    if source == "agent":
        events.append((where, _agent_step(step, where, ctx)))
    else:
        if source not in ("user", "system"):
            ctx.flag(Flag.UNKNOWN_ROLE)
            source = "other"
        events.append((where, Said(source, ctx.content(step.get("message"), f"{where}.message"))))
    observation = step.get("observation")
    results = as_object(observation, f"{where}.observation").get("results") if observation is not None else None
    for k, res in enumerate(optional_list(results, f"{where}.observation.results")):
        at = f"{where}.observation.results[{k}]"
        events.append((at, _result(res, at, source == "agent", source, ctx)))
    return events


def _convert(record: dict[str, Any], ctx: Ctx) -> tuple[Header, list[tuple[str, Event]]]:
    version = _check_version(record)
    header = read_header(record, ctx, ("session_id", "trajectory_id"), "extra", KNOWN_KEYS)
    agent = {} if record.get("agent") is None else as_object(record["agent"], "agent")
    header.agent_name = ctx.text(agent.get("name"), "agent.name")
    header.model = ctx.text(agent.get("model_name"), "agent.model_name")
    header.tools = agent.get("tool_definitions")
    atif = {"schema_version": version, "agent_version": agent.get("version"),
            **pick(record, "trajectory_id", "notes", "final_metrics")}
    header.metadata["atif"] = {k: v for k, v in atif.items() if v is not None}
    subagents = record.get("subagent_trajectories")
    if subagents:
        ctx.lost.append(f"subagent_trajectories:not_read:{len(subagents) if isinstance(subagents, list) else 1}")
    steps = required_list(record, "steps")
    return header, [ev for i, s in enumerate(steps) for ev in _step(s, f"steps[{i}]", ctx)]


def parse_line(line: bytes, source_uri: str, line_no: int, source_digest: str | None = None
               ) -> ParsedEpisode | Quarantined:
    """One ATIF trajectory document -> an episode with its steps, or a quarantine reason. ATIF
    requires a session_id: no id is derived (`source_digest` is not used)."""
    return parse_with(SOURCE_FORMAT, _convert, line, source_uri, line_no, source_digest)
