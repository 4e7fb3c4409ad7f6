"""The decision log: every served decision and every feedback, appended off the request path.

Requests only put a record in a bounded in-memory buffer; a background task writes the buffer
as one JSONL part file every `flush_every_s` (a new file per flush, because object stores
cannot append), and `close()` writes what is left, so a graceful shutdown loses nothing.
Files land under `<dir>/<kind>/<replica>-<seq>.jsonl`, local or `s3://`; `harnessrl ingest
--format decisions` reads them back as training data (the flywheel).

What is kept is `serve.decision_log_fields`: `full` (the default) keeps every record as the
agent sent it, states and candidate texts in plain text, which is what training on the log
needs; `hashes` replaces each text the agent sent (state, candidates, agent_id, feedback
detail) by its SHA-256, so decisions can still be audited, counted and matched to identical
states without storing their content; `drop` removes those fields. Records of `hashes` or
`drop` say so (`"fields"`) and cannot become training data (ingest quarantines them).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from collections import defaultdict
from typing import Any

from harnessrl import storage

log = logging.getLogger(__name__)
KINDS = ("decisions", "feedback")
FIELD_MODES = ("full", "hashes", "drop")
AGENT_TEXT = ("state", "candidates", "agent_id", "detail")  # what the agent sent, as it sent it


def _sha256(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def kept(record: dict[str, Any], fields: str) -> dict[str, Any]:
    """The record as the decision log keeps it under `fields` (full, hashes or drop)."""
    if fields == "full":
        return record
    out = {k: v for k, v in record.items() if k not in AGENT_TEXT}
    if fields == "hashes":
        for key in AGENT_TEXT:
            value = record.get(key)
            if value is not None:
                out[f"{key}_sha256"] = [_sha256(v) for v in value] if key == "candidates" else _sha256(value)
    out["fields"] = fields
    return out


class DecisionLog:
    def __init__(self, directory: str, writer_id: str, flush_every_s: float = 2.0, max_buffer: int = 100_000,
                 fields: str = "full"):
        if fields not in FIELD_MODES:
            raise ValueError(f"decision log fields {fields!r}: one of {', '.join(FIELD_MODES)}")
        self.directory, self.writer_id, self.fields = directory, writer_id, fields
        self.flush_every_s, self.max_buffer = flush_every_s, max_buffer
        self._buffer: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._lock = threading.Lock()
        self._seq = 0
        self.written = {k: 0 for k in KINDS}
        self.dropped = 0
        self._task: asyncio.Task | None = None

    def append(self, kind: str, record: dict[str, Any]) -> None:
        """Never blocks on I/O. Past `max_buffer` unflushed records (storage down) new ones are
        counted as dropped rather than growing memory without bound."""
        with self._lock:
            if sum(len(v) for v in self._buffer.values()) >= self.max_buffer:
                self.dropped += 1
                return
            self._buffer[kind].append({**kept(record, self.fields), "logged_at": time.time()})

    def flush(self) -> int:
        """Write buffered records (one part file per kind); returns how many were written.
        On a write error the records go back into the buffer for the next flush."""
        with self._lock:
            pending, self._buffer = self._buffer, defaultdict(list)
        written = 0
        for kind, records in pending.items():
            if not records:
                continue
            self._seq += 1
            uri = storage.join(self.directory, kind, f"{self.writer_id}-{self._seq:08d}.jsonl")
            try:
                fs, path = storage.filesystem(uri)
                fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
                with fs.open_output_stream(path) as out:
                    out.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode())
            except Exception as exc:  # storage unavailable: keep the records, retry next time
                log.warning("decision log: writing %s failed (%s); %d records kept for retry", uri, exc, len(records))
                with self._lock:
                    self._buffer[kind][:0] = records
                continue
            self.written[kind] += len(records)
            written += len(records)
        return written

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_every_s)
            await asyncio.to_thread(self.flush)

    def start(self) -> None:
        """Start the periodic flush on the running event loop (call from async code)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        await asyncio.to_thread(self.flush)
