"""bench/encode.py's scaled corpus (the GPU benchmark's input): N copies with N times the
distinct texts, each copy consistent within itself."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from conftest import import_bench

@pytest.fixture(scope="module")
def bench_encode():
    return import_bench("encode")


def _transitions(path: Path) -> Path:
    path.mkdir()
    pq.write_table(pa.table({
        "episode_id": ["e1", "e1", "e2"],
        "step_idx": pa.array([0, 1, 0], pa.int32()),
        "state_text": ["look around", "in the kitchen", "look around"],  # e2 starts where e1 did
        "action_text": ["go north", "take apple", "go north"],
        "next_state_text": ["in the kitchen", "you have an apple", "in the kitchen"],
        "candidates": [["go north", "go south"], ["take apple", "go south"], None],
    }), path / "part-0.parquet")
    return path


def test_scaled_copies_multiply_rows_and_distinct_texts(bench_encode, tmp_path):
    base = _transitions(tmp_path / "base")
    out = bench_encode.scaled(base, tmp_path / "x3", 3)
    t = pads.dataset(str(out), format="parquet").to_table()
    assert t.num_rows == 9
    assert len(set(t.column("episode_id").to_pylist())) == 6  # e1, e2 in each copy
    for row in t.to_pylist():
        tag = row["state_text"][: row["state_text"].index("] ") + 2]
        assert row["action_text"].startswith(tag) and row["next_state_text"].startswith(tag)
        assert row["candidates"] is None or all(c.startswith(tag) for c in row["candidates"])
        assert row["candidates"] is None or row["action_text"] in row["candidates"]
    lists, distinct = bench_encode.load_texts(base, 16)
    lists3, distinct3 = bench_encode.load_texts(out, 16)
    assert sum(map(len, lists3)) == 3 * sum(map(len, lists))
    assert len(distinct3) == 3 * len(distinct)


def test_scaled_reuses_a_matching_copy_and_rebuilds_another(bench_encode, tmp_path):
    base = _transitions(tmp_path / "base")
    out = bench_encode.scaled(base, tmp_path / "x", 2)
    first = (out / "part-0000.parquet").stat().st_mtime_ns
    assert bench_encode.scaled(base, out, 2) == out and (out / "part-0000.parquet").stat().st_mtime_ns == first
    bench_encode.scaled(base, out, 4)
    assert pads.dataset(str(out), format="parquet").count_rows() == 12
