"""Ingest streams: files are read in pieces with the same line semantics as before, records leave
a file in bounded blocks, a pretty-printed document is still one record, and the staged scratch
data is gone after a run whose counts add up (bench/ingest.py measures the memory)."""

from __future__ import annotations

import gzip
import io
import json

import pyarrow as pa
import pytest

from harnessrl import storage
from harnessrl.pipelines import ingest as ing


def _whole_file_lines(data: bytes):
    """What iter_lines returned when it read the whole file (the reference semantics)."""
    for no, line in enumerate(io.BytesIO(data), start=1):
        line = line.rstrip(b"\r\n")
        if line.strip():
            yield no, line


@pytest.mark.parametrize("payload", [b'a\r\n\n  \nb\r\r\nlast', b"a\nb\n", b"", b"\n\n", b"x" * 70 + b"\nyy\n"])
def test_streamed_lines_match_whole_file_lines(tmp_path, payload):
    plain, packed = tmp_path / "f.jsonl", tmp_path / "f.jsonl.gz"
    plain.write_bytes(payload)
    packed.write_bytes(gzip.compress(payload))
    expected = list(_whole_file_lines(payload))
    assert list(storage.iter_lines(str(plain))) == expected
    assert list(storage.iter_lines(str(packed))) == expected
    assert storage.read_prefix(str(packed), 5) == payload[:5]
    chunks = list(storage.iter_chunks(str(plain), chunk=16))
    assert b"".join(chunks) == payload and all(len(c) <= 16 for c in chunks)


def test_pretty_printed_document_is_one_record_and_jsonl_is_per_line(tmp_path):
    doc = tmp_path / "traj.json"
    doc.write_text(json.dumps({"schema_version": "ATIF-v1.7", "steps": [{"a": 1}]}, indent=2))
    assert [no for no, _ in ing._iter_records(str(doc))] == [1]
    lines = tmp_path / "x.jsonl"
    lines.write_text('{"a": 1}\n\n{"b": 2}\n{broken\n')
    assert [(no, rec) for no, rec in ing._iter_records(str(lines))] == [(1, b'{"a": 1}'), (3, b'{"b": 2}'),
                                                                         (4, b"{broken")]


def test_a_big_file_with_a_broken_first_line_is_not_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(ing, "WHOLE_DOCUMENT_MAX_BYTES", 64)
    f = tmp_path / "big.jsonl"
    f.write_text('{"broken\n' + "".join(json.dumps({"i": i}) + "\n" for i in range(20)))
    records = list(ing._iter_records(str(f)))
    assert len(records) == 21 and records[0] == (1, b'{"broken')


def test_records_leave_a_file_in_bounded_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(ing, "RECORDS_PER_BLOCK", 3)
    f = tmp_path / "x.jsonl"
    f.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(7)))
    blocks = list(ing._read_records(pa.table({"uri": [str(f)], "format": ["native"]})))
    assert [b.num_rows for b in blocks] == [3, 3, 1]
    assert blocks[2].column("source_line").to_pylist() == [7]


@pytest.mark.integration
def test_duplicates_across_files_and_no_scratch_left(ray_local, tmp_path):
    from harnessrl.pipelines.ingest import ingest

    def episode(eid: str) -> str:
        return json.dumps({"episode_id": eid, "steps": [{"action": "a", "reward": 1.0}, {"action": "b"}]}) + "\n"

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(episode(f"e{i}") for i in range(30)))
    (tmp_path / "in" / "b.jsonl").write_text(episode("e3") + episode("x1") + "{broken\n")
    r = ingest([str(tmp_path / "in")], str(tmp_path / "out"), "native")
    assert (r.records_in, r.records_ok, r.records_quarantined, r.steps, r.signals) == (33, 31, 2, 62, 31)
    assert r.by_reason == {"duplicate_episode_id": 1, "invalid_json": 1}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["episodes", "quarantine", "signals", "steps"]
