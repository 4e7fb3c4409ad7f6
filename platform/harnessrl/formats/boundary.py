"""The reader boundary of the conversation readers (OpenAI Chat, OpenAI Responses, Anthropic, ATIF).

`parse_with`: bytes -> an episode or a quarantine, never an exception. A reader only walks its own
record shape (`convert`) and emits a flat list of events (`events.py`): text that arrived
(`Said`), a decision of the agent (`Decided`), a tool result (`Returned`), feedback with no call
(`Feedback`). `fold` (`conversation.py`) turns the events into step rows and `build_episode` into
the episode row, so the mapping rules and the anomaly flags are the same for every format:

- task: the first user text before the first decision; system text before it: the system prompt.
- a step is one decision: its parallel tool calls are one step; `action_text` is the rendered calls
  (native `render_action`), or the assistant text when there are none (the answer). Text that comes
  with tool calls is kept in `action_reasoning`, after the model's reasoning.
- `obs_text`: what arrived since the previous decision (later user/system text, orphan results).
- `result_text`: this step's tool results in call order (`name: text`, `name [error]: text` when
  there are several or one failed), then feedback not tied to a call; text after the last
  decision is appended to the last step's result.
- end: `end_reason` from the record (or its metadata), else `agent_stop` when the last step has no
  tool calls, else `unknown` (truncated: the log stops mid-loop), as in the native reader.
- outcome: `outcome` {success|resolved: bool, score|reward: number} on the record or its metadata.
- ids: the record's own id; OpenAI and Anthropic exports (and fine-tuning files) often have none,
  so those readers derive one from the source file's content digest and the line
  (`header.derived_id`: stable across re-ingests and renames) and flag it `derived_episode_id`.
- numbers: a reward or score that is NaN, Infinity or too large is quarantined
  (`non_finite_number`): it would make every return through it NaN.
- flags (`flags.py: Flag`) keep the episode: listed in the step's info `flags`, counted in the
  episode metadata `ingest_flags`. Anything else wrong is a `Quarantined` with a `Reason` code; a
  reader bug becomes `Reason.PARSER_ERROR` rather than an exception (tests assert it never happens).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from harnessrl.formats.conversation import Conversation, fold, join
from harnessrl.formats.events import Event
from harnessrl.formats.fields import Bad, Ctx
from harnessrl.formats.header import Header, derived_id
from harnessrl.formats.native import (
    TRUNCATING_END_REASONS,
    ParsedEpisode,
    Quarantined,
    Reason,
    load_record,
    stable_episode_id,
)


# ---- episode row and the reader boundary -------------------------------------------------------
def build_episode(fmt: str, header: Header, conv: Conversation, ctx: Ctx, source_uri: str,
                  line_no: int) -> ParsedEpisode:
    steps = conv.steps
    if not steps:
        raise Bad(Reason.EMPTY_EPISODE, "no assistant turn with text or tool calls")
    end_reason = header.end_reason or ("unknown" if steps[-1]["tool_calls"] else "agent_stop")
    truncated = end_reason in TRUNCATING_END_REASONS or end_reason == "unknown"
    episode_id = stable_episode_id(fmt, header.native_id)
    for s in steps:
        s["episode_id"] = episode_id
        s["terminated"] = not truncated and s is steps[-1]
        s["truncated"] = truncated and s is steps[-1]
    metadata = dict(header.metadata)
    if ctx.flags:
        metadata["ingest_flags"] = dict(sorted(ctx.flags.items()))
    episode = {
        "episode_id": episode_id,
        "native_id": header.native_id,
        "group_id": header.group_id,
        "task_id": header.task_id,
        "task_text": conv.task,
        "system_prompt": ctx.text(join([header.system_prompt, conv.system]), "system_prompt"),
        "tool_definitions": json.dumps(header.tools if header.tools is not None else []),
        "agent_name": header.agent_name,
        "model": header.model,
        "n_steps": len(steps),
        "end_reason": end_reason,
        "terminated": not truncated,
        "truncated": truncated,
        "evaluable": header.success is not None,
        "outcome_success": header.success,
        "outcome_score": header.score,
        "source_format": fmt,
        "source_uri": source_uri,
        "source_line": line_no,
        "metadata": json.dumps(metadata, sort_keys=True),
        "lost_fields": ctx.lost,
    }
    return ParsedEpisode(episode, steps, header.outcome)


Convert = Callable[[dict[str, Any], Ctx], tuple[Header, list[tuple[str, Event]]]]


def parse_with(fmt: str, convert: Convert, line: bytes, source_uri: str, line_no: int,
               source_digest: str | None = None) -> ParsedEpisode | Quarantined:
    """The reader boundary: never raises, every record becomes an episode or a quarantine.
    `source_digest`: the file's content digest, for `derived_id` (ingest passes it; without
    one, the digest of the URI stands in)."""
    record = load_record(line)
    if isinstance(record, Quarantined):
        return record
    digest = source_digest or hashlib.sha256(source_uri.encode("utf-8", "replace")).hexdigest()
    ctx = Ctx(derived_id(digest, line_no))
    try:
        header, events = convert(record, ctx)
        return build_episode(fmt, header, fold(events, ctx), ctx, source_uri, line_no)
    except Bad as bad:
        return Quarantined(bad.reason, bad.detail)
    except Exception as exc:  # noqa: BLE001 - a reader bug must not lose the record's accounting
        return Quarantined(Reason.PARSER_ERROR, f"{type(exc).__name__}: {exc}"[:200])
