"""The conversation readers (OpenAI Chat, OpenAI Responses, Anthropic, ATIF) and format detection.

The same agent run is logged in all four formats under tests/data/formats/ (parallel calls, a
tool error, a user message mid-run, a final answer): each must map to the same steps. Edge cases
are written once as a format-neutral script and built in every format by a small builder, so one
test checks all four readers; type errors are mutations of the sample records, per format.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harnessrl.formats import anthropic, atif, openai_chat, openai_responses
from harnessrl.formats.detect import EMPTY, FORMATS, PARSERS, UNKNOWN, classify, detect_format
from harnessrl.formats.flags import Flag
from harnessrl.formats.native import MAX_FIELD_CHARS, ParsedEpisode, Quarantined, Reason, stable_episode_id
from harnessrl.schemas import EPISODES, STEPS

DATA = Path(__file__).parent / "data" / "formats"
URI = "file:///logs/run.jsonl"
SAMPLE_FILES = {
    "openai-chat": "openai_chat.jsonl",
    "openai-responses": "openai_responses.jsonl",
    "anthropic": "anthropic.jsonl",
    "atif": "atif.json",
}
CONVERSATION_FORMATS = list(SAMPLE_FILES)
ALL_REASONS = {v for k, v in vars(Reason).items() if k.isupper()}


def sample(fmt: str) -> dict:
    return json.loads((DATA / SAMPLE_FILES[fmt]).read_text())


def encode(record: Any) -> bytes:
    return json.dumps(record).encode("utf-8")


def parse(fmt: str, record: Any) -> ParsedEpisode | Quarantined:
    return PARSERS[fmt](encode(record), URI, 7)


def ok(fmt: str, record: Any) -> ParsedEpisode:
    out = parse(fmt, record)
    assert isinstance(out, ParsedEpisode), out
    return out


def quarantined(fmt: str, raw: bytes) -> Quarantined:
    out = PARSERS[fmt](raw, URI, 7)
    assert isinstance(out, Quarantined), out
    return out


def flags(parsed: ParsedEpisode) -> dict[str, int]:
    return json.loads(parsed.episode["metadata"]).get("ingest_flags", {})


def step_flags(step: dict) -> list[str]:
    return json.loads(step["info"]).get("flags", [])


# ---- builders: one format-neutral script -> a record in each format -------------------------------
# Script items: ("system", text) | ("user", text) | ("result", call_id, text, is_error)
#               ("turn", text, [(call_id, name, arguments_json_text)], reasoning)
def _args(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # object-argument formats: a logger that stored a string


def build_chat(script: list[tuple], **top: Any) -> dict:
    messages = []
    for item in script:
        if item[0] in ("system", "user"):
            messages.append({"role": item[0], "content": item[1]})
        elif item[0] == "turn":
            _, text, calls, reasoning = item
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                     for i, n, a in calls]
            if reasoning:
                msg["reasoning_content"] = reasoning
            messages.append(msg)
        else:
            _, call_id, text, err = item
            error = {"is_error": True} if err else {}
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text, **error})
    return {"id": "ep-1", "messages": messages, **top}


def build_responses(script: list[tuple], **top: Any) -> dict:
    items: list[dict] = []
    for item in script:
        if item[0] in ("system", "user"):
            items.append({"type": "message", "role": item[0], "content": [{"type": "input_text", "text": item[1]}]})
        elif item[0] == "turn":
            _, text, calls, reasoning = item
            if reasoning:
                items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": reasoning}]})
            if text or not (calls or reasoning):
                parts = [{"type": "output_text", "text": text}] if text else []
                items.append({"type": "message", "role": "assistant", "content": parts})
            items += [{"type": "function_call", "call_id": i, "name": n, "arguments": a} for i, n, a in calls]
        else:
            _, call_id, text, err = item
            items.append({"type": "function_call_output", "call_id": call_id, "output": text,
                          **({"is_error": True} if err else {})})
    return {"id": "ep-1", "input": items, **top}


def build_anthropic(script: list[tuple], **top: Any) -> dict:
    messages, system = [], []
    for item in script:
        if item[0] == "system":
            system.append(item[1])
        elif item[0] == "user":
            messages.append({"role": "user", "content": item[1]})
        elif item[0] == "turn":
            _, text, calls, reasoning = item
            blocks = [{"type": "thinking", "thinking": reasoning}] if reasoning else []
            blocks += [{"type": "text", "text": text}] if text else []
            blocks += [{"type": "tool_use", "id": i, "name": n, "input": _args(a)} for i, n, a in calls]
            messages.append({"role": "assistant", "content": blocks})
        else:
            _, call_id, text, err = item
            error = {"is_error": True} if err else {}
            block = {"type": "tool_result", "tool_use_id": call_id, "content": text, **error}
            messages.append({"role": "user", "content": [block]})
    return {"id": "ep-1", "messages": messages, **({"system": "\n\n".join(system)} if system else {}), **top}


def build_atif(script: list[tuple], **top: Any) -> dict:
    steps: list[dict] = []
    for item in script:
        if item[0] in ("system", "user"):
            steps.append({"source": item[0], "message": item[1]})
        elif item[0] == "turn":
            _, text, calls, reasoning = item
            step = {"source": "agent", "message": text,
                    "tool_calls": [{"tool_call_id": i, "function_name": n, "arguments": _args(a)} for i, n, a in calls]}
            if reasoning:
                step["reasoning_content"] = reasoning
            steps.append(step)
        else:  # results belong to the latest agent step
            _, call_id, text, err = item
            agent = next(s for s in reversed(steps) if s["source"] == "agent")
            result = {"source_call_id": call_id, "content": text, **({"is_error": True} if err else {})}
            agent.setdefault("observation", {"results": []})["results"].append(result)
    for n, step in enumerate(steps, 1):
        step["step_id"] = n
    return {"schema_version": "ATIF-v1.7", "session_id": "ep-1", "agent": {"name": "bot", "version": "1"},
            "steps": steps, **top}


BUILDERS: dict[str, Callable[..., dict]] = {
    "openai-chat": build_chat,
    "openai-responses": build_responses,
    "anthropic": build_anthropic,
    "atif": build_atif,
}


def run(fmt: str, script: list[tuple], **top: Any) -> ParsedEpisode | Quarantined:
    return parse(fmt, BUILDERS[fmt](script, **top))


def run_ok(fmt: str, script: list[tuple], **top: Any) -> ParsedEpisode:
    out = run(fmt, script, **top)
    assert isinstance(out, ParsedEpisode), out
    return out


def turn(text: str = "", calls: list[tuple] = (), reasoning: str = "") -> tuple:
    return ("turn", text, list(calls), reasoning)


def result(call_id: str, text: str, is_error: bool = False) -> tuple:
    return ("result", call_id, text, is_error)


TASK = ("user", "Fix the bug.")
ANSWER = turn("Done.")

formats = pytest.mark.parametrize("fmt", CONVERSATION_FORMATS)


# ---- the realistic samples: the same run in four formats ---------------------------------------
@formats
def test_sample_episode_row(fmt):
    parsed = ok(fmt, sample(fmt))
    ep = parsed.episode
    native_id = {"openai-chat": "chat-0001", "openai-responses": "resp-conv-0001",
                 "anthropic": "msg-conv-0001", "atif": "9f1c2d3e-0001"}[fmt]
    assert ep["native_id"] == native_id
    assert ep["episode_id"] == stable_episode_id(fmt, native_id)
    assert ep["source_format"] == fmt and ep["source_uri"] == URI and ep["source_line"] == 7
    assert ep["task_id"] == "calc-fix" and ep["group_id"] == "calc-fix"
    assert ep["task_text"] == "The test test_add fails in calc.py. Fix it."
    assert ep["system_prompt"].startswith("You are a coding agent.")
    assert [t.get("name") or t.get("function", {}).get("name") for t in json.loads(ep["tool_definitions"])] == [
        "read_file", "run_tests", "edit_file"]
    assert ep["n_steps"] == 5 == len(parsed.steps)
    assert (ep["end_reason"], ep["terminated"], ep["truncated"]) == ("agent_stop", True, False)
    assert (ep["evaluable"], ep["outcome_success"], ep["outcome_score"]) == (True, True, 1.0)
    assert "ingest_flags" not in json.loads(ep["metadata"])


@formats
def test_sample_steps(fmt):
    steps = ok(fmt, sample(fmt)).steps
    read, edit, retry, verify, answer = steps
    # parallel calls: one step, results joined in call order whatever order they arrived in
    assert [c["name"] for c in read["tool_calls"]] == ["read_file", "run_tests"]
    assert read["action_text"] == 'read_file({"path": "calc.py"}); run_tests({})'
    assert read["result_text"].startswith("read_file: def add(a, b):")
    assert "\nrun_tests: FAILED test_calc.py::test_add" in read["result_text"]
    assert read["tool_calls"][1]["result_text"].startswith("FAILED")
    # the tool error is visible on the call and in the step's result
    assert edit["tool_calls"][0]["is_error"] is True
    assert edit["tool_calls"][0]["result_text"] == "Error: calc.py is read-only"
    assert edit["result_text"] == "edit_file [error]: Error: calc.py is read-only"
    assert json.loads(edit["tool_calls"][0]["arguments_json"]) == {"path": "calc.py", "old": "a - b", "new": "a + b"}
    # the user's message mid-run is what the next decision saw
    assert retry["obs_text"] == "I made calc.py writable, try again."
    assert retry["tool_calls"][0]["is_error"] is False and retry["result_text"] == "Edited calc.py (1 line changed)"
    assert verify["action_text"] == "run_tests({})" and verify["result_text"] == "3 passed in 0.02s"
    assert verify["action_reasoning"]
    # the answer: a step without calls, the only terminal one
    assert answer["action_text"] == "Fixed: add() subtracted instead of adding. All 3 tests pass."
    assert answer["tool_calls"] == [] and answer["result_text"] == ""
    assert [(s["terminated"], s["truncated"]) for s in steps] == [(False, False)] * 4 + [(True, False)]
    assert [s["step_idx"] for s in steps] == [0, 1, 2, 3, 4]
    assert all(c["arguments_parse_ok"] for s in steps for c in s["tool_calls"])


@formats
def test_sample_rows_fit_the_arrow_schemas(fmt):
    parsed = ok(fmt, sample(fmt))
    assert set(parsed.episode) == set(EPISODES.names)
    assert all(set(s) == set(STEPS.names) for s in parsed.steps)
    pa.Table.from_pylist([parsed.episode], schema=EPISODES)
    pa.Table.from_pylist(parsed.steps, schema=STEPS)


def test_chat_reasoning_and_info():
    first, *_, last = ok("openai-chat", sample("openai-chat")).steps
    assert first["action_reasoning"] == "Let me read the code and run the tests."  # text next to calls
    assert json.loads(first["info"]) == {"finish_reason": "tool_calls"}
    assert json.loads(last["info"])["usage"] == {"prompt_tokens": 812, "completion_tokens": 19}
    steps = ok("openai-chat", sample("openai-chat")).steps
    assert steps[3]["action_reasoning"] == "The edit applied; verify with the tests."


def test_responses_reasoning_items_and_encrypted_content():
    parsed = ok("openai-responses", sample("openai-responses"))
    assert parsed.steps[0]["action_reasoning"] == "Read the code and run the tests in parallel."
    assert parsed.steps[1]["action_reasoning"] == "The sign is wrong."
    assert parsed.steps[4]["action_reasoning"] == "All green."  # the `output` list is read after `input`
    assert parsed.episode["lost_fields"] == ["input[6].encrypted_content:opaque"]


def test_anthropic_thinking_is_reasoning_and_text_follows_it():
    steps = ok("anthropic", sample("anthropic")).steps
    assert steps[0]["action_reasoning"] == (
        "I need the source and the failing test output.\n\nLet me read the code and run the tests.")
    assert json.loads(steps[4]["info"])["stop_reason"] == "end_turn"


def test_atif_agent_metrics_and_metadata():
    parsed = ok("atif", sample("atif"))
    ep = parsed.episode
    assert ep["agent_name"] == "terminus-2" and ep["model"] == "claude-sonnet-4-20250514"
    meta = json.loads(ep["metadata"])
    assert meta["atif"]["schema_version"] == "ATIF-v1.7" and meta["atif"]["agent_version"] == "2.0.0"
    assert meta["atif"]["final_metrics"]["total_steps"] == 8
    info = json.loads(parsed.steps[0]["info"])
    assert info["metrics"] == {"prompt_tokens": 520, "completion_tokens": 80, "cached_tokens": 200, "cost_usd": 0.00045}
    assert ep["lost_fields"] == [
        "steps[2].metrics.completion_token_ids:dropped:3", "steps[2].metrics.logprobs:dropped:3"]
    assert json.loads(parsed.steps[4]["info"]) == {"timestamp": "2025-10-11T10:30:05Z"}


def test_atif_trajectory_id_when_no_session_id_and_results_without_call_id():
    rec = build_atif([TASK, turn("ls", [])])
    del rec["session_id"]
    rec["trajectory_id"] = "traj-9"
    rec["steps"][1]["observation"] = {"results": [{"content": "a.txt b.txt"}]}
    parsed = ok("atif", rec)
    assert parsed.episode["native_id"] == "traj-9"
    assert parsed.steps[0]["action_text"] == "ls" and parsed.steps[0]["result_text"] == "a.txt b.txt"
    assert flags(parsed) == {}


def test_atif_system_step_observation_is_the_next_observation():
    rec = build_atif([TASK, turn("", [("c1", "ls", "{}")]), result("c1", "a.txt"), ANSWER])
    rec["steps"].insert(2, {"step_id": 9, "source": "system", "message": "",
                            "observation": {"results": [{"content": "context compacted"}]}})
    assert ok("atif", rec).steps[1]["obs_text"] == "context compacted"


@pytest.mark.parametrize("version", ["ATIF-v1.4", "ATIF-v1.7", "v1.2", "1.5", None])
def test_atif_versions_accepted(version):
    rec = sample("atif")
    rec["schema_version"] = version
    ok("atif", rec)


# ---- mapping rules, checked in every format -----------------------------------------------------
@formats
def test_parallel_calls_are_one_step_with_results_in_call_order(fmt):
    calls = [("c1", "read", '{"p": 1}'), ("c2", "read", '{"p": 2}'), ("c3", "grep", '{"q": "x"}')]
    parsed = run_ok(fmt, [TASK, turn("", calls), result("c3", "three"), result("c1", "one"),
                          result("c2", "two", True), ANSWER])
    step = parsed.steps[0]
    assert parsed.episode["n_steps"] == 2
    assert [c["call_id"] for c in step["tool_calls"]] == ["c1", "c2", "c3"]
    assert [c["result_text"] for c in step["tool_calls"]] == ["one", "two", "three"]
    assert [c["is_error"] for c in step["tool_calls"]] == [False, True, False]
    assert step["result_text"] == "read: one\nread [error]: two\ngrep: three"
    assert step["action_text"] == 'read({"p": 1}); read({"p": 2}); grep({"q": "x"})'


@formats
def test_system_prompt_task_and_later_user_text(fmt):
    parsed = run_ok(fmt, [("system", "Be brief."), TASK, ("user", "Details: see README."),
                          turn("", [("c1", "ls", "{}")]), result("c1", "README"), ("user", "Hurry."), ANSWER])
    ep, steps = parsed.episode, parsed.steps
    assert ep["system_prompt"] == "Be brief." and ep["task_text"] == "Fix the bug."
    assert steps[0]["obs_text"] == "Details: see README."
    assert steps[1]["obs_text"] == "Hurry." and steps[0]["result_text"] == "README"


@formats
def test_text_next_to_calls_is_reasoning_and_text_alone_is_the_action(fmt):
    parsed = run_ok(fmt, [TASK, turn("Let me look.", [("c1", "ls", "{}")], reasoning="think"),
                          result("c1", "x"), turn("All good.", reasoning="sure")])
    first, last = parsed.steps
    assert first["action_text"] == "ls({})" and first["action_reasoning"] == "think\n\nLet me look."
    assert last["action_text"] == "All good." and last["action_reasoning"] == "sure"


@formats
def test_text_after_the_last_decision_is_its_result(fmt):
    assert run_ok(fmt, [TASK, ANSWER, ("user", "Thanks!")]).steps[-1]["result_text"] == "Thanks!"


@formats
def test_ending_on_a_tool_call_is_truncated(fmt):
    parsed = run_ok(fmt, [TASK, turn("", [("c1", "ls", "{}")]), result("c1", "x")])
    ep = parsed.episode
    assert (ep["end_reason"], ep["terminated"], ep["truncated"]) == ("unknown", False, True)
    assert (parsed.steps[-1]["terminated"], parsed.steps[-1]["truncated"]) == (False, True)


@pytest.mark.parametrize("fmt", CONVERSATION_FORMATS)
@pytest.mark.parametrize("end_reason, terminated", [("max_steps", False), ("timeout", False), ("error", True)])
def test_explicit_end_reason_wins(fmt, end_reason, terminated):
    ep = run_ok(fmt, [TASK, ANSWER], end_reason=end_reason).episode
    assert (ep["end_reason"], ep["terminated"], ep["truncated"]) == (end_reason, terminated, not terminated)


@formats
def test_outcome_inline_aliases_and_absent(fmt):
    ep = run_ok(fmt, [TASK, ANSWER], outcome={"resolved": False, "reward": 0}).episode
    assert (ep["evaluable"], ep["outcome_success"], ep["outcome_score"]) == (True, False, 0.0)
    ep = run_ok(fmt, [TASK, ANSWER]).episode
    assert (ep["evaluable"], ep["outcome_success"], ep["outcome_score"]) == (False, None, None)


@formats
def test_outcome_and_ids_from_the_metadata_object(fmt):
    meta_key = "extra" if fmt == "atif" else "metadata"
    meta = {"outcome": {"success": True, "score": 0.5}, "task_id": "t-3", "group_id": "g-1", "run": 4}
    parsed = run_ok(fmt, [TASK, ANSWER], **{meta_key: meta})
    ep = parsed.episode
    assert (ep["outcome_success"], ep["outcome_score"], ep["task_id"], ep["group_id"]) == (True, 0.5, "t-3", "g-1")
    assert json.loads(ep["metadata"])["run"] == 4


@formats
def test_task_and_group_default_to_the_native_id(fmt):
    ep = run_ok(fmt, [TASK, ANSWER]).episode
    assert ep["task_id"] == ep["group_id"] == ep["native_id"] == "ep-1"


@formats
def test_unknown_top_level_keys_are_kept_in_metadata(fmt):
    meta = json.loads(run_ok(fmt, [TASK, ANSWER], harness_version="2.1").episode["metadata"])
    assert meta["extra"] == {"harness_version": "2.1"}


@formats
def test_episode_id_is_stable_and_per_format(fmt):
    a = run_ok(fmt, [TASK, ANSWER]).episode["episode_id"]
    b = PARSERS[fmt](encode(BUILDERS[fmt]([TASK, ANSWER])), "s3://other/file.jsonl", 99).episode["episode_id"]
    assert a == b == stable_episode_id(fmt, "ep-1") != stable_episode_id("native", "ep-1")


@formats
def test_integer_native_id(fmt):
    rec = BUILDERS[fmt]([TASK, ANSWER])
    rec["session_id" if fmt == "atif" else "id"] = 42
    assert ok(fmt, rec).episode["native_id"] == "42"


# ---- anomalies that keep the episode (flags) -----------------------------------------------------
@formats
def test_call_without_result_keeps_the_step_and_flags_it(fmt):
    parsed = run_ok(fmt, [TASK, turn("", [("c1", "ls", "{}"), ("c2", "cat", "{}")]), result("c1", "x"), ANSWER])
    step = parsed.steps[0]
    assert [c["result_text"] for c in step["tool_calls"]] == ["x", ""]
    assert step["result_text"] == "ls: x"
    assert step_flags(step) == [Flag.CALL_WITHOUT_RESULT]
    assert flags(parsed) == {Flag.CALL_WITHOUT_RESULT: 1}


@formats
def test_tool_result_without_call_is_kept_as_observation_and_flagged(fmt):
    parsed = run_ok(fmt, [TASK, turn("", [("c1", "ls", "{}")]), result("c1", "x"), result("zz", "stray output"),
                          ANSWER])
    assert parsed.episode["n_steps"] == 2
    assert parsed.steps[1]["obs_text"] == "stray output"
    assert step_flags(parsed.steps[1]) == [Flag.TOOL_RESULT_WITHOUT_CALL]
    assert flags(parsed) == {Flag.TOOL_RESULT_WITHOUT_CALL: 1}


@formats
def test_second_result_for_the_same_call_is_an_orphan(fmt):
    parsed = run_ok(fmt, [TASK, turn("", [("c1", "ls", "{}")]), result("c1", "x"), result("c1", "again"), ANSWER])
    assert parsed.steps[0]["tool_calls"][0]["result_text"] == "x"
    assert flags(parsed) == {Flag.TOOL_RESULT_WITHOUT_CALL: 1}


@pytest.mark.parametrize("fmt", ["openai-chat", "openai-responses", "anthropic"])
def test_tool_result_before_any_call_goes_to_the_first_observation(fmt):
    parsed = run_ok(fmt, [TASK, result("c0", "leftover"), ANSWER])
    assert parsed.steps[0]["obs_text"] == "leftover"
    assert flags(parsed) == {Flag.TOOL_RESULT_WITHOUT_CALL: 1}


@formats
def test_non_json_arguments_are_kept_verbatim_and_flagged(fmt):
    parsed = run_ok(fmt, [TASK, turn("", [("c1", "edit", '{"path": "a.py", "new": ')]), result("c1", "ok"), ANSWER])
    call = parsed.steps[0]["tool_calls"][0]
    assert call["arguments_json"] == '{"path": "a.py", "new": ' and call["arguments_parse_ok"] is False
    assert parsed.steps[0]["action_text"] == 'edit({"path": "a.py", "new": )'
    assert step_flags(parsed.steps[0]) == [Flag.ARGUMENTS_NOT_JSON]
    assert flags(parsed) == {Flag.ARGUMENTS_NOT_JSON: 1}


@formats
def test_empty_assistant_turn_is_skipped_and_flagged(fmt):
    parsed = run_ok(fmt, [TASK, turn(""), ("user", "Well?"), ANSWER])
    assert parsed.episode["n_steps"] == 1
    assert parsed.steps[0]["obs_text"] == "Well?"
    assert flags(parsed) == {Flag.EMPTY_TURN: 1}


@formats
def test_no_assistant_turn_is_an_empty_episode(fmt):
    assert run(fmt, [TASK, ("user", "hello?")]).reason == Reason.EMPTY_EPISODE
    assert run(fmt, [TASK, turn(""), ("user", "?")]).reason == Reason.EMPTY_EPISODE


@pytest.mark.parametrize("fmt, rec_path, value", [
    ("openai-chat", ("messages", 1), {"role": "critic", "name": "f", "content": "legacy"}),
    ("openai-responses", ("input", 1), {"type": "message", "role": "critic", "content": "legacy"}),
    ("anthropic", ("messages", 1), {"role": "observer", "content": "legacy"}),
    ("atif", ("steps", 1), {"step_id": 2, "source": "environment", "message": "legacy"}),
])
def test_unknown_role_text_is_kept_as_observation(fmt, rec_path, value):
    rec = BUILDERS[fmt]([TASK, ("user", "placeholder"), ANSWER])
    rec[rec_path[0]][rec_path[1]] = value
    parsed = ok(fmt, rec)
    assert parsed.steps[0]["obs_text"] == "legacy"
    assert flags(parsed) == {Flag.UNKNOWN_ROLE: 1}


def test_responses_unsupported_item_is_dropped_and_named():
    rec = build_responses([TASK, turn("", [("c1", "ls", "{}")]), result("c1", "x"), ANSWER])
    rec["input"].insert(2, {"type": "web_search_call", "id": "ws_1", "status": "completed"})
    parsed = ok("openai-responses", rec)
    assert parsed.episode["n_steps"] == 2 and parsed.steps[0]["tool_calls"][0]["result_text"] == "x"
    assert flags(parsed) == {Flag.UNSUPPORTED_ITEM: 1}
    assert parsed.episode["lost_fields"] == ["input[2]:unsupported:web_search_call"]


def test_anthropic_unsupported_blocks_images_and_redacted_thinking():
    rec = build_anthropic([TASK, turn("", [("c1", "shot", "{}")]), result("c1", "x"), ANSWER])
    rec["messages"][1]["content"].insert(0, {"type": "redacted_thinking", "data": "xyz"})
    rec["messages"][1]["content"].append({"type": "mystery", "x": 1})
    rec["messages"][2]["content"][0]["content"] = [{"type": "text", "text": "see"}, {"type": "image", "source": {}}]
    rec["messages"][2]["content"].append({"type": "text", "text": "what now?"})
    parsed = ok("anthropic", rec)
    assert parsed.steps[0]["tool_calls"][0]["result_text"] == "see\n[image]"
    assert parsed.steps[1]["obs_text"] == "what now?"
    assert flags(parsed) == {Flag.UNSUPPORTED_ITEM: 1}
    assert parsed.episode["lost_fields"] == [
        "messages[1].content[0]:redacted_thinking",
        "messages[1].content[2]:unsupported:mystery",
        "messages[2].content[0].content[1]:image",
    ]


def test_chat_refusal_and_content_parts():
    rec = build_chat([TASK, ANSWER])
    rec["messages"][1] = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    rec["messages"][0]["content"] = [{"type": "text", "text": "Fix"}, {"type": "image_url", "image_url": {"url": "x"}}]
    parsed = ok("openai-chat", rec)
    assert parsed.steps[0]["action_text"] == "I can't help with that."
    assert parsed.episode["task_text"] == "Fix\n[image_url]"
    assert parsed.episode["lost_fields"] == ["messages[0].content[1]:image_url"]


def test_responses_string_input_and_items_list():
    rec = {"id": "r1", "input": "Say hi.", "output": [{"type": "message", "role": "assistant",
                                                       "content": [{"type": "output_text", "text": "hi"}]}]}
    parsed = ok("openai-responses", rec)
    assert parsed.episode["task_text"] == "Say hi." and parsed.steps[0]["action_text"] == "hi"
    rec = {"id": "r2", "items": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]}
    assert ok("openai-responses", rec).steps[0]["action_text"] == "hi"


# ---- bounded fields ---------------------------------------------------------------------------------
@formats
def test_huge_fields_are_truncated_and_flagged(fmt):
    big = "x" * (MAX_FIELD_CHARS + 5)
    parsed = run_ok(fmt, [("user", big), turn("", [("c1", "cat", "{}")]), result("c1", big), ANSWER])
    ep, call = parsed.episode, parsed.steps[0]["tool_calls"][0]
    assert ep["task_text"] == "x" * MAX_FIELD_CHARS
    assert call["result_text"] == "x" * MAX_FIELD_CHARS and len(parsed.steps[0]["result_text"]) == MAX_FIELD_CHARS
    assert len(ep["lost_fields"]) == 2
    assert all(f.endswith(f":truncated:{MAX_FIELD_CHARS + 5}") for f in ep["lost_fields"])


@formats
def test_huge_arguments_are_bounded_and_no_longer_parse(fmt):
    args = json.dumps({"content": "y" * MAX_FIELD_CHARS})
    parsed = run_ok(fmt, [TASK, turn("", [("c1", "write", args)]), result("c1", "ok"), ANSWER])
    call = parsed.steps[0]["tool_calls"][0]
    assert len(call["arguments_json"]) == MAX_FIELD_CHARS and call["arguments_parse_ok"] is False
    assert any(":truncated:" in f for f in parsed.episode["lost_fields"])
    assert flags(parsed) == {Flag.ARGUMENTS_NOT_JSON: 1}


@formats
def test_many_observations_are_bounded_when_joined(fmt):
    chunk = "z" * (MAX_FIELD_CHARS // 2)
    parsed = run_ok(fmt, [TASK, ("user", chunk), ("user", chunk), ("user", chunk), ANSWER])
    assert len(parsed.steps[0]["obs_text"]) == MAX_FIELD_CHARS
    assert parsed.episode["lost_fields"] == [f"steps[0].obs_text:truncated:{3 * len(chunk) + 4}"]


# ---- quarantine: bytes, ids, shapes, types -----------------------------------------------------------
@formats
@pytest.mark.parametrize("raw, reason", [
    (b'{"id": "\xff\xfe"}', Reason.INVALID_UTF8),
    (b'{"id": "a", "messages": [', Reason.INVALID_JSON),
    (b"", Reason.INVALID_JSON),
    (b"[" * 100_000 + b"]" * 100_000, Reason.INVALID_JSON),
    (b"[1, 2]", Reason.NOT_AN_OBJECT),
    (b"null", Reason.NOT_AN_OBJECT),
])
def test_bytes_that_are_not_a_record(fmt, raw, reason):
    assert quarantined(fmt, raw).reason == reason


@formats
def test_lone_surrogate_is_replaced_and_flagged(fmt):
    raw = encode(BUILDERS[fmt]([("user", "PLACEHOLDER"), ANSWER])).replace(b"PLACEHOLDER", b"a\\ud800b")
    parsed = PARSERS[fmt](raw, URI, 1)
    assert isinstance(parsed, ParsedEpisode), parsed
    parsed.episode["task_text"].encode("utf-8")
    assert any(f.endswith(":invalid_unicode") for f in parsed.episode["lost_fields"])


@formats
def test_lone_surrogate_in_native_id_is_quarantined(fmt):
    raw = encode(BUILDERS[fmt]([TASK, ANSWER])).replace(b'"ep-1"', b'"ep\\ud800"')
    assert quarantined(fmt, raw).reason == Reason.INVALID_UTF8


def test_lone_surrogate_in_a_type_name_is_stored_safely():
    rec = build_anthropic([TASK, ANSWER])
    rec["messages"][1]["content"].append({"type": "PLACEHOLDER"})
    raw = encode(rec).replace(b"PLACEHOLDER", b"x\\ud800")
    parsed = PARSERS["anthropic"](raw, URI, 1)
    assert parsed.episode["lost_fields"] == ["messages[1].content[1]:unsupported:x?"]
    pa.Table.from_pylist([parsed.episode], schema=EPISODES)


@formats
@pytest.mark.parametrize("value", [["a"], True, 1.5])
def test_wrong_typed_native_ids(fmt, value):
    rec = BUILDERS[fmt]([TASK, ANSWER])
    rec["session_id" if fmt == "atif" else "id"] = value
    q = parse(fmt, rec)
    assert isinstance(q, Quarantined) and q.reason == Reason.WRONG_TYPE and q.detail


ID_DERIVING = ["openai-chat", "openai-responses", "anthropic"]  # their exports often carry no id
ABSENT = object()  # the key left out


@pytest.mark.parametrize("fmt", ID_DERIVING)
@pytest.mark.parametrize("value", [ABSENT, None, "", "   "], ids=["absent", "null", "empty", "blank"])
def test_missing_id_is_derived_from_the_file_digest_and_line(fmt, value):
    rec = BUILDERS[fmt]([TASK, ANSWER])
    if value is ABSENT:
        del rec["id"]
    else:
        rec["id"] = value
    line = encode(rec)
    digest = "ab" * 32
    parsed = PARSERS[fmt](line, URI, 7, digest)
    assert isinstance(parsed, ParsedEpisode), parsed
    ep = parsed.episode
    assert ep["native_id"] == f"{digest[:16]}:7" == ep["task_id"] == ep["group_id"]
    assert ep["episode_id"] == stable_episode_id(fmt, f"{digest[:16]}:7")
    assert flags(parsed) == {Flag.DERIVED_EPISODE_ID: 1}
    pa.Table.from_pylist([ep], schema=EPISODES)
    # stable: same file content and line, whatever the file is called; another line or file differs
    assert PARSERS[fmt](line, "s3://b/renamed.jsonl", 7, digest).episode["episode_id"] == ep["episode_id"]
    others = {PARSERS[fmt](line, URI, 8, digest).episode["episode_id"],
              PARSERS[fmt](line, URI, 7, "cd" * 32).episode["episode_id"]}
    assert ep["episode_id"] not in others and len(others) == 2
    # without a digest (a direct call), the URI stands in for it
    assert PARSERS[fmt](line, URI, 7).episode["native_id"].endswith(":7")


def test_atif_requires_its_session_id():
    for value in (ABSENT, None, "", "   "):
        rec = BUILDERS["atif"]([TASK, ANSWER])
        if value is ABSENT:
            del rec["session_id"]
        else:
            rec["session_id"] = value
        q = PARSERS["atif"](encode(rec), URI, 7, "ab" * 32)
        assert isinstance(q, Quarantined) and q.reason == Reason.MISSING_EPISODE_ID


@pytest.mark.parametrize("fmt, rec_path, key", [
    ("openai-chat", ("messages", 1), "role"),
    ("openai-responses", ("input", 1), "role"),
    ("anthropic", ("messages", 1), "role"),
    ("atif", ("steps", 1), "source"),
])
@pytest.mark.parametrize("value", [5, ["user"], {"name": "user"}, True])
def test_wrong_typed_role_is_quarantined(fmt, rec_path, key, value):
    rec = BUILDERS[fmt]([TASK, ("user", "more"), ANSWER])
    rec[rec_path[0]][rec_path[1]][key] = value
    q = parse(fmt, rec)
    assert isinstance(q, Quarantined) and q.reason == Reason.WRONG_TYPE and key in q.detail


def test_chat_legacy_function_call_is_a_tool_call():
    rec = {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"role": "function", "name": "get_weather", "content": "18C, sunny"},
        {"role": "assistant", "content": "It is 18C and sunny."},
    ]}
    parsed = ok("openai-chat", rec)
    first, last = parsed.steps
    (call,) = first["tool_calls"]
    assert (call["name"], call["arguments_json"], call["arguments_parse_ok"]) == ("get_weather", '{"city": "Paris"}', True)
    assert call["result_text"] == first["result_text"] == "18C, sunny"
    assert first["action_text"] == 'get_weather({"city": "Paris"})'
    assert last["action_text"] == "It is 18C and sunny." and parsed.episode["end_reason"] == "agent_stop"
    assert flags(parsed) == {Flag.DERIVED_EPISODE_ID: 1}  # no tool_result_without_call, no unknown_role
    assert detect_format(encode(rec)) == "openai-chat"
    assert detect_format(encode(rec)[:60]) in ("openai-chat", UNKNOWN)


def test_chat_legacy_function_result_without_a_call_is_an_orphan():
    rec = build_chat([TASK, ANSWER])
    rec["messages"].insert(1, {"role": "function", "name": "f", "content": "stray"})
    parsed = ok("openai-chat", rec)
    assert parsed.steps[0]["obs_text"] == "stray" and flags(parsed) == {Flag.TOOL_RESULT_WITHOUT_CALL: 1}


NON_FINITE = [float("nan"), float("inf"), float("-inf"), 10 ** 400]


@formats
@pytest.mark.parametrize("value", NON_FINITE, ids=["nan", "inf", "-inf", "10**400"])
@pytest.mark.parametrize("key", ["score", "reward"])
def test_non_finite_outcome_score_is_quarantined(fmt, value, key):
    line = json.dumps(BUILDERS[fmt]([TASK, ANSWER], outcome={"success": True, key: value})).encode()
    assert b"NaN" in line or b"Infinity" in line or b"0" * 300 in line  # what Python's JSON writer emits
    q = PARSERS[fmt](line, URI, 1)
    assert isinstance(q, Quarantined) and q.reason == Reason.NON_FINITE_NUMBER and "outcome.score" in q.detail


@formats
@pytest.mark.parametrize("outcome", [{"success": "yes"}, {"success": 1}, {"score": "high"}, {"reward": True},
                                     ["ok"], "ok"])
def test_bad_outcomes(fmt, outcome):
    assert run(fmt, [TASK, ANSWER], outcome=outcome).reason == Reason.WRONG_TYPE


def _mutated(fmt: str, path: tuple, value: Any = None, delete: bool = False) -> dict:
    rec = sample(fmt)
    node = rec
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return rec


DELETE = object()
SHAPE_CASES = [
    # OpenAI Chat
    ("openai-chat", ("messages",), DELETE, Reason.MISSING_STEPS),
    ("openai-chat", ("messages",), "hi", Reason.WRONG_TYPE),
    ("openai-chat", ("messages",), {"0": {}}, Reason.WRONG_TYPE),
    ("openai-chat", ("messages",), [], Reason.EMPTY_EPISODE),
    ("openai-chat", ("messages", 2), "assistant: hi", Reason.WRONG_TYPE),
    ("openai-chat", ("messages", 2, "tool_calls"), {"id": "x"}, Reason.WRONG_TYPE),
    ("openai-chat", ("messages", 2, "tool_calls", 0), "read_file", Reason.WRONG_TYPE),
    ("openai-chat", ("messages", 2, "tool_calls", 0, "function"), DELETE, Reason.WRONG_TYPE),
    ("openai-chat", ("messages", 2, "tool_calls", 0, "function", "name"), DELETE, Reason.WRONG_TYPE),
    ("openai-chat", ("messages", 2, "tool_calls", 0, "function", "name"), ["read"], Reason.WRONG_TYPE),
    ("openai-chat", ("messages", 1, "content"), [1, 2], Reason.WRONG_TYPE),
    ("openai-chat", ("messages", 3, "tool_call_id"), {"id": "c"}, Reason.WRONG_TYPE),
    ("openai-chat", ("messages", 6, "is_error"), "yes", Reason.WRONG_TYPE),
    ("openai-chat", ("outcome", "score"), "1", Reason.WRONG_TYPE),
    # OpenAI Responses
    ("openai-responses", ("input",), 5, Reason.WRONG_TYPE),
    ("openai-responses", ("output",), {"type": "message"}, Reason.WRONG_TYPE),
    ("openai-responses", ("input", 2), "function_call", Reason.WRONG_TYPE),
    ("openai-responses", ("input", 2, "name"), DELETE, Reason.WRONG_TYPE),
    ("openai-responses", ("input", 4, "call_id"), ["c"], Reason.WRONG_TYPE),
    ("openai-responses", ("input", 8, "is_error"), "no", Reason.WRONG_TYPE),
    ("openai-responses", ("input", 1, "summary"), [None], Reason.WRONG_TYPE),
    # Anthropic
    ("anthropic", ("messages",), DELETE, Reason.MISSING_STEPS),
    ("anthropic", ("messages",), [], Reason.EMPTY_EPISODE),
    ("anthropic", ("messages", 1), ["x"], Reason.WRONG_TYPE),
    ("anthropic", ("messages", 1, "content"), {"type": "text", "text": "x"}, Reason.WRONG_TYPE),
    ("anthropic", ("messages", 1, "content", 2), "tool_use", Reason.WRONG_TYPE),
    ("anthropic", ("messages", 1, "content", 2, "name"), DELETE, Reason.WRONG_TYPE),
    ("anthropic", ("messages", 2, "content", 0, "content"), [7], Reason.WRONG_TYPE),
    ("anthropic", ("messages", 4, "content", 0, "is_error"), "true", Reason.WRONG_TYPE),
    ("anthropic", ("system",), [[1]], Reason.WRONG_TYPE),
    # ATIF
    ("atif", ("schema_version",), "ATIF-v2.0", Reason.UNSUPPORTED_VERSION),
    ("atif", ("schema_version",), 1.7, Reason.UNSUPPORTED_VERSION),
    ("atif", ("steps",), DELETE, Reason.MISSING_STEPS),
    ("atif", ("steps",), {"1": {}}, Reason.WRONG_TYPE),
    ("atif", ("steps",), [], Reason.EMPTY_EPISODE),
    ("atif", ("steps", 2), "agent", Reason.WRONG_TYPE),
    ("atif", ("steps", 2, "tool_calls"), "read_file", Reason.WRONG_TYPE),
    ("atif", ("steps", 2, "tool_calls", 0, "function_name"), DELETE, Reason.WRONG_TYPE),
    ("atif", ("steps", 2, "observation"), "ok", Reason.WRONG_TYPE),
    ("atif", ("steps", 2, "observation", "results"), {"content": "x"}, Reason.WRONG_TYPE),
    ("atif", ("steps", 2, "observation", "results", 0), "x", Reason.WRONG_TYPE),
    ("atif", ("steps", 2, "metrics"), [1], Reason.WRONG_TYPE),
    ("atif", ("steps", 3, "observation", "results", 0, "extra", "is_error"), "yes", Reason.WRONG_TYPE),
    ("atif", ("agent",), "terminus", Reason.WRONG_TYPE),
    ("atif", ("agent", "name"), {"n": 1}, Reason.WRONG_TYPE),
]


@pytest.mark.parametrize("fmt, path, value, reason", SHAPE_CASES,
                         ids=[f"{c[0]}:{'.'.join(map(str, c[1]))}={'DELETE' if c[2] is DELETE else c[2]!r}"[:60]
                              for c in SHAPE_CASES])
def test_wrong_shapes_and_types_are_quarantined(fmt, path, value, reason):
    rec = _mutated(fmt, path, delete=True) if value is DELETE else _mutated(fmt, path, value)
    q = parse(fmt, rec)
    assert isinstance(q, Quarantined), q
    assert q.reason == reason and q.detail


def test_responses_item_lists_missing_or_empty():
    rec = sample("openai-responses")
    del rec["input"]
    assert ok("openai-responses", rec).episode["n_steps"] == 1  # `output` alone: one answer, no task
    del rec["output"]
    assert parse("openai-responses", rec).reason == Reason.MISSING_STEPS
    rec["input"], rec["output"] = [], []
    assert parse("openai-responses", rec).reason == Reason.EMPTY_EPISODE


@formats
def test_lenient_scalars_become_text(fmt):
    """A number where text is expected is written as text, as the native reader does."""
    rec = BUILDERS[fmt]([("user", "placeholder"), ANSWER])
    if fmt == "openai-responses":
        rec["input"][0]["content"] = 12
    elif fmt == "atif":
        rec["steps"][0]["message"] = 12
    else:
        rec["messages"][0]["content"] = 12
    assert ok(fmt, rec).episode["task_text"] == "12"


# ---- detection ----------------------------------------------------------------------------------------
NATIVE_LINE = b'{"episode_id": "e1", "steps": [{"observation": "room", "action": "look"}]}\n'


@pytest.mark.parametrize("fmt", CONVERSATION_FORMATS)
def test_detect_each_sample(fmt):
    data = (DATA / SAMPLE_FILES[fmt]).read_bytes()
    assert detect_format(data) == fmt
    assert detect_format(data + data) == fmt  # a JSONL file: the first line decides
    assert detect_format(data[:1000]) == fmt  # a cut first record: key markers decide


def test_detect_native_and_registry_round_trip():
    assert detect_format(NATIVE_LINE + NATIVE_LINE) == "native"
    assert set(PARSERS) == set(FORMATS) == {"native", "openai-chat", "openai-responses", "anthropic", "atif"}
    for fmt in CONVERSATION_FORMATS:
        data = (DATA / SAMPLE_FILES[fmt]).read_bytes()
        assert isinstance(PARSERS[detect_format(data)](data, URI, 1), ParsedEpisode)
    assert isinstance(PARSERS[detect_format(NATIVE_LINE)](NATIVE_LINE.strip(), URI, 1), ParsedEpisode)


@pytest.mark.parametrize("record, fmt", [
    ({"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
     "openai-chat"),
    ({"id": "a", "system": "s", "messages": [{"role": "user", "content": "hi"}]}, "anthropic"),
    ({"id": "a", "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]}]}, "anthropic"),
    ({"id": "a", "messages": [{"role": "tool", "tool_call_id": "t", "content": "x"}]}, "openai-chat"),
    ({"id": "a", "object": "response", "output": []}, "openai-responses"),
    ({"id": "a", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "openai-responses"),
    ({"id": "a", "input": "Say hi.", "output": [{"role": "assistant", "content": "hi"}]}, "openai-responses"),
    ({"id": "a", "items": [{"role": "user", "content": "hi"}]}, "openai-responses"),
    ({"session_id": "s", "steps": [{"step_id": 1, "source": "user", "message": "hi"}]}, "atif"),
    ({"schema_version": "ATIF-v1.7", "session_id": "s"}, "atif"),
    ({"episode_id": "e", "steps": []}, "native"),
    ({"id": "a", "messages": "not a list"}, UNKNOWN),
    ({"foo": 1}, UNKNOWN),
    ({"id": "a", "input": [{"type": ["list"]}], "messages": [{"role": ["x"]}]}, "openai-chat"),
    ([1, 2], UNKNOWN),
])
def test_classify_shapes(record, fmt):
    assert classify(record) == fmt
    assert detect_format(encode(record)) == fmt


@pytest.mark.parametrize("raw", [b"not json at all", b"\xff\xfe\x00", b"[1, 2, 3]", b'{"a": 1}', b'"text"',
                                 b'{"messages": '])
def test_detect_unknown(raw):
    assert detect_format(raw) == UNKNOWN


@pytest.mark.parametrize("raw", [b"", b"   \n", b"\n\n\r\n", b"\xef\xbb\xbf\n"])
def test_detect_empty(raw):
    assert detect_format(raw) == EMPTY


def test_detect_pretty_printed_atif_prefix_and_bom():
    data = (DATA / "atif.json").read_bytes()
    assert detect_format(data[:64]) == "atif"
    assert detect_format(b"\xef\xbb\xbf" + data) == "atif"


# ---- property: corrupted records never raise ---------------------------------------------------------
JSON_VALUES = st.recursive(
    # NaN, Infinity and huge integers included: Python's JSON reader accepts them (quarantined, never stored)
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.just(10**400) | st.floats(width=32)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _paths(node: Any, prefix: tuple = ()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


PATHS = {fmt: [p for p in _paths(sample(fmt)) if p] for fmt in CONVERSATION_FORMATS}


@st.composite
def corrupted(draw, fmt: str) -> bytes:
    mode = draw(st.sampled_from(["values", "bytes", "truncate"]))
    if mode == "values":  # replace or delete values at random paths
        rec = sample(fmt)
        for _ in range(draw(st.integers(1, 4))):
            path = draw(st.sampled_from(PATHS[fmt]))
            try:
                node = rec
                for key in path[:-1]:
                    node = node[key]
                if draw(st.booleans()):
                    node[path[-1]] = draw(JSON_VALUES)
                elif isinstance(node, (dict, list)):
                    del node[path[-1]]
            except (KeyError, IndexError, TypeError):
                pass  # an earlier change removed this path
        return encode(rec)
    data = bytearray((DATA / SAMPLE_FILES[fmt]).read_bytes())
    if mode == "truncate":
        return bytes(data[: draw(st.integers(0, len(data)))])
    for _ in range(draw(st.integers(1, 6))):  # delete / insert / replace bytes, invalid UTF-8 included
        pos = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["delete", "insert", "replace", "invalid"]))
        if op == "delete":
            del data[pos]
        elif op == "insert":
            data.insert(pos, draw(st.integers(0, 255)))
        elif op == "invalid":
            data[pos:pos] = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\\ud800"]))
        else:
            data[pos] = draw(st.integers(0, 255))
    return bytes(data)


@pytest.mark.parametrize("fmt", CONVERSATION_FORMATS)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_corrupted_records_never_raise(fmt, data):
    raw = data.draw(corrupted(fmt))
    out = PARSERS[fmt](raw, URI, 1)
    assert isinstance(out, (ParsedEpisode, Quarantined))
    if isinstance(out, Quarantined):
        assert out.reason in ALL_REASONS and out.reason != Reason.PARSER_ERROR, out
        assert isinstance(out.detail, str)
    else:
        assert out.episode["n_steps"] == len(out.steps) >= 1
        score = out.episode["outcome_score"]
        assert score is None or math.isfinite(score)
        pa.Table.from_pylist([out.episode], schema=EPISODES)
        pa.Table.from_pylist(out.steps, schema=STEPS)
    assert detect_format(raw) in FORMATS + (UNKNOWN, EMPTY)


def test_modules_name_their_format():
    assert [m.SOURCE_FORMAT for m in (openai_chat, openai_responses, anthropic, atif)] == CONVERSATION_FORMATS
