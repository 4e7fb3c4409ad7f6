"""The signals table: outcome and step signals kept verbatim, one row each, in long format
(an outcomes file adds rows beside the log's own), and counted like records are."""

from __future__ import annotations

import json

import pyarrow.dataset as pads
import pytest

from harnessrl import signals
from harnessrl.formats import native
from harnessrl.formats.openai_chat import parse_line as parse_chat

OUTCOME = {"success": True, "score": 0.75, "judge": {"verdict": "pass", "notes": ["a", "b"]}, "tests": 7,
           "big": 12345678901234567890, "tiny": 1e-300, "text": "ünïcode \u2603"}
INFO = {"tests_passed": 2, "syntax_ok": True, "style": None, "nested": {"x": [1, 2.5]}}


def _native(eid: str, **extra) -> bytes:
    record = {"episode_id": eid, "task": "t", "outcome": OUTCOME,
              "steps": [{"action": "a", "reward": 0.5, "info": INFO}, {"action": "b", "done": True}], **extra}
    return json.dumps(record).encode()


def test_native_outcome_and_step_signals_are_verbatim():
    p = native.parse_line(_native("e1"), "f", 1)
    rows = signals.episode_signals(p.episode, p.steps, p.outcome)
    outcome = {r["name"]: json.loads(r["value_json"]) for r in rows if r["target"] == signals.EPISODE}
    assert outcome == OUTCOME
    assert all(r["step_idx"] is None and r["source"] == "native" for r in rows if r["target"] == "episode")
    step0 = {r["name"]: json.loads(r["value_json"]) for r in rows if r["step_idx"] == 0}
    assert step0 == {"reward": 0.5, **INFO}
    assert not [r for r in rows if r["step_idx"] == 1]  # no reward, no info: no signal


def test_joined_outcome_adds_rows_and_overwrites_nothing():
    p = native.parse_line(_native("e1"), "f", 1)
    rows = signals.episode_signals(p.episode, p.steps, p.outcome, {"success": False, "score": None})
    success = [(r["source"], r["value_json"]) for r in rows if r["name"] == "success"]
    assert success == [("native", "true"), (signals.OUTCOMES_FILE, "false")]


def test_conversation_formats_keep_outcome_and_skip_ingest_flags():
    record = {"id": "c1", "outcome": {"resolved": True, "reward": 3},
              "messages": [{"role": "user", "content": "hi"},
                           {"role": "assistant", "content": None,
                            "tool_calls": [{"id": "x", "type": "function",
                                            "function": {"name": "f", "arguments": "not json"}}]}]}
    p = parse_chat(json.dumps(record).encode(), "f", 1)
    rows = signals.episode_signals(p.episode, p.steps, p.outcome)
    assert {r["name"]: r["value_json"] for r in rows if r["target"] == "episode"} == {"resolved": "true", "reward": "3"}
    assert "flags" in json.loads(p.steps[0]["info"])  # the reader flagged the arguments ...
    assert not any(r["name"] == "flags" for r in rows)  # ... which is ours, not the source's


def test_oversize_value_is_cut_and_flagged_and_odd_outcomes_are_kept():
    rows = signals.outcome_signals("e", {"log": "x" * (native.MAX_FIELD_CHARS + 10)}, "native")
    assert rows[0]["value_truncated"] and len(rows[0]["value_json"]) == native.MAX_FIELD_CHARS
    assert signals.outcome_signals("e", 1.0, "native")[0]["name"] == "outcome"
    assert signals.outcome_signals("e", None, "native") == []


@pytest.mark.integration
def test_ingest_writes_signals_and_counts_add_up(ray_local, tmp_path):
    from harnessrl.pipelines.ingest import ingest

    lines = [_native("e1"), _native("e2", outcome={"success": False}), b"{broken",
             _native("e1"),  # duplicate id: quarantined, its signals are not written
             json.dumps({"episode_id": "e3", "steps": [{"action": "a"}]}).encode()]
    (tmp_path / "logs.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "outcomes.jsonl").write_text(json.dumps({"episode_id": "e3", "success": True, "score": 1}) + "\n")
    r = ingest([str(tmp_path / "logs.jsonl")], str(tmp_path / "out"), "native", str(tmp_path / "outcomes.jsonl"))
    assert r.records_in == 5 and r.records_ok == 3 and r.records_quarantined == 2
    table = pads.dataset(str(tmp_path / "out" / "signals"), format="parquet").to_table()
    assert table.schema.equals(signals_schema(), check_metadata=False)
    rows = table.to_pylist()
    # e1: 7 outcome entries + reward and 4 info entries of step 0; e2: 1 + 5; e3: 2 from the outcomes file
    assert r.signals == len(rows) == (7 + 5) + (1 + 5) + 2
    e1 = native.stable_episode_id("native", "e1")
    got = {r["name"]: json.loads(r["value_json"]) for r in rows if r["episode_id"] == e1 and r["target"] == "episode"}
    assert got == OUTCOME
    e3 = native.stable_episode_id("native", "e3")
    assert sorted((r["name"], r["value_json"], r["source"]) for r in rows if r["episode_id"] == e3) == [
        ("score", "1", "outcomes_file"), ("success", "true", "outcomes_file")]


def signals_schema():
    from harnessrl import schemas

    return schemas.SIGNALS
