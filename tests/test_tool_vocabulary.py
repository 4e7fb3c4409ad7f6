"""The tool vocabulary comes from the tools called and the tools the episodes define: a tool that
is offered but never called is still a choice (for masks and /v1/select_tool), within max_tools."""

from __future__ import annotations

import json

import pyarrow as pa

from harnessrl import schemas
from harnessrl.config import TrainConfig
from harnessrl.features import OTHER_TOOL, defined_tools, tool_ids, tool_vocabulary
from harnessrl.heads.base import tool_head_config
from harnessrl.rewards import RewardRecipe
from harnessrl.transitions import episode_transitions

OPENAI = [{"type": "function", "function": {"name": "Search", "parameters": {}}},
          {"type": "function", "function": {"name": "read_file"}}]
ANTHROPIC = [{"name": "run_tests", "input_schema": {}}, {"name": "search"}, {"description": "no name"}]


def test_defined_tools_reads_every_definition_shape_in_call_case():
    assert defined_tools(json.dumps(OPENAI)) == ["read_file", "search"]
    assert defined_tools(ANTHROPIC) == ["run_tests", "search"]
    assert defined_tools("[]") == defined_tools(None) == defined_tools("not json") == []


def test_defined_but_never_called_tools_join_after_the_called_ones():
    vocab = tool_vocabulary({"search": 5, "answer": 2}, 64, defined=["search", "read_file", "edit"])
    assert vocab == ["search", "answer", "edit", "read_file"]
    assert tool_ids(vocab, ["edit", "search", "nope"]) == [2, 0, -1]


def test_max_tools_cap_puts_defined_only_tools_in_other_first():
    vocab = tool_vocabulary({"search": 5, "answer": 2}, 3, defined=["edit", "read_file"])
    assert vocab == ["search", "answer", OTHER_TOOL]
    assert tool_ids(vocab, ["edit", "read_file"]) == [2, 2]


def test_transitions_carry_the_episodes_defined_tools():
    steps = [{"episode_id": "e", "step_idx": i, "obs_text": "o", "action_text": a, "terminated": i == 1}
             for i, a in enumerate(['search({"q": "x"})', "done"])]
    episode = {"episode_id": "e", "task_text": "t", "terminated": True, "outcome_success": True,
               "tool_definitions": json.dumps(OPENAI)}
    rows = episode_transitions(episode, steps, RewardRecipe())
    assert [r["tool"] for r in rows] == ["search", "answer"]
    assert all(r["defined_tools"] == ["read_file", "search"] for r in rows)


def test_head_is_trained_when_only_definitions_offer_a_second_tool():
    cfg = TrainConfig()
    head, vocab = tool_head_config(cfg, ["search"] * 4, 8)
    assert head is None and vocab == ["search"]
    head, vocab = tool_head_config(cfg, ["search"] * 4, 8, ["read_file", "search"])
    assert vocab == ["search", "read_file"] and head["n_actions"] == 2
    capped = tool_head_config(cfg.model_copy(update={"max_tools": 2}), ["a", "b", "b"], 8,
                               ["c"])[1]
    assert capped == ["b", OTHER_TOOL]


def test_training_reads_defined_tools_from_the_dataset():
    from harnessrl.encoded_data import DataStats

    rows = [{"episode_id": f"e{i}", "step_idx": 0, "tool": "search", "defined_tools": d, "reward": 0.0,
             "features": [0.0] * 5} for i, d in enumerate([["search", "edit"], [], None, ["read_file"]])]
    table = pa.Table.from_pylist(rows, schema=schemas.TRANSITIONS)
    # the driver's one pass over the rows, a batch at a time: tools defined in any batch count
    assert DataStats([table.slice(0, 2), table.slice(2)], 4, None).defined_tools == ["edit", "read_file", "search"]
    old = table.drop_columns(["defined_tools"])
    assert DataStats([old], 4, None).defined_tools == []  # data from before
