"""The decision log keeps what `serve.decision_log_fields` says, and nothing more: with `hashes`
or `drop`, no text an agent sent (state, candidates, agent_id, feedback detail) reaches the
files, and such a log is never read back as training data. Real DecisionLog writing real part
files to local disk; the decisions reader of `harnessrl ingest --format decisions` on them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

SECRET = "the patient's name is Ada Lovelace"
DECISION = {"scores": [0.5, -0.1], "blended_scores": None, "prior_weight": 0.0, "best_index": 0,
            "fallback": False, "reason": None, "ood": False, "repeats": None,
            "model": {"name": "m", "version": "1"}, "decision_id": "d1", "agent_id": "agent-" + SECRET,
            "state": {"task": SECRET, "history": [{"action": "look", "observation": SECRET}], "observation": SECRET},
            "candidates": ["call " + SECRET, "wait"], "logprobs": [-0.1, -2.0]}
FEEDBACK = {"decision_id": "d1", "agent_id": "agent-" + SECRET, "outcome": {"success": True, "score": 1.0},
            "detail": "resolved for " + SECRET}


def _write(tmp_path: Path, fields: str) -> dict[str, list[dict]]:
    from harnessrl.serving.decision_log import DecisionLog

    log = DecisionLog(str(tmp_path), "replica-1", fields=fields)
    log.append("decisions", dict(DECISION))
    log.append("feedback", dict(FEEDBACK))
    assert log.flush() == 2
    raw = b"".join(p.read_bytes() for p in sorted(tmp_path.rglob("*.jsonl")))
    if fields != "full":
        assert SECRET.encode() not in raw and b"Ada" not in raw
    return {kind: [json.loads(line) for p in sorted((tmp_path / kind).glob("*.jsonl"))
                   for line in p.read_text().splitlines()] for kind in ("decisions", "feedback")}


def test_full_keeps_the_texts_and_stays_training_data(tmp_path):
    from harnessrl.formats.decisions import to_native_lines

    logged = _write(tmp_path, "full")
    (d,) = logged["decisions"]
    assert d["state"] == DECISION["state"] and d["candidates"] == DECISION["candidates"] and "fields" not in d
    (episode,) = [json.loads(line) for line in to_native_lines([str(tmp_path)])]
    assert episode["task"] == SECRET and episode["steps"][0]["action"] == DECISION["candidates"][0]


def test_hashes_keep_digests_of_every_agent_text(tmp_path):
    from harnessrl.formats.decisions import to_native_lines

    logged = _write(tmp_path, "hashes")
    (d,), (f,) = logged["decisions"], logged["feedback"]
    sha = lambda t: hashlib.sha256(t.encode()).hexdigest()  # noqa: E731
    assert d["candidates_sha256"] == [sha(c) for c in DECISION["candidates"]]
    assert d["state_sha256"] == sha(json.dumps(DECISION["state"], sort_keys=True, ensure_ascii=False))
    assert d["agent_id_sha256"] == sha(DECISION["agent_id"]) and f["detail_sha256"] == sha(FEEDBACK["detail"])
    assert not {"state", "candidates", "agent_id"} & set(d) and "detail" not in f
    # what is not the agent's text stays: the decision, its scores, the model, the outcome
    assert (d["scores"], d["best_index"], d["model"], d["logprobs"]) == (DECISION["scores"], 0, DECISION["model"],
                                                                         DECISION["logprobs"])
    assert f["outcome"] == FEEDBACK["outcome"] and d["fields"] == f["fields"] == "hashes"
    # not training data: the reader passes the lines through unchanged, for ingest to quarantine
    lines = to_native_lines([str(tmp_path)])
    assert not any(b'"episode_id"' in line for line in lines) and len(lines) == 1


def test_drop_keeps_no_agent_text_at_all(tmp_path):
    logged = _write(tmp_path, "drop")
    (d,), (f,) = logged["decisions"], logged["feedback"]
    assert not [k for k in (*d, *f) if k.split("_sha256")[0] in ("state", "candidates", "agent_id", "detail")]
    assert d["decision_id"] == f["decision_id"] == "d1" and d["fields"] == "drop"


def test_the_setting_is_a_serve_config_field():
    from harnessrl.config import ServeConfig, parse_serve
    from harnessrl.errors import ConfigError

    assert ServeConfig().decision_log_fields == "full"
    assert parse_serve({"decision_log_fields": "hashes"}).decision_log_fields == "hashes"
    with pytest.raises(ConfigError, match="decision_log_fields"):
        parse_serve({"decision_log_fields": "some"})
