"""Decision log -> native episodes: grouping by agent and growing history, results from the next
decision, feedback as outcome, bad lines passed through for the native reader to quarantine."""

from __future__ import annotations

import json

from harnessrl.formats.decisions import to_native_lines
from harnessrl.formats.native import ParsedEpisode, Quarantined, parse_line


def _decision(i, agent, history, best=0, task="find the coin"):
    return {"decision_id": f"d{i}", "agent_id": agent, "logged_at": float(i), "best_index": best,
            "candidates": [f"act {i}", "look"], "scores": [1.0, 0.5],
            "state": {"task": task, "observation": f"obs {i}",
                      "history": [{"action": f"act {j}", "observation": f"res {j}", "status": j * 0.5}
                                  for j in history]}}


def test_grouping_results_outcome_and_bad_lines(tmp_path):
    (tmp_path / "decisions").mkdir()
    (tmp_path / "feedback").mkdir()
    rows = [_decision(0, "a", []), _decision(1, "a", [0]), _decision(2, "a", [0, 1], best=1),
            _decision(3, "a", []),  # history shrank: a new episode
            _decision(4, "b", [])]
    lines = [json.dumps(r) for r in rows] + ["{not json"]
    (tmp_path / "decisions" / "p1.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "feedback" / "p1.jsonl").write_text(json.dumps({"decision_id": "d2", "outcome": {"success": True}})
                                                    + "\n")
    out = to_native_lines([str(tmp_path)])
    parsed = [parse_line(line, "log", i) for i, line in enumerate(out, start=1)]
    episodes = [p for p in parsed if isinstance(p, ParsedEpisode)]
    assert [type(p) for p in parsed].count(Quarantined) == 1  # the broken line, kept and quarantined
    by_id = {e.episode["native_id"]: e for e in episodes}
    assert set(by_id) == {"decisions:d0", "decisions:d3", "decisions:d4"}
    first = by_id["decisions:d0"]
    assert [s["action_text"] for s in first.steps] == ["act 0", "act 1", "look"]
    assert [s["result_text"] for s in first.steps] == ["res 0", "res 1", ""]
    assert first.episode["outcome_success"] is True and first.episode["task_text"] == "find the coin"
    assert by_id["decisions:d3"].episode["outcome_success"] is None
    assert json.loads(first.steps[0]["info"])["decision_id"] == "d0"
    # the status a request's history gave after each action is the step's, and the state reads it again
    assert [json.loads(s["info"]).get("status") for s in first.steps] == [0.0, 0.5, None]
    from harnessrl.transitions import _status
    assert [_status(s["info"], "score") for s in first.steps] == ["0", "0.5", ""]


def test_feedback_with_a_non_finite_score_is_quarantined(tmp_path):
    (tmp_path / "decisions").mkdir()
    (tmp_path / "feedback").mkdir()
    (tmp_path / "decisions" / "p.jsonl").write_text(json.dumps(_decision(0, "a", [])) + "\n")
    (tmp_path / "feedback" / "p.jsonl").write_text('{"decision_id": "d0", "outcome": {"success": true, "score": NaN}}\n')
    (line,) = to_native_lines([str(tmp_path)])
    q = parse_line(line, "log", 1)
    assert isinstance(q, Quarantined) and q.reason == "non_finite_number"
