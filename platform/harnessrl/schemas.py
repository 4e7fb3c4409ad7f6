"""The tables of DESIGN §3 as Arrow schemas: the one place their columns and types are defined."""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "1"

TOOL_CALL = pa.struct(
    [
        ("call_id", pa.string()),
        ("name", pa.string()),
        ("arguments_json", pa.string()),
        ("arguments_parse_ok", pa.bool_()),
        ("result_text", pa.string()),
        ("is_error", pa.bool_()),
    ]
)

EPISODES = pa.schema(
    [
        ("episode_id", pa.string()),
        ("native_id", pa.string()),
        ("group_id", pa.string()),
        ("task_id", pa.string()),
        ("task_text", pa.string()),
        ("system_prompt", pa.string()),
        ("tool_definitions", pa.string()),
        ("agent_name", pa.string()),
        ("model", pa.string()),
        ("n_steps", pa.int32()),
        ("end_reason", pa.string()),
        ("terminated", pa.bool_()),
        ("truncated", pa.bool_()),
        ("evaluable", pa.bool_()),
        ("outcome_success", pa.bool_()),
        ("outcome_score", pa.float64()),
        ("source_format", pa.string()),
        ("source_uri", pa.string()),
        ("source_line", pa.int64()),
        ("metadata", pa.string()),
        ("lost_fields", pa.list_(pa.string())),
    ]
)

STEPS = pa.schema(
    [
        ("episode_id", pa.string()),
        ("step_idx", pa.int32()),
        ("obs_text", pa.string()),
        ("action_text", pa.string()),
        ("action_reasoning", pa.string()),
        ("tool_calls", pa.list_(TOOL_CALL)),
        ("result_text", pa.string()),
        ("reward", pa.float64()),
        ("candidates", pa.list_(pa.string())),
        ("info", pa.string()),
        ("terminated", pa.bool_()),
        ("truncated", pa.bool_()),
    ]
)

SIGNALS = pa.schema(
    [
        ("episode_id", pa.string()),
        ("target", pa.string()),  # episode | step
        ("step_idx", pa.int32()),  # null for episode-level signals
        ("name", pa.string()),
        ("value_json", pa.string()),  # the value as the source gave it, as JSON text
        ("value_truncated", pa.bool_()),
        ("source", pa.string()),  # the log's format, or outcomes_file
    ]
)

QUARANTINE = pa.schema(
    [
        ("source_uri", pa.string()),
        ("source_line", pa.int64()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("raw_prefix", pa.string()),
    ]
)

SEGMENTS = pa.list_(pa.struct([("role", pa.string()), ("age", pa.int32()), ("text", pa.string())]))  # render.Segment

TRANSITIONS = pa.schema(
    [
        ("episode_id", pa.string()),
        ("step_idx", pa.int32()),
        ("task_id", pa.string()),
        ("group_id", pa.string()),
        ("state_text", pa.string()),
        ("action_text", pa.string()),
        ("tool", pa.string()),
        ("defined_tools", pa.list_(pa.string())),  # the episode's tool_definitions (features.defined_tools)
        ("features", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("reward_components", pa.map_(pa.string(), pa.float64())),
        ("next_state_text", pa.string()),
        ("done", pa.bool_()),
        ("truncated", pa.bool_()),
        ("return_to_go", pa.float64()),
        ("outcome_success", pa.bool_()),
        ("candidates", pa.list_(pa.string())),
        ("candidate_features", pa.list_(pa.list_(pa.float32()))),
        ("info", pa.string()),
        ("state_segments", SEGMENTS),  # the state as the reader head reads it (render.state_segments)
        ("next_state_segments", SEGMENTS),
    ]
)
SEGMENT_COLUMNS = ("state_segments", "next_state_segments")

EMBEDDING_COLUMNS = {"state_text": "state_emb", "action_text": "action_emb", "next_state_text": "next_state_emb"}


def embedding_type(dim: int, dtype: str = "float32") -> pa.DataType:
    value = pa.float16() if dtype == "float16" else pa.float32()
    return pa.list_(value, dim)


def with_metadata(schema: pa.Schema, **extra: str) -> pa.Schema:
    meta = dict(schema.metadata or {})
    meta[b"harnessrl.schema_version"] = SCHEMA_VERSION.encode()
    for key, value in extra.items():
        meta[f"harnessrl.{key}".encode()] = value.encode()
    return schema.with_metadata(meta)
