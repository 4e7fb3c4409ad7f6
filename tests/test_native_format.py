"""The native JSONL format: `parse_line` maps a well-formed record field by field, and every kind
of bad line comes back as `Quarantined` with its reason code instead of raising."""

from __future__ import annotations

import copy
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harnessrl.formats.native import (
    MAX_FIELD_CHARS,
    ParsedEpisode,
    Quarantined,
    Reason,
    parse_line,
    stable_episode_id,
)

URI = "file:///logs/a.jsonl"


def full_record() -> dict:
    return {
        "episode_id": "ep-1",
        "task_id": "task-7",
        "group_id": "group-3",
        "task": "Find the key.",
        "system_prompt": "You are an agent.",
        "tools": [{"name": "search", "parameters": {"q": "string"}}],
        "agent_name": "bot",
        "model": "m-1",
        "metadata": {"run": 5},
        "outcome": {"success": True, "score": 0.5},
        "steps": [
            {
                "observation": "You are in a room.",
                "thought": "look first",
                "action": "look",
                "result": "A key is here.",
                "reward": 0,
                "candidates": ["look", "go north"],
                "info": {"b": 2, "a": 1},
            },
            {
                "observation": "A key is here.",
                "tool_calls": [
                    {"id": "c1", "name": "search", "arguments": {"q": "key", "n": 2}, "result": "found"},
                ],
                "reward": 1.5,
                "done": True,
            },
        ],
    }


def line(record) -> bytes:
    return json.dumps(record).encode("utf-8")


def parse(record) -> ParsedEpisode | Quarantined:
    return parse_line(line(record), URI, 12)


def ok(record) -> ParsedEpisode:
    out = parse(record)
    assert isinstance(out, ParsedEpisode), out
    return out


def quarantined(raw: bytes) -> Quarantined:
    out = parse_line(raw, URI, 3)
    assert isinstance(out, Quarantined), out
    return out


# ---- a valid record ---------------------------------------------------------------------------
def test_full_record_episode_fields():
    ep = ok(full_record()).episode
    assert ep["native_id"] == "ep-1"
    assert ep["episode_id"] == stable_episode_id("native", "ep-1")
    assert len(ep["episode_id"]) == 24 and ep["episode_id"] != "ep-1"
    assert ep["task_id"] == "task-7" and ep["group_id"] == "group-3"
    assert ep["task_text"] == "Find the key." and ep["system_prompt"] == "You are an agent."
    assert json.loads(ep["tool_definitions"]) == [{"name": "search", "parameters": {"q": "string"}}]
    assert ep["agent_name"] == "bot" and ep["model"] == "m-1"
    assert ep["n_steps"] == 2
    assert ep["end_reason"] == "agent_stop"
    assert (ep["terminated"], ep["truncated"]) == (True, False)
    assert ep["evaluable"] is True and ep["outcome_success"] is True and ep["outcome_score"] == 0.5
    assert ep["source_format"] == "native" and ep["source_uri"] == URI and ep["source_line"] == 12
    assert json.loads(ep["metadata"]) == {"run": 5}
    assert ep["lost_fields"] == []


def test_full_record_step_fields():
    steps = ok(full_record()).steps
    eid = stable_episode_id("native", "ep-1")
    first, second = steps
    assert [s["step_idx"] for s in steps] == [0, 1]
    assert all(s["episode_id"] == eid for s in steps)
    assert first["obs_text"] == "You are in a room."
    assert first["action_text"] == "look" and first["action_reasoning"] == "look first"
    assert first["result_text"] == "A key is here." and first["reward"] == 0.0
    assert first["candidates"] == ["look", "go north"]
    assert first["info"] == '{"a": 1, "b": 2}'  # JSON text, keys sorted
    assert first["tool_calls"] == []
    assert second["info"] == "{}" and second["candidates"] is None and second["reward"] == 1.5
    assert "done" not in second


def test_only_last_step_carries_end_flags():
    steps = ok(full_record()).steps
    assert [(s["terminated"], s["truncated"]) for s in steps] == [(False, False), (True, False)]


def test_episode_id_is_stable_and_distinct():
    a1 = ok(full_record()).episode["episode_id"]
    a2 = ok(full_record()).episode["episode_id"]
    other = full_record()
    other["episode_id"] = "ep-2"
    b = ok(other).episode["episode_id"]
    assert a1 == a2
    assert a1 != b
    # stable whatever file or line it came from
    assert parse_line(line(full_record()), "s3://elsewhere/x.jsonl", 999).episode["episode_id"] == a1


def test_integer_episode_id_is_accepted_as_text():
    rec = full_record()
    rec["episode_id"] = 42
    ep = ok(rec).episode
    assert ep["native_id"] == "42"
    assert ep["episode_id"] == stable_episode_id("native", "42")


def test_task_and_group_defaults():
    rec = full_record()
    del rec["task_id"], rec["group_id"]
    ep = ok(rec).episode
    assert ep["task_id"] == "ep-1"
    assert ep["group_id"] == "ep-1"
    rec = full_record()
    del rec["group_id"]
    assert ok(rec).episode["group_id"] == "task-7"


def _ending(end_reason, last_done):
    rec = full_record()
    if end_reason is None:
        rec.pop("end_reason", None)
    else:
        rec["end_reason"] = end_reason
    rec["steps"][-1]["done"] = last_done
    return ok(rec)


@pytest.mark.parametrize(
    "end_reason, last_done, expected_reason, terminated",
    [
        ("max_steps", True, "max_steps", False),
        ("max_steps", False, "max_steps", False),
        ("timeout", False, "timeout", False),
        (None, True, "agent_stop", True),
        (None, False, "unknown", False),
        ("env_done", False, "env_done", True),
    ],
)
def test_end_reason_decides_terminated_or_truncated(end_reason, last_done, expected_reason, terminated):
    parsed = _ending(end_reason, last_done)
    ep = parsed.episode
    assert ep["end_reason"] == expected_reason
    assert (ep["terminated"], ep["truncated"]) == (terminated, not terminated)
    last = parsed.steps[-1]
    assert (last["terminated"], last["truncated"]) == (terminated, not terminated)
    assert all(not s["terminated"] and not s["truncated"] for s in parsed.steps[:-1])


def test_missing_outcome_is_not_evaluable():
    rec = full_record()
    del rec["outcome"]
    ep = ok(rec).episode
    assert ep["evaluable"] is False and ep["outcome_success"] is None and ep["outcome_score"] is None


# ---- tool calls -------------------------------------------------------------------------------
def test_tool_call_dict_arguments_become_json_text():
    call = ok(full_record()).steps[1]["tool_calls"][0]
    assert call == {
        "call_id": "c1",
        "name": "search",
        "arguments_json": '{"n": 2, "q": "key"}',
        "arguments_parse_ok": True,
        "result_text": "found",
        "is_error": False,
    }


def test_tool_call_malformed_string_arguments_kept_verbatim():
    rec = full_record()
    rec["steps"][1]["tool_calls"][0]["arguments"] = '{"q": "key",'
    call = ok(rec).steps[1]["tool_calls"][0]
    assert call["arguments_json"] == '{"q": "key",'
    assert call["arguments_parse_ok"] is False


def test_tool_call_valid_string_arguments_parse_ok():
    rec = full_record()
    rec["steps"][1]["tool_calls"][0]["arguments"] = '{"q": "key"}'
    call = ok(rec).steps[1]["tool_calls"][0]
    assert call["arguments_json"] == '{"q": "key"}' and call["arguments_parse_ok"] is True


def test_empty_action_with_tool_calls_renders_canonical_action():
    rec = full_record()
    rec["steps"][1]["action"] = ""
    rec["steps"][1]["tool_calls"].append({"name": "open", "arguments": '{"path": "/k"}'})
    assert ok(rec).steps[1]["action_text"] == 'search({"n": 2, "q": "key"}); open({"path": "/k"})'


def test_blank_action_with_tool_calls_renders_canonical_action():
    rec = full_record()
    rec["steps"][1]["action"] = "   "
    assert ok(rec).steps[1]["action_text"] == 'search({"n": 2, "q": "key"})'


def test_action_wins_over_tool_calls():
    rec = full_record()
    rec["steps"][1]["action"] = "search for key"
    assert ok(rec).steps[1]["action_text"] == "search for key"


# ---- oversize fields and unknown keys ---------------------------------------------------------
def test_oversize_field_is_truncated_and_flagged():
    rec = full_record()
    rec["steps"][0]["observation"] = "x" * (MAX_FIELD_CHARS + 5)
    parsed = ok(rec)
    assert parsed.steps[0]["obs_text"] == "x" * MAX_FIELD_CHARS
    assert parsed.episode["lost_fields"] == [f"steps[0].observation:truncated:{MAX_FIELD_CHARS + 5}"]


def test_field_at_limit_is_not_flagged():
    rec = full_record()
    rec["task"] = "y" * MAX_FIELD_CHARS
    parsed = ok(rec)
    assert parsed.episode["task_text"] == "y" * MAX_FIELD_CHARS
    assert parsed.episode["lost_fields"] == []


def test_unknown_top_level_keys_go_to_metadata_extra():
    rec = full_record()
    rec["harness_version"] = "2.1"
    rec["cost"] = {"usd": 0.03}
    meta = json.loads(ok(rec).episode["metadata"])
    assert meta == {"run": 5, "extra": {"harness_version": "2.1", "cost": {"usd": 0.03}}}


# ---- quarantine reasons -----------------------------------------------------------------------
def test_invalid_utf8():
    q = quarantined(b'{"episode_id": "\xff\xfe", "steps": []}')
    assert q.reason == Reason.INVALID_UTF8


@pytest.mark.parametrize("raw", [b'{"episode_id": "a", "steps": [', b"", b"not json", b'{"a": 1}}'])
def test_broken_json(raw):
    assert quarantined(raw).reason == Reason.INVALID_JSON


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"3", b"null"])
def test_top_level_not_an_object(raw):
    assert quarantined(raw).reason == Reason.NOT_AN_OBJECT


def _mutated(path: tuple, value=None, delete: bool = False) -> bytes:
    rec = full_record()
    node = rec
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return line(rec)


@pytest.mark.parametrize(
    "raw, reason",
    [
        pytest.param(_mutated(("episode_id",), delete=True), Reason.MISSING_EPISODE_ID, id="missing_episode_id"),
        pytest.param(_mutated(("episode_id",), ""), Reason.MISSING_EPISODE_ID, id="empty_episode_id"),
        pytest.param(_mutated(("episode_id",), "   "), Reason.MISSING_EPISODE_ID, id="blank_episode_id"),
        pytest.param(_mutated(("episode_id",), None), Reason.MISSING_EPISODE_ID, id="null_episode_id"),
        pytest.param(_mutated(("episode_id",), ["a"]), Reason.WRONG_TYPE, id="list_episode_id"),
        pytest.param(_mutated(("episode_id",), True), Reason.WRONG_TYPE, id="bool_episode_id"),
        pytest.param(_mutated(("episode_id",), 1.5), Reason.WRONG_TYPE, id="float_episode_id"),
        pytest.param(_mutated(("steps",), delete=True), Reason.MISSING_STEPS, id="missing_steps"),
        pytest.param(_mutated(("steps",), {"0": {}}), Reason.WRONG_TYPE, id="steps_object"),
        pytest.param(_mutated(("steps",), "look"), Reason.WRONG_TYPE, id="steps_string"),
        pytest.param(_mutated(("steps",), []), Reason.EMPTY_EPISODE, id="empty_steps"),
        pytest.param(_mutated(("steps", 0), "look"), Reason.WRONG_TYPE, id="step_not_object"),
        pytest.param(_mutated(("steps", 0, "action"), delete=True), Reason.STEP_WITHOUT_ACTION, id="no_action"),
        pytest.param(_mutated(("steps", 0, "action"), "  "), Reason.STEP_WITHOUT_ACTION, id="blank_action"),
        pytest.param(_mutated(("steps", 0, "observation"), {"text": "room"}), Reason.WRONG_TYPE, id="obs_dict"),
        pytest.param(_mutated(("steps", 0, "observation"), ["room"]), Reason.WRONG_TYPE, id="obs_list"),
        pytest.param(_mutated(("steps", 0, "reward"), "1"), Reason.WRONG_TYPE, id="reward_string"),
        pytest.param(_mutated(("steps", 0, "reward"), True), Reason.WRONG_TYPE, id="reward_bool"),
        pytest.param(_mutated(("steps", 0, "reward"), [1]), Reason.WRONG_TYPE, id="reward_list"),
        pytest.param(_mutated(("outcome", "success"), "yes"), Reason.WRONG_TYPE, id="success_string"),
        pytest.param(_mutated(("outcome", "success"), 1), Reason.WRONG_TYPE, id="success_int"),
        pytest.param(_mutated(("outcome",), ["ok"]), Reason.WRONG_TYPE, id="outcome_list"),
        pytest.param(_mutated(("outcome", "score"), "high"), Reason.WRONG_TYPE, id="score_string"),
        pytest.param(_mutated(("steps", 0, "candidates"), "look"), Reason.WRONG_TYPE, id="candidates_string"),
        pytest.param(_mutated(("steps", 0, "candidates"), {"a": 1}), Reason.WRONG_TYPE, id="candidates_object"),
        pytest.param(_mutated(("steps", 0, "candidates"), ["ok", {"x": 1}]), Reason.WRONG_TYPE, id="candidate_obj"),
        pytest.param(_mutated(("steps", 0, "info"), ["x"]), Reason.WRONG_TYPE, id="info_list"),
        pytest.param(_mutated(("steps", 1, "tool_calls"), {"name": "x"}), Reason.WRONG_TYPE, id="tool_calls_obj"),
        pytest.param(_mutated(("steps", 1, "tool_calls", 0), "search"), Reason.WRONG_TYPE, id="tool_call_str"),
        pytest.param(_mutated(("steps", 1, "tool_calls", 0, "name"), delete=True), Reason.WRONG_TYPE,
                     id="tool_call_no_name"),
    ],
)
def test_quarantine_reason(raw, reason):
    q = quarantined(raw)
    assert q.reason == reason
    assert isinstance(q.detail, str) and q.detail


def test_deeply_nested_json_is_quarantined_not_raised():
    out = parse_line(b"[" * 100_000 + b"]" * 100_000, URI, 1)
    assert isinstance(out, Quarantined) and out.reason == Reason.INVALID_JSON


def test_lone_surrogate_escape_is_not_passed_through():
    raw = b'{"episode_id": "e", "steps": [{"action": "go", "observation": "a\\ud800b"}]}'
    out = parse_line(raw, URI, 1)
    if isinstance(out, ParsedEpisode):
        out.steps[0]["obs_text"].encode("utf-8")  # must not raise
    else:
        assert out.reason in {Reason.INVALID_UTF8, Reason.WRONG_TYPE}


# ---- property: never raises -------------------------------------------------------------------
JSON_VALUES = st.recursive(
    # NaN, Infinity and huge integers included: Python's JSON reader accepts them (quarantined, never stored)
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.just(10**400) | st.floats(width=32)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


ALL_PATHS = [p for p in _paths(full_record()) if p]


@st.composite
def corrupted_lines(draw) -> bytes:
    if draw(st.booleans()):
        rec = full_record()
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(ALL_PATHS))
            node = rec
            try:
                for key in path[:-1]:
                    node = node[key]
                node[path[-1]] = draw(JSON_VALUES)
            except (KeyError, IndexError, TypeError):
                pass  # an earlier replacement removed this path
        return line(rec)
    data = bytearray(line(full_record()))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["delete", "insert", "replace"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        byte = draw(st.integers(0, 255))
        if op == "delete" and data:
            del data[pos]
        elif op == "insert":
            data.insert(pos, byte)
        elif data:
            data[pos] = byte
    return bytes(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corrupted_lines())
def test_parse_line_never_raises_on_corrupted_input(raw):
    out = parse_line(raw, URI, 1)
    assert isinstance(out, (ParsedEpisode, Quarantined))
    assert not (isinstance(out, ParsedEpisode) and isinstance(out, Quarantined))
    if isinstance(out, Quarantined):
        assert out.reason in {v for k, v in vars(Reason).items() if k.isupper()}
    else:
        assert out.episode["n_steps"] == len(out.steps) >= 1
        assert_finite(out)


def assert_finite(parsed: ParsedEpisode) -> None:
    """What reaches the tables: a score and rewards that are finite numbers or absent."""
    numbers = [parsed.episode["outcome_score"]] + [s["reward"] for s in parsed.steps]
    assert all(n is None or math.isfinite(n) for n in numbers), numbers


@pytest.mark.parametrize("path", [("steps", 0, "reward"), ("outcome", "score")], ids=["step_reward", "outcome_score"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e308 * 10, 10 ** 400],
                         ids=["nan", "inf", "-inf", "1e309", "10**400"])
def test_non_finite_reward_or_score_is_quarantined(path, value):
    raw = _mutated(path, value)
    q = quarantined(raw)
    assert q.reason == Reason.NON_FINITE_NUMBER and path[-1] in q.detail
    text = raw.replace(b"Infinity", b"1e999").replace(b"NaN", b"1e999")  # as another JSON writer spells it
    assert quarantined(text).reason == Reason.NON_FINITE_NUMBER


def test_full_record_is_not_mutated_by_parse():
    rec = full_record()
    before = copy.deepcopy(rec)
    ok(rec)
    assert rec == before


def test_lone_surrogate_episode_id_is_quarantined_not_raised():
    out = parse_line(b'{"episode_id": "a\\ud800", "steps": [{"action": "x"}]}', "f.jsonl", 1)
    assert isinstance(out, Quarantined) and out.reason == Reason.INVALID_UTF8
