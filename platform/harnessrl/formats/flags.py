"""The anomaly flags of the conversation readers: anomalies that keep the episode.

Listed in the step's info `flags` and counted in the episode metadata `ingest_flags`
(`Ctx.flag`); anything else wrong with a record is a `Quarantined` (native `Reason`).
"""

from __future__ import annotations


class Flag:
    """Anomalies that keep the episode (stable strings: counted and filtered on)."""

    TOOL_RESULT_WITHOUT_CALL = "tool_result_without_call"  # result text kept as the next observation
    CALL_WITHOUT_RESULT = "call_without_result"  # call kept with an empty result_text
    ARGUMENTS_NOT_JSON = "arguments_not_json"  # kept verbatim, arguments_parse_ok false
    EMPTY_TURN = "empty_turn"  # an assistant turn with neither text nor tool calls: no step
    UNKNOWN_ROLE = "unknown_role"  # message of an unknown role: its text kept as observation
    UNSUPPORTED_ITEM = "unsupported_item"  # item/block type not mapped: dropped, named in lost_fields
    DERIVED_EPISODE_ID = "derived_episode_id"  # the record has no id: native_id is `derived_id(...)`
