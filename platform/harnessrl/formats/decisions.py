"""The service's decision log + feedback -> native episodes: the data flywheel.

Each served decision is one step: the state the agent sent, the candidates, and the action the
critic chose (assumed taken). Decisions of one agent on one task form an episode while the
state's history keeps growing; a history that shrinks starts a new episode. Feedback joins by
`decision_id`: its outcome becomes the episode's outcome. The next decision's newest history
entry is the result of this one. Lines that do not parse are passed through unchanged so the
native reader quarantines them with a reason: nothing is dropped silently.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Iterator

from harnessrl import storage

FORMAT = "decisions"


def _lines(log_dir: str, kind: str) -> Iterator[bytes]:
    folder = storage.join(log_dir, kind)
    fs, path = storage.filesystem(folder)
    if fs.get_file_info(path).type.name == "NotFound":
        return
    for uri in storage.expand_sources([folder]):
        for _, line in storage.iter_lines(uri):
            yield line


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    ok = isinstance(rec, dict) and isinstance(rec.get("decision_id"), str) and isinstance(rec.get("candidates"), list)
    return rec if ok and isinstance(rec.get("best_index"), int) and 0 <= rec["best_index"] < len(rec["candidates"]) \
        else None


def _state(rec: dict) -> dict[str, Any]:
    s = rec.get("state")
    return s if isinstance(s, dict) else {"task": "", "history": [], "observation": str(s or "")}


def _episodes(decisions: list[dict]) -> list[list[dict]]:
    by_agent: dict[tuple, list[dict]] = defaultdict(list)
    for d in sorted(decisions, key=lambda d: d.get("logged_at", 0)):
        state = _state(d)
        by_agent[(d.get("agent_id") or d["decision_id"], state.get("task", ""))].append(d)
    episodes = []
    for seq in by_agent.values():
        current: list[dict] = []
        for d in seq:
            if current and len(_state(d).get("history") or []) <= len(_state(current[-1]).get("history") or []):
                episodes.append(current)
                current = []
            current.append(d)
        episodes.append(current)
    return episodes


def _native(episode: list[dict], outcomes: dict[str, dict]) -> dict[str, Any]:
    steps = []
    for i, d in enumerate(episode):
        nxt = _state(episode[i + 1]).get("history") if i + 1 < len(episode) else None
        steps.append({
            "observation": _state(d).get("observation", ""),
            "action": d["candidates"][d["best_index"]],
            "result": (nxt[-1].get("observation", "") if nxt else None),
            "candidates": d["candidates"],
            "info": {"decision_id": d["decision_id"], "scores": d.get("scores"), "model": d.get("model"),
                     "fallback": d.get("fallback"),
                     **({"status": nxt[-1]["status"]} if nxt and nxt[-1].get("status") is not None else {})},
        })
    record: dict[str, Any] = {"episode_id": f"decisions:{episode[0]['decision_id']}",
                              "task": _state(episode[0]).get("task", ""), "agent_name": episode[0].get("agent_id"),
                              "steps": steps}
    outcome = next((outcomes[d["decision_id"]] for d in reversed(episode) if d["decision_id"] in outcomes), None)
    if outcome:
        record["outcome"] = {k: v for k, v in outcome.items() if v is not None}
        record["end_reason"] = "agent_stop"
    return record


def to_native_lines(log_dirs: list[str]) -> list[bytes]:
    """Native JSONL lines for the decision logs under `log_dirs` (bad lines passed through)."""
    decisions, bad = [], []
    outcomes: dict[str, dict] = {}
    for log_dir in log_dirs:
        for line in _lines(log_dir, "decisions"):
            rec = _parse(line)
            (decisions.append(rec) if rec else bad.append(line))
        for line in _lines(log_dir, "feedback"):
            try:
                fb = json.loads(line)
                outcomes[fb["decision_id"]] = dict(fb["outcome"])
            except (ValueError, KeyError, TypeError):
                bad.append(line)
    return [json.dumps(_native(e, outcomes)).encode() for e in _episodes(decisions)] + bad
