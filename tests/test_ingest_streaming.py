"""Ingest streams: files are read in pieces with the same line semantics as before, records leave
a file in bounded blocks, a pretty-printed document is still one record, and the staged scratch
data is gone after a run whose counts add up (bench/ingest.py measures the memory)."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

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
    blocks = list(ing._read_records(pa.table({"uri": [str(f)], "format": ["native"], "digest": ["d"]})))
    assert [b.num_rows for b in blocks] == [3, 3, 1]
    assert blocks[2].column("source_line").to_pylist() == [7]


def test_a_line_over_the_limit_is_skipped_as_it_is_read(tmp_path):
    import tracemalloc

    f = tmp_path / "long.jsonl"
    huge = 48 << 20
    with f.open("wb") as fh:
        fh.write(b'{"a": 1}\n')
        fh.write(b"x" * huge)
        fh.write(b'\n{"b": 2}\n' + b"y" * 5000 + b"\n")
    tracemalloc.start()
    try:
        items = list(storage.iter_lines(str(f), max_line_bytes=1 << 20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < huge // 2, f"peak {peak >> 20} MiB: the long line was held"
    assert [(no, type(x).__name__) for no, x in items] == [(1, "bytes"), (2, "LongLine"), (3, "bytes"), (4, "bytes")]
    assert items[1][1].size == huge and items[1][1].prefix == b"x" * storage.LONG_LINE_PREFIX
    small = list(ing._iter_records(str(f), max_line_bytes=4096))
    faults = [(no, ing._as_fault(x, 4096).reason) for no, x in small if not isinstance(x, bytes)]
    assert faults == [(2, "line_too_long"), (4, "line_too_long")]


def test_a_long_line_at_the_end_of_a_file_without_newline(tmp_path):
    f = tmp_path / "tail.jsonl"
    f.write_bytes(b'{"a": 1}\n' + b"z" * 3000)
    (first, long_line) = storage.iter_lines(str(f), max_line_bytes=1000)
    assert first == (1, b'{"a": 1}') and long_line[0] == 2 and long_line[1].size == 3000
    assert list(storage.iter_lines(str(f))) == [(1, b'{"a": 1}'), (2, b"z" * 3000)]  # no limit: as before


@pytest.mark.parametrize("damage", ["truncated", "not_gzip", "garbage_after", "flipped_bytes"])
def test_a_corrupt_gzip_keeps_what_was_read_and_names_the_rest(tmp_path, damage):
    lines = b"".join(json.dumps({"episode_id": f"e{i}", "steps": [{"action": "go"}]}).encode() + b"\n"
                     for i in range(20_000))
    packed = gzip.compress(lines)
    data = {"truncated": packed[: len(packed) // 2], "not_gzip": lines[:3000], "garbage_after": packed + b"junk",
            "flipped_bytes": packed[:40] + bytes(b ^ 0x5A for b in packed[40:400]) + packed[400:]}[damage]
    f = tmp_path / "broken.jsonl.gz"
    f.write_bytes(data)
    records = list(ing._iter_records(str(f)))
    *good, (last_no, fault) = records
    assert isinstance(fault, ing.Fault) and fault.reason == "corrupt_file" and "gzip" in fault.detail
    assert all(isinstance(r, bytes) for _, r in good) and last_no == len(good) + 1
    assert len(good) == {"truncated": len(good), "not_gzip": 0, "garbage_after": 20_000, "flipped_bytes": 0}[damage]
    if damage == "truncated":
        assert 5_000 < len(good) < 20_000 and all(json.loads(r) for _, r in good)
    assert storage.file_digest(str(f)) == storage.file_digest(str(f))  # digested, not raised
    assert ing.file_format(str(f), "auto") in ("native", "unknown")
    with pytest.raises(storage.CorruptFile):
        list(storage.iter_chunks(str(f)))


def test_empty_files_are_empty_not_unknown(tmp_path):
    for name, data in (("a.jsonl", b""), ("b.jsonl", b"\n  \n"), ("c.jsonl.gz", gzip.compress(b""))):
        (tmp_path / name).write_bytes(data)
        assert ing.file_format(str(tmp_path / name), "auto") == "empty"
        assert list(ing._iter_records(str(tmp_path / name))) == []


def _tree(root) -> None:
    for rel in ("a.jsonl", "b.ndjson", "c.log", "d.jsonl.gz", "e.ndjson.gz", "f.log.gz", "g.json", "notes.txt",
                "sub/h.jsonl", "sub/deeper/i.ndjson", "sub/j.txt"):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(gzip.compress(b"{}\n") if rel.endswith(".gz") else b"{}\n")


def test_directories_read_ndjson_and_log_files(tmp_path):
    _tree(tmp_path)
    found = {Path(f).relative_to(tmp_path).as_posix() for f in storage.expand_sources([str(tmp_path)])}
    assert found == {"a.jsonl", "b.ndjson", "c.log", "d.jsonl.gz", "e.ndjson.gz", "f.log.gz", "g.json",
                     "sub/h.jsonl", "sub/deeper/i.ndjson"}


GLOBS = [("*.ndjson", {"b.ndjson"}), ("**/*.ndjson", {"b.ndjson", "sub/deeper/i.ndjson"}),
         ("sub/*", {"sub/h.jsonl", "sub/j.txt"}), ("[ab].*", {"a.jsonl", "b.ndjson"}), ("?.log*", {"c.log", "f.log.gz"}),
         ("sub/**", {"sub/h.jsonl", "sub/j.txt", "sub/deeper/i.ndjson"})]


@pytest.mark.parametrize("pattern, expected", GLOBS)
def test_local_globs(tmp_path, pattern, expected, monkeypatch):
    _tree(tmp_path)
    found = storage.expand_sources([f"{tmp_path}/{pattern}"])
    assert {Path(f).relative_to(tmp_path).as_posix() for f in found} == expected
    monkeypatch.chdir(tmp_path)  # relative globs are resolved from the working directory
    assert storage.expand_sources([pattern]) == found


def test_a_glob_without_matches_is_a_data_error(tmp_path):
    from harnessrl.errors import DataError

    with pytest.raises(DataError, match="no files match"):
        storage.expand_sources([f"{tmp_path}/*.jsonl"])
    with pytest.raises(DataError, match="no files match"):
        storage.expand_sources([f"{tmp_path}/missing/**/*.jsonl"])


@pytest.mark.integration
def test_s3_globs_and_prefixes(s3, tmp_path):
    _tree(tmp_path)
    bucket = s3["bucket"]
    for f in tmp_path.rglob("*"):
        if f.is_file():
            s3["client"].upload_file(str(f), bucket, f"globbed/{f.relative_to(tmp_path).as_posix()}")
    for pattern, expected in GLOBS:
        found = storage.expand_sources([f"s3://{bucket}/globbed/{pattern}"])
        assert found == sorted(f"s3://{bucket}/globbed/{e}" for e in expected), pattern
    listed = storage.expand_sources([f"s3://{bucket}/globbed/"])
    assert {f.split("/globbed/")[1] for f in listed} == {
        "a.jsonl", "b.ndjson", "c.log", "d.jsonl.gz", "e.ndjson.gz", "f.log.gz", "g.json", "sub/h.jsonl",
        "sub/deeper/i.ndjson"}
    assert storage.iter_lines(listed[0]) and list(storage.iter_lines(listed[0])) == [(1, b"{}")]


@pytest.mark.integration
def test_a_parquet_folder_reads_whole_locally_and_from_s3(s3, tmp_path):
    """`storage.read_parquet`: every file of a folder, the columns asked for, on local disk and S3 alike."""
    import pyarrow.parquet as pq

    folder = tmp_path / "parts"
    folder.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"k": [2 * i, 2 * i + 1], "v": ["a", "b"]}), folder / f"part-{i}.parquet")
        s3["client"].upload_file(str(folder / f"part-{i}.parquet"), s3["bucket"], f"parts/part-{i}.parquet")
    for uri in (str(folder), f"s3://{s3['bucket']}/parts"):
        assert sorted(storage.read_parquet(uri, ["k"]).to_pydict()["k"]) == [0, 1, 2, 3], uri
        assert storage.read_parquet(uri).column_names == ["k", "v"], uri


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
