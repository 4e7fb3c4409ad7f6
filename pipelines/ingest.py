"""Ingest stage: log files -> episodes, steps and quarantine tables (Parquet), on Ray Data.

Every non-blank input line is one record and ends up either in `episodes`/`steps` or in
`quarantine` with a reason; `records_in == records_ok + records_quarantined` is checked
before the stage returns.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field

import pyarrow as pa

from harnessrl import schemas, storage
from harnessrl.errors import DataError
from harnessrl.formats import native

log = logging.getLogger(__name__)

PARSED = pa.schema(
    [
        ("source_uri", pa.string()),
        ("source_line", pa.int64()),
        ("ok", pa.bool_()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("raw_prefix", pa.string()),
        ("episode_id", pa.string()),
        ("episode_json", pa.string()),
        ("steps_json", pa.string()),
    ]
)
RAW_PREFIX_CHARS = 200


@dataclass
class IngestResult:
    out_dir: str
    files: int
    records_in: int
    records_ok: int
    records_quarantined: int
    episodes: int
    steps: int
    by_reason: dict[str, int] = field(default_factory=dict)
    raw_digest: str = ""
    sources: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        out = asdict(self)
        out["sources"] = self.sources[:5] + ([f"... {len(self.sources) - 5} more"] if len(self.sources) > 5 else [])
        return out


def _read_lines(row: dict) -> list[dict]:
    uri = row["uri"]
    return [{"source_uri": uri, "source_line": no, "line": line} for no, line in storage.iter_lines(uri)]


def _parse_batch(batch: pa.Table) -> pa.Table:
    rows = []
    for uri, no, line in zip(
        batch.column("source_uri").to_pylist(), batch.column("source_line").to_pylist(), batch.column("line").to_pylist()
    ):
        parsed = native.parse_line(line, uri, no)
        if isinstance(parsed, native.Quarantined):
            rows.append(
                {"source_uri": uri, "source_line": no, "ok": False, "reason": parsed.reason, "detail": parsed.detail,
                 "raw_prefix": line[:RAW_PREFIX_CHARS].decode("utf-8", "replace"), "episode_id": None,
                 "episode_json": None, "steps_json": None}
            )
        else:
            rows.append(
                {"source_uri": uri, "source_line": no, "ok": True, "reason": None, "detail": None,
                 "raw_prefix": line[:RAW_PREFIX_CHARS].decode("utf-8", "replace"),
                 "episode_id": parsed.episode["episode_id"], "episode_json": json.dumps(parsed.episode),
                 "steps_json": json.dumps(parsed.steps)}
            )
    return pa.Table.from_pylist(rows, schema=PARSED)


def _is_kept(uri: str, line: int, ok: bool, duplicates: frozenset) -> bool:
    return ok and (uri, line) not in duplicates


def _episode_rows(batch: pa.Table, duplicates: frozenset) -> pa.Table:
    rows = [
        json.loads(e)
        for uri, no, ok, e in zip(*(batch.column(c).to_pylist() for c in ("source_uri", "source_line", "ok", "episode_json")))
        if _is_kept(uri, no, ok, duplicates)
    ]
    return pa.Table.from_pylist(rows, schema=schemas.EPISODES)


def _step_rows(batch: pa.Table, duplicates: frozenset) -> pa.Table:
    rows = [
        step
        for uri, no, ok, s in zip(*(batch.column(c).to_pylist() for c in ("source_uri", "source_line", "ok", "steps_json")))
        if _is_kept(uri, no, ok, duplicates)
        for step in json.loads(s)
    ]
    return pa.Table.from_pylist(rows, schema=schemas.STEPS)


def _quarantine_rows(batch: pa.Table, duplicates: frozenset) -> pa.Table:
    rows = []
    for r in batch.to_pylist():
        if not r["ok"]:
            rows.append({k: r[k] for k in schemas.QUARANTINE.names})
        elif (r["source_uri"], r["source_line"]) in duplicates:
            rows.append({"source_uri": r["source_uri"], "source_line": r["source_line"],
                         "reason": native.Reason.DUPLICATE_EPISODE_ID,
                         "detail": f"episode id already ingested from an earlier record ({r['episode_id']})",
                         "raw_prefix": r["raw_prefix"]})
    return pa.Table.from_pylist(rows, schema=schemas.QUARANTINE)


def _find_duplicates(keys: pa.Table) -> frozenset:
    """Second and later records with an already-seen episode id, in (file, line) order."""
    seen: set[str] = set()
    dups = set()
    ok_rows = sorted(
        (uri, no, eid)
        for uri, no, ok, eid in zip(*(keys.column(c).to_pylist() for c in ("source_uri", "source_line", "ok", "episode_id")))
        if ok
    )
    for uri, no, eid in ok_rows:
        if eid in seen:
            dups.add((uri, no))
        seen.add(eid)
    return frozenset(dups)


def ingest(sources: list[str], out_dir: str, fmt: str = "native") -> IngestResult:
    """Read `sources`, write `out_dir/{episodes,steps,quarantine}` as Parquet, return the counts."""
    import ray

    if fmt != "native":
        raise DataError(f"format {fmt!r} is not supported yet (supported: native)")
    files = storage.expand_sources(sources)
    log.info("ingest: %d file(s) from %s", len(files), ", ".join(sources))
    raw_digest = storage.digest_sources(files)

    lines = ray.data.from_items([{"uri": u} for u in files], override_num_blocks=len(files)).flat_map(_read_lines)
    parsed = lines.map_batches(_parse_batch, batch_format="pyarrow", batch_size=256).materialize()
    keys = pa.concat_tables(
        [ray.get(ref) for ref in parsed.select_columns(["source_uri", "source_line", "ok", "episode_id", "reason"]).to_arrow_refs()]
    ) if parsed.count() else PARSED.empty_table()
    duplicates = _find_duplicates(keys)

    stage = {name: storage.join(out_dir, name) for name in ("episodes", "steps", "quarantine")}
    kwargs = {"batch_format": "pyarrow", "fn_kwargs": {"duplicates": duplicates}}
    for name, fn in (("episodes", _episode_rows), ("steps", _step_rows), ("quarantine", _quarantine_rows)):
        storage.reset_dir(stage[name])
        parsed.map_batches(fn, **kwargs).write_parquet(stage[name], compression="zstd")

    oks = keys.column("ok").to_pylist()
    by_reason = Counter(r for r, ok in zip(keys.column("reason").to_pylist(), oks) if not ok)
    if duplicates:
        by_reason[native.Reason.DUPLICATE_EPISODE_ID] += len(duplicates)
    records_in = len(oks)
    records_ok = sum(oks) - len(duplicates)
    quarantined = sum(by_reason.values())
    steps = ray.data.read_parquet(stage["steps"]).count() if records_ok else 0
    result = IngestResult(
        out_dir=out_dir, files=len(files), records_in=records_in, records_ok=records_ok,
        records_quarantined=quarantined, episodes=records_ok, steps=steps,
        by_reason=dict(sorted(by_reason.items())), raw_digest=raw_digest, sources=files,
    )
    if records_in != records_ok + quarantined:  # an invariant, not a user error
        raise AssertionError(f"ingest lost records: {result.summary()}")
    log.info("ingest: %d records -> %d episodes, %d steps, %d quarantined %s",
             records_in, records_ok, steps, quarantined, dict(by_reason) or "")
    return result
