"""A record's header: ids (own or derived), outcome and metadata (`read_header` -> `Header`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harnessrl.formats.fields import Bad, Ctx, as_object
from harnessrl.formats.flags import Flag
from harnessrl.formats.native import Reason, _number

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
