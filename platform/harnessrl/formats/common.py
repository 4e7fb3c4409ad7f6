"""What the conversation readers (OpenAI Chat, OpenAI Responses, Anthropic, ATIF) share.

A reader only walks its own record shape and emits a flat list of events: text that arrived
(`Said`), a decision of the agent (`Decided`), a tool result (`Returned`), feedback with no call
(`Feedback`). `fold` turns the events into step rows and `build_episode` into the episode row, so
the mapping rules and the anomaly flags are the same for every format:

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
  (`derived_id`: stable across re-ingests and renames) and flag it `derived_episode_id`.
- numbers: a reward or score that is NaN, Infinity or too large is quarantined
  (`non_finite_number`): it would make every return through it NaN.
- flags (`Flag`) keep the episode: listed in the step's info `flags`, counted in the episode
  metadata `ingest_flags`. Anything else wrong is a `Quarantined` with a `Reason` code; a reader
  bug becomes `Reason.PARSER_ERROR` rather than an exception (tests assert it never happens).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from harnessrl.formats.native import (
    TRUNCATING_END_REASONS,
    ParsedEpisode,
    Quarantined,
    Reason,
    _Bad,
    _number,
    _text,
    _tool_call,
    render_action,
    stable_episode_id,
)

Bad = _Bad  # raised by readers; becomes a Quarantined at the boundary (`parse_with`)


class Flag:
    """Anomalies that keep the episode (stable strings: counted and filtered on)."""

    TOOL_RESULT_WITHOUT_CALL = "tool_result_without_call"  # result text kept as the next observation
    CALL_WITHOUT_RESULT = "call_without_result"  # call kept with an empty result_text
    ARGUMENTS_NOT_JSON = "arguments_not_json"  # kept verbatim, arguments_parse_ok false
    EMPTY_TURN = "empty_turn"  # an assistant turn with neither text nor tool calls: no step
    UNKNOWN_ROLE = "unknown_role"  # message of an unknown role: its text kept as observation
    UNSUPPORTED_ITEM = "unsupported_item"  # item/block type not mapped: dropped, named in lost_fields
    DERIVED_EPISODE_ID = "derived_episode_id"  # the record has no id: native_id is `derived_id(...)`


# ---- events ------------------------------------------------------------------------------------
@dataclass
class Said:
    """Text from the user ("user"), the system ("system") or anyone else ("other")."""

    role: str
    text: str


@dataclass
class Decided:
    """One decision: visible text, reasoning, tool-call rows (native `_tool_call`), extra info."""

    text: str
    reasoning: str
    calls: list[dict[str, Any]]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Returned:
    """A tool result, joined to its call by `call_id`."""

    call_id: str
    text: str
    is_error: bool


@dataclass
class Feedback:
    """A result of the latest decision that names no call (e.g. ATIF results without source_call_id)."""

    text: str


Event = Said | Decided | Returned | Feedback


# ---- per-record context ------------------------------------------------------------------------
class Ctx:
    """Per-record state: `lost` (-> lost_fields), flag counts (-> metadata ingest_flags) and the id
    to use when the record has none (`derived_id` of its file and line)."""

    def __init__(self, fallback_id: str = "") -> None:
        self.lost: list[str] = []
        self.flags: Counter[str] = Counter()
        self.fallback_id = fallback_id

    def text(self, value: Any, where: str, required: bool = False) -> str:
        """A scalar text field, bounded and flagged like the native reader does."""
        return _text(value, where, self.lost, required)

    def content(self, value: Any, where: str) -> str:
        """Text of a message content: a string, or a list of parts (`text`/`refusal` kept;
        images, files, ... become a `[type]` placeholder and are named in lost_fields)."""
        if value is None or isinstance(value, str) or not isinstance(value, (dict, list)):
            return self.text(value, where)
        parts = [value] if isinstance(value, dict) else value
        texts = [self.part(part, f"{where}[{i}]") for i, part in enumerate(parts)]
        return self.text("\n".join(t for t in texts if t), where)

    def part(self, part: Any, where: str) -> str:
        """One content part's text, or a `[type]` placeholder named in lost_fields."""
        if isinstance(part, str):
            return part
        if not isinstance(part, dict):
            raise Bad(Reason.WRONG_TYPE, f"{where} must be a string or an object")
        for key in ("text", "refusal"):
            value = part.get(key)
            if value is not None and not isinstance(value, (dict, list)):
                return str(value)
        kind = label(part.get("type"))
        self.lost.append(f"{where}:{kind}")
        return f"[{kind}]"

    def call(self, call_id: Any, name: Any, arguments: Any, where: str) -> dict[str, Any]:
        """A tool-call row. Object arguments become sorted JSON text first, so that they are bounded too."""
        if isinstance(arguments, (dict, list)):
            arguments = json.dumps(arguments, sort_keys=True)
        return _tool_call({"id": call_id, "name": name, "arguments": arguments}, where, self.lost)

    def flag(self, code: str) -> None:
        self.flags[code] += 1

    def unsupported(self, kind: Any, where: str) -> None:
        self.flag(Flag.UNSUPPORTED_ITEM)
        self.lost.append(f"{where}:unsupported:{label(kind)}")


def label(value: Any) -> str:
    """A short storable name for a `type`/key value of any JSON type (for lost_fields entries)."""
    if not isinstance(value, str) or not value:
        return type(value).__name__
    return value[:40].encode("utf-8", "replace").decode("utf-8")  # lone surrogates -> "?"


def str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def role_of(msg: dict[str, Any], key: str, where: str) -> str | None:
    """A message's role (or ATIF step's source): None when absent, a wrong type is quarantined
    (a `role` of 5 is a broken record, not an unknown speaker)."""
    value = msg.get(key)
    if value is not None and not isinstance(value, str):
        raise Bad(Reason.WRONG_TYPE, f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def as_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Bad(Reason.WRONG_TYPE, f"{where} must be an object, got {type(value).__name__}")
    return value


def optional_list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Bad(Reason.WRONG_TYPE, f"{where} must be a list, got {type(value).__name__}")
    return value


def required_list(record: dict[str, Any], key: str) -> list[Any]:
    """The record's list of messages/steps: missing, wrong type and empty each have their reason."""
    if key not in record:
        raise Bad(Reason.MISSING_STEPS, f"{key} is missing")
    value = optional_list(record[key], key)
    if not value:
        raise Bad(Reason.EMPTY_EPISODE, f"{key} is empty")
    return value


def error_flag(value: Any, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise Bad(Reason.WRONG_TYPE, f"{where} must be true or false")
    return value


def pick(source: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The keys of `source` that are present and not null (for a step's info)."""
    return {k: source[k] for k in keys if source.get(k) is not None}


# ---- header: ids, outcome, metadata --------------------------------------------------------------
COMMON_KEYS = frozenset({"task_id", "group_id", "outcome", "end_reason"})


@dataclass
class Header:
    native_id: str
    task_id: str
    group_id: str
    success: bool | None
    score: float | None
    end_reason: str
    metadata: dict[str, Any]
    system_prompt: str = ""
    agent_name: str = ""
    model: str = ""
    tools: Any = None
    outcome: Any = None  # the outcome object as read (-> signals table, verbatim)


def derived_id(source_digest: str, line_no: int) -> str:
    """The native id of a record that names none: its file's content digest and its line."""
    return f"{source_digest.removeprefix('sha256:')[:16]}:{line_no}"


def native_id_of(record: dict[str, Any], keys: Iterable[str], ctx: Ctx | None = None) -> str:
    """The first of `keys` that is present: a non-blank string or an integer, as in native. With a
    `ctx` (formats whose exports often carry no id), a missing one is `ctx.fallback_id`, flagged."""
    keys = tuple(keys)
    value = next((record[k] for k in keys if record.get(k) is not None), None)
    if value is None or (isinstance(value, str) and not value.strip()):
        if ctx is not None and ctx.fallback_id:
            ctx.flag(Flag.DERIVED_EPISODE_ID)
            return ctx.fallback_id
        raise Bad(Reason.MISSING_EPISODE_ID, f"{' / '.join(keys)} is missing or empty")
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise Bad(Reason.WRONG_TYPE, f"{keys[0]} must be a string or integer")
    if isinstance(value, str) and _unstorable(value):
        raise Bad(Reason.INVALID_UTF8, f"{keys[0]} holds a lone surrogate escape")
    return str(value)


def _unstorable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def outcome_of(value: Any) -> tuple[bool | None, float | None]:
    if value is None:
        return None, None
    outcome = as_object(value, "outcome")
    success = next((outcome[k] for k in ("success", "resolved") if outcome.get(k) is not None), None)
    if success is not None and not isinstance(success, bool):
        raise Bad(Reason.WRONG_TYPE, "outcome.success must be true or false")
    score = next((outcome[k] for k in ("score", "reward") if outcome.get(k) is not None), None)
    return success, _number(score, "outcome.score")


def read_header(record: dict[str, Any], ctx: Ctx, id_keys: Iterable[str], meta_key: str,
                known: Iterable[str], derive_id: bool = False) -> Header:
    """Ids, outcome and metadata, read from the record or else from its metadata object
    (`meta_key`); keys outside `known` are kept in metadata `extra`, as the native reader does.
    `derive_id`: a record without an id gets `ctx.fallback_id` (see `native_id_of`)."""
    native_id = native_id_of(record, id_keys, ctx if derive_id else None)
    meta = record.get(meta_key)
    meta_obj = meta if isinstance(meta, dict) else {}

    def get(key: str) -> Any:
        return record[key] if record.get(key) is not None else meta_obj.get(key)

    task_id = ctx.text(get("task_id"), "task_id") or native_id
    success, score = outcome_of(get("outcome"))
    metadata = dict(meta_obj) if meta is None or isinstance(meta, dict) else {"metadata": meta}
    mapped = set(known) | COMMON_KEYS | {meta_key}
    extra = {k: v for k, v in record.items() if k not in mapped}
    if extra:
        metadata["extra"] = extra
    return Header(
        native_id=native_id,
        task_id=task_id,
        group_id=ctx.text(get("group_id"), "group_id") or task_id,
        success=success,
        score=score,
        end_reason=ctx.text(get("end_reason"), "end_reason"),
        metadata=metadata,
        outcome=get("outcome"),
    )


# ---- events -> steps -----------------------------------------------------------------------------
@dataclass
class _Draft:
    decided: Decided
    obs: list[str]
    flags: list[str]
    answered: set[int] = field(default_factory=set)  # id() of the call rows that got a result
    feedback: list[str] = field(default_factory=list)


@dataclass
class Conversation:
    task: str
    system: str
    steps: list[dict[str, Any]]


class _Folder:
    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.system: list[str] = []
        self.task: str | None = None
        self.drafts: list[_Draft] = []
        self.pending: list[str] = []
        self.pending_flags: list[str] = []
        self.open_calls: dict[str, tuple[_Draft, dict[str, Any]]] = {}

    def flag(self, code: str, into: list[str]) -> None:
        into.append(code)
        self.ctx.flag(code)

    def said(self, ev: Said) -> None:
        if not ev.text.strip():
            return
        if not self.drafts and ev.role == "system":
            self.system.append(ev.text)
        elif not self.drafts and ev.role == "user" and self.task is None:
            self.task = ev.text
        else:
            self.pending.append(ev.text)

    def decided(self, ev: Decided, where: str) -> None:
        if not ev.text.strip() and not ev.calls:
            self.ctx.flag(Flag.EMPTY_TURN)
            if ev.reasoning:
                self.ctx.lost.append(f"{where}.reasoning:empty_turn")
            return
        draft = _Draft(ev, self.pending, self.pending_flags)
        self.pending, self.pending_flags = [], []
        for call in ev.calls:
            if call["call_id"]:
                self.open_calls[call["call_id"]] = (draft, call)  # a reused id: the older call stays open
            if not call["arguments_parse_ok"]:
                self.flag(Flag.ARGUMENTS_NOT_JSON, draft.flags)
        self.drafts.append(draft)

    def returned(self, ev: Returned) -> None:
        hit = self.open_calls.pop(ev.call_id, None) if ev.call_id else None
        if hit is None:
            self.pending.append(ev.text)
            self.flag(Flag.TOOL_RESULT_WITHOUT_CALL, self.pending_flags)
            return
        draft, call = hit
        call["result_text"], call["is_error"] = ev.text, ev.is_error
        draft.answered.add(id(call))

    def feedback(self, ev: Feedback) -> None:
        if self.drafts:
            self.drafts[-1].feedback.append(ev.text)
        else:
            self.pending.append(ev.text)

    def finish(self) -> Conversation:
        if self.drafts:  # text after the last decision is that decision's result
            self.drafts[-1].feedback.extend(self.pending)
            self.drafts[-1].flags.extend(self.pending_flags)
        steps = [self._row(d, i) for i, d in enumerate(self.drafts)]
        return Conversation(self.task or "", join(self.system), steps)  # bounded with the header's part

    def _row(self, draft: _Draft, idx: int) -> dict[str, Any]:
        ev = draft.decided
        for call in ev.calls:
            if id(call) not in draft.answered:
                self.flag(Flag.CALL_WITHOUT_RESULT, draft.flags)
        info = dict(ev.info)
        if draft.flags:
            info["flags"] = draft.flags
        reasoning = [ev.reasoning, ev.text] if ev.calls else [ev.reasoning]
        results = [render_results(ev.calls, draft.answered)] + draft.feedback
        where = f"steps[{idx}]"
        return {
            "step_idx": idx,
            "obs_text": self.ctx.text(join(draft.obs), f"{where}.obs_text"),
            "action_text": render_action("" if ev.calls else ev.text, ev.calls),
            "action_reasoning": self.ctx.text(join(reasoning), f"{where}.action_reasoning"),
            "tool_calls": ev.calls,
            "result_text": self.ctx.text(join(results), f"{where}.result_text"),
            "reward": None,
            "candidates": None,
            "info": json.dumps(info, sort_keys=True),
        }


def join(texts: Iterable[str]) -> str:
    return "\n\n".join(t for t in texts if t.strip())


def render_results(calls: list[dict[str, Any]], answered: set[int]) -> str:
    """The results of one step in call order; a lone successful result is kept as it is."""
    done = [c for c in calls if id(c) in answered]
    if len(calls) == 1 and done and not done[0]["is_error"]:
        return done[0]["result_text"]
    return "\n".join(f"{c['name']}{' [error]' if c['is_error'] else ''}: {c['result_text']}" for c in done)


def fold(events: Iterable[tuple[str, Event]], ctx: Ctx) -> Conversation:
    """(where, event) pairs in log order -> task, system prompt and step rows (DESIGN §3)."""
    folder = _Folder(ctx)
    for where, ev in events:
        if isinstance(ev, Said):
            folder.said(ev)
        elif isinstance(ev, Decided):
            folder.decided(ev, where)
        elif isinstance(ev, Returned):
            folder.returned(ev)
        else:
            folder.feedback(ev)
    return folder.finish()


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


def load_record(line: bytes) -> dict[str, Any] | Quarantined:
    """Bytes -> a JSON object, or the reason why not (same reasons as the native reader)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Quarantined(Reason.INVALID_UTF8, f"byte {exc.start}: {exc.reason}")
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Quarantined(Reason.INVALID_JSON, (str(exc) or type(exc).__name__)[:200])
    if not isinstance(record, dict):
        return Quarantined(Reason.NOT_AN_OBJECT, f"top level is {type(record).__name__}")
    return record


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
