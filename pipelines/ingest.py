"""Ingest stage: log files -> episodes, steps, signals and quarantine tables (Parquet), on Ray Data.

A record is one non-blank JSONL line, or a whole file holding one pretty-printed JSON
document (ATIF trajectories are written that way). Every record ends up either in
`episodes`/`steps` or in `quarantine` with a reason; `records_in == records_ok +
records_quarantined` is checked before the stage returns. Outcome and step signals are kept
verbatim in `signals` (harnessrl.signals), one row each; their count is checked the same way.
With `fmt="auto"` each file's format is detected from its first record and reported; a file no
reader recognises is quarantined record by record (`unknown_format`), never silently skipped;
an empty file is reported as `empty`. Some records are quarantined before any reader sees them:
a line longer than `max_line_bytes` (`line_too_long`: skipped as it is read, never held whole)
and the unreadable rest of a `.gz` that stops decompressing (`corrupt_file`: one row, after the
records read before the fault; the other files go on). Readers get each file's content digest,
from which formats whose exports often carry no id derive one (formats/header.py).

Memory does not grow with the corpus (bench/ingest.py): files are read in pieces, records move in
blocks of RECORDS_PER_BLOCK, parsed blocks are staged on disk rather than held, and only one key
row per record (to find duplicate episode ids) reaches the driver.
"""

from __future__ import annotations

import io
import json
import logging
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterator

import pyarrow as pa
import pyarrow.fs as pafs

from harnessrl import schemas, signals, storage
from harnessrl.errors import ConfigError, DataError
from harnessrl.formats import decisions, native
from harnessrl.formats.detect import EMPTY, FORMATS, PARSERS, UNKNOWN, detect_format
from harnessrl.ray_runtime import object_store_budget

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
        ("signals_json", pa.string()),
        ("n_signals", pa.int64()),
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
    signals: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    raw_digest: str = ""
    sources: list[str] = field(default_factory=list)
    formats: dict[str, int] = field(default_factory=dict)  # files read per format
    outcomes_joined: int = 0

    def summary(self) -> dict:
        out = asdict(self)
        out["sources"] = self.sources[:5] + ([f"... {len(self.sources) - 5} more"] if len(self.sources) > 5 else [])
        return out


SNIFF_BYTES = 64 * 1024


def _records(data: bytes) -> list[tuple[int, bytes]]:
    """(line number, record bytes): JSONL lines, or the whole file when it is one JSON document
    spread over several lines (its first line alone does not parse)."""
    lines = [(no, line.rstrip(b"\r\n")) for no, line in enumerate(io.BytesIO(data), start=1)]
    lines = [(no, line) for no, line in lines if line.strip()]
    if len(lines) > 1 and lines[0][1].lstrip(b"\xef\xbb\xbf \t").startswith(b"{"):
        try:
            json.loads(lines[0][1])
        except ValueError:
            try:
                json.loads(data)
                return [(lines[0][0], data.strip())]
            except ValueError:
                pass  # not one document either: each line is quarantined on its own
    return lines


WHOLE_DOCUMENT_MAX_BYTES = 64 << 20  # a multi-line JSON document larger than this is read as JSONL
RECORDS_PER_BLOCK = 512
# Reading files and parsing records are separate Ray Data operators (different CPU shares keep
# Ray from fusing them): fused, one task would parse a whole file, and Ray's Parquet writer holds
# all of a task's output before writing it. Apart, each parse(+write) task is one block of records.
READ_CPUS, PARSE_CPUS = 0.25, 0.75
# `digest`: the file's content digest (for derived ids); `reason`/`detail`: set on a `Fault` row.
RECORDS = pa.schema([("source_uri", pa.string()), ("source_line", pa.int64()), ("format", pa.string()),
                     ("digest", pa.string()), ("line", pa.binary()), ("reason", pa.string()),
                     ("detail", pa.string())])


@dataclass
class Fault:
    """A record quarantined before any reader sees it: `prefix` is what is kept of its bytes."""

    reason: str
    detail: str
    prefix: bytes = b""


def file_format(uri: str, fmt: str) -> str:
    """The reader of a file: `fmt`, or with "auto" the one its first record fits (`EMPTY` for a
    file without any; `UNKNOWN` for a .gz with nothing readable: its records say why)."""
    if fmt != "auto":
        return fmt
    try:
        prefix = storage.read_prefix(uri, SNIFF_BYTES)
    except storage.CorruptFile as exc:
        log.warning("ingest: %s: %s; %s quarantined (%s)", uri, exc.error,
                    "what was read before it is ingested, the rest" if exc.partial else "the file is",
                    native.Reason.CORRUPT_FILE)
        if not exc.partial:
            return UNKNOWN
        prefix = exc.partial
    return detect_format(prefix)


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def _iter_records(uri: str, max_line_bytes: int = storage.MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | Fault]]:
    """`_records` of a file, streamed, with its faults: JSONL is read line by line, never whole; a
    line over `max_line_bytes` is a `Fault`, and so is the rest of a .gz that stops decompressing."""
    last = 0
    try:
        for no, rec in _file_records(uri, max_line_bytes):
            last = no
            yield no, rec
    except storage.CorruptFile as exc:
        yield last + 1, Fault(native.Reason.CORRUPT_FILE,
                              f"{exc.error}; the file is unreadable after line {last}" if last
                              else f"{exc.error}; nothing in the file is readable")


def _file_records(uri: str, max_line_bytes: int) -> Iterator[tuple[int, bytes | Fault]]:
    """Only a file whose first line is the start of a multi-line document (and that is small enough
    to be one) is read whole; its lines, when it is not one document after all, keep the line limit."""
    lines = storage.iter_lines(uri, max_line_bytes)
    first = next(lines, None)
    if first is None:
        return
    head = first[1]
    if isinstance(head, bytes) and head.lstrip(b"\xef\xbb\xbf \t").startswith(b"{") and not _parses(head):
        try:
            data = storage.read_prefix(uri, WHOLE_DOCUMENT_MAX_BYTES + 1)
        except storage.CorruptFile:
            data = None  # read on line by line: the fault is met (and recorded) there
        if data is not None and len(data) <= WHOLE_DOCUMENT_MAX_BYTES:
            for no, rec in _records(data):  # a document holds newlines, a line never does
                yield no, rec if b"\n" in rec or len(rec) <= max_line_bytes else storage.LongLine(rec[:storage.LONG_LINE_PREFIX], len(rec))
            return
    yield first
    yield from lines


def _as_fault(item: bytes | storage.LongLine | Fault, max_line_bytes: int) -> bytes | Fault:
    if isinstance(item, storage.LongLine):
        return Fault(native.Reason.LINE_TOO_LONG,
                     f"a line of {item.size} bytes, over max_line_bytes ({max_line_bytes}): not read",
                     item.prefix[:storage.LONG_LINE_PREFIX])
    return item


def _read_records(files: pa.Table, max_line_bytes: int = storage.MAX_LINE_BYTES) -> Iterator[pa.Table]:
    """Files -> record rows, in blocks of RECORDS_PER_BLOCK: a file's records are never all in memory."""
    for uri, fmt, digest in zip(*(files.column(c).to_pylist() for c in ("uri", "format", "digest"))):
        rows: list[dict] = []
        for no, item in _iter_records(uri, max_line_bytes):
            rec = _as_fault(item, max_line_bytes)
            fault = rec if isinstance(rec, Fault) else None
            rows.append({"source_uri": uri, "source_line": no, "format": fmt, "digest": digest,
                         "line": fault.prefix if fault else rec, "reason": fault.reason if fault else None,
                         "detail": fault.detail if fault else None})
            if len(rows) >= RECORDS_PER_BLOCK:
                yield pa.Table.from_pylist(rows, schema=RECORDS)
                rows = []
        if rows:
            yield pa.Table.from_pylist(rows, schema=RECORDS)


def _parse(fmt: str, line: bytes, uri: str, no: int, digest: str | None = None):
    if fmt not in PARSERS:  # UNKNOWN (or records past an all-blank sniffed prefix)
        return native.Quarantined(native.Reason.UNKNOWN_FORMAT, "no reader recognises this file's records; "
                                  f"give --format (one of {', '.join(FORMATS)})")
    return PARSERS[fmt](line, uri, no, digest)


def _parse_batch(batch: pa.Table, outcomes: dict | None = None) -> pa.Table:
    rows = []
    columns = ("source_uri", "source_line", "format", "line", "digest", "reason", "detail")
    for uri, no, fmt, line, digest, reason, detail in zip(*(batch.column(c).to_pylist() for c in columns)):
        parsed = native.Quarantined(reason, detail) if reason else _parse(fmt, line, uri, no, digest)
        base = {"source_uri": uri, "source_line": no, "raw_prefix": line[:RAW_PREFIX_CHARS].decode("utf-8", "replace")}
        if isinstance(parsed, native.Quarantined):
            rows.append({**base, "ok": False, "reason": parsed.reason, "detail": parsed.detail, "episode_id": None,
                         "episode_json": None, "steps_json": None, "signals_json": None, "n_signals": 0})
        else:
            found = outcomes.get(parsed.episode["native_id"]) if outcomes else None
            sig = signals.episode_signals(parsed.episode, parsed.steps, parsed.outcome, found)
            if found:
                join_outcome(parsed.episode, outcomes)
            rows.append({**base, "ok": True, "reason": None, "detail": None,
                         "episode_id": parsed.episode["episode_id"], "episode_json": json.dumps(parsed.episode),
                         "steps_json": json.dumps(parsed.steps), "signals_json": json.dumps(sig),
                         "n_signals": len(sig)})
    return pa.Table.from_pylist(rows, schema=PARSED)


def load_outcomes(uri: str) -> dict[str, dict]:
    """`--outcomes FILE`: JSONL lines `{"episode_id": NATIVE_ID, "success": bool, "score": number}`."""
    out: dict[str, dict] = {}
    for no, line in storage.iter_lines(uri):
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{uri}:{no}: outcomes must be JSON lines: {exc}") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("episode_id"), (str, int)):
            raise DataError(f"{uri}:{no}: each outcome needs an episode_id")
        success, score = rec.get("success"), rec.get("score")
        if (success is not None and not isinstance(success, bool)) or (score is not None and not _finite(score)):
            raise DataError(f"{uri}:{no}: success must be true/false and score a finite number")
        out[str(rec["episode_id"])] = {"success": success, "score": score}
    return out


def _finite(value) -> bool:
    """A JSON number that is a finite float (JSON readers accept NaN, Infinity and 1e999)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def join_outcome(episode: dict, outcomes: dict[str, dict]) -> bool:
    """A separate outcome (a later judgement, a test run) wins over what the log said inline."""
    found = outcomes.get(episode["native_id"])
    if not found:
        return False
    if found["success"] is not None:
        episode["outcome_success"] = found["success"]
    if found["score"] is not None:
        episode["outcome_score"] = float(found["score"])
    episode["evaluable"] = episode.get("outcome_success") is not None or episode.get("outcome_score") is not None
    meta = json.loads(episode.get("metadata") or "{}")
    meta["outcome_source"] = "outcomes_file"
    episode["metadata"] = json.dumps(meta, sort_keys=True)
    return True


def _is_kept(uri: str, line: int, ok: bool, duplicates: frozenset) -> bool:
    return ok and (uri, line) not in duplicates


def _episode_rows(batch: pa.Table, duplicates: frozenset) -> pa.Table:
    rows = [
        json.loads(e)
        for uri, no, ok, e in zip(*(batch.column(c).to_pylist() for c in ("source_uri", "source_line", "ok", "episode_json")))
        if _is_kept(uri, no, ok, duplicates)
    ]
    return pa.Table.from_pylist(rows, schema=schemas.EPISODES)


def _json_rows(batch: pa.Table, duplicates: frozenset, column: str, schema: pa.Schema) -> pa.Table:
    """The rows a kept record carries as a JSON list in `column` (its steps or its signals)."""
    rows = [
        row
        for uri, no, ok, s in zip(*(batch.column(c).to_pylist() for c in ("source_uri", "source_line", "ok", column)))
        if _is_kept(uri, no, ok, duplicates)
        for row in json.loads(s)
    ]
    return pa.Table.from_pylist(rows, schema=schema)


def _step_rows(batch: pa.Table, duplicates: frozenset) -> pa.Table:
    return _json_rows(batch, duplicates, "steps_json", schemas.STEPS)


def _signal_rows(batch: pa.Table, duplicates: frozenset) -> pa.Table:
    return _json_rows(batch, duplicates, "signals_json", schemas.SIGNALS)


STAGED = "_parsed"
KEY_COLUMNS = ["source_uri", "source_line", "ok", "episode_id", "reason", "n_signals"]


def _parquet_files(uri: str) -> list[str]:
    fs, path = storage.filesystem(uri)
    return sorted(f.path for f in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                  if f.type == pafs.FileType.File and f.path.endswith(".parquet"))


def _read_columns(uri: str, columns: list[str], files: list[str]) -> pa.Table:
    """Some columns of a Parquet folder's `files`, on the driver (an empty table when there are none)."""
    import pyarrow.dataset as pads

    if not files:
        return pa.schema([PARSED.field(c) for c in columns]).empty_table()
    fs, _ = storage.filesystem(uri)
    return pads.dataset(files, filesystem=fs, format="parquet").to_table(columns=columns)


def _split_staged(staged: str, path: str, stage: dict[str, str], duplicates: frozenset) -> None:
    """One staged file -> its part of each output table, written as one Parquet file each (a Ray
    task: memory is one block of records, whatever the corpus size)."""
    import pyarrow.parquet as pq

    fs, _ = storage.filesystem(staged)
    table = pq.read_table(path, filesystem=fs)
    name = path.rsplit("/", 1)[-1]
    for out, fn in OUTPUTS.items():
        rows = fn(table, duplicates)
        if rows.num_rows:
            out_fs, out_path = storage.filesystem(storage.join(stage[out], name))
            pq.write_table(rows, out_path, filesystem=out_fs, compression="zstd")


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


OUTPUTS = {"episodes": _episode_rows, "steps": _step_rows, "signals": _signal_rows, "quarantine": _quarantine_rows}


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


def ingest(sources: list[str], out_dir: str, fmt: str = "native", outcomes: str | None = None,
           max_line_bytes: int | None = None) -> IngestResult:
    """Read `sources`, write `out_dir/{episodes,steps,signals,quarantine}` as Parquet, return the counts.

    `fmt`: one of FORMATS or "auto" (per file). `outcomes`: a JSONL file of episode outcomes
    joined by native episode id. `max_line_bytes`: longer lines are quarantined (`line_too_long`;
    None: storage.MAX_LINE_BYTES)."""
    import ray

    if fmt != "auto" and fmt not in PARSERS and fmt != decisions.FORMAT:
        raise ConfigError(f"unknown format {fmt!r}; use one of: {', '.join(FORMATS)}, {decisions.FORMAT}, auto")
    max_line_bytes = storage.MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    if max_line_bytes < 1:
        raise ConfigError(f"max_line_bytes must be positive, got {max_line_bytes}")
    files = storage.expand_sources(sources)
    joined = load_outcomes(outcomes) if outcomes else None
    log.info("ingest: %d file(s) from %s", len(files), ", ".join(sources))
    digests = {u: storage.file_digest(u) for u in files}
    raw_digest = storage.combine_digests(digests.values())
    # Ray Data snapshots its context when a dataset is made: the budget is set before that.
    with object_store_budget():
        if fmt == decisions.FORMAT:  # a decision log is regrouped into episodes first (driver side)
            per_file = {f"decisions:{s}": "native" for s in sources}
            lines = ray.data.from_items([{"source_uri": f"decisions:{','.join(sources)}", "source_line": i,
                                          "format": "native", "line": line, "digest": None, "reason": None,
                                          "detail": None}
                                         for i, line in enumerate(decisions.to_native_lines(sources), start=1)])
        else:
            per_file = {u: file_format(u, fmt) for u in files}
            if fmt == "auto":
                for u, f in per_file.items():
                    if f == EMPTY:
                        log.info("ingest: %s is empty (no records)", u)
                    else:
                        log.info("ingest: %s -> format %s%s", u, f,
                                 " (no reader recognises it: quarantined)" if f == UNKNOWN else "")
            lines = ray.data.from_items([{"uri": u, "format": f, "digest": digests[u]} for u, f in per_file.items()],
                                        override_num_blocks=len(files)).map_batches(
                _read_records, batch_format="pyarrow", batch_size=1, num_cpus=READ_CPUS,
                fn_kwargs={"max_line_bytes": max_line_bytes})
        # Streamed, never held whole: parsed records go to a staging dataset on disk; the driver keeps
        # only the keys (to find duplicate ids); then one task per staged file writes its share of
        # every output table.
        staged = storage.join(out_dir, STAGED)
        storage.reset_dir(staged)
        lines.map_batches(_parse_batch, batch_format="pyarrow", batch_size=None, num_cpus=PARSE_CPUS,
                          fn_kwargs={"outcomes": joined}).write_parquet(
            staged, compression="zstd", ray_remote_args={"num_cpus": PARSE_CPUS})  # fused with the parse
    staged_files = _parquet_files(staged)
    keys = _read_columns(staged, KEY_COLUMNS, staged_files)
    duplicates = _find_duplicates(keys)

    stage = {name: storage.join(out_dir, name) for name in OUTPUTS}
    for uri in stage.values():
        storage.reset_dir(uri)
    split = ray.remote(num_cpus=PARSE_CPUS)(_split_staged)
    dups = ray.put(duplicates)
    ray.get([split.remote(staged, path, stage, dups) for path in staged_files])
    storage.remove_dir(staged)

    oks = keys.column("ok").to_pylist()
    by_reason = Counter(r for r, ok in zip(keys.column("reason").to_pylist(), oks) if not ok)
    if duplicates:
        by_reason[native.Reason.DUPLICATE_EPISODE_ID] += len(duplicates)
    records_in = len(oks)
    records_ok = sum(oks) - len(duplicates)
    quarantined = sum(by_reason.values())
    steps = ray.data.read_parquet(stage["steps"]).count() if records_ok else 0
    n_signals = _count_signals(keys, duplicates)
    written = ray.data.read_parquet(stage["signals"]).count() if n_signals else 0
    result = IngestResult(
        out_dir=out_dir, files=len(files), records_in=records_in, records_ok=records_ok,
        records_quarantined=quarantined, episodes=records_ok, steps=steps, signals=written,
        by_reason=dict(sorted(by_reason.items())), raw_digest=raw_digest, sources=files,
        formats=dict(sorted(Counter(per_file.values()).items())),
    )
    if joined:
        result.outcomes_joined = _count_joined(stage["episodes"])
    if records_in != records_ok + quarantined:  # an invariant, not a user error
        raise AssertionError(f"ingest lost records: {result.summary()}")
    if written != n_signals:
        raise AssertionError(f"ingest lost signals: {n_signals} read, {written} written")
    log.info("ingest: %d records -> %d episodes, %d steps, %d quarantined %s",
             records_in, records_ok, steps, quarantined, dict(by_reason) or "")
    return result


def _count_signals(keys: pa.Table, duplicates: frozenset) -> int:
    cols = (keys.column(c).to_pylist() for c in ("source_uri", "source_line", "ok", "n_signals"))
    return sum(n for uri, no, ok, n in zip(*cols) if _is_kept(uri, no, ok, duplicates))


def _count_joined(episodes_dir: str) -> int:
    import ray

    meta = ray.data.read_parquet(episodes_dir).select_columns(["metadata"]).to_pandas()["metadata"]
    return int(sum('"outcome_source": "outcomes_file"' in (m or "") for m in meta))
