"""Ingest under a killed worker: a multi-block corpus (4 files x 4 blocks of RECORDS_PER_BLOCK
records) is ingested while a worker process running the parse+write of a block is SIGKILLed
after the first block reached the staging folder, and a second one running the split into
the output tables after the first output file appeared. Ray retries the tasks; the output must
hold every record exactly once (ids and counts checked against the corpus)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from conftest import table
from faults import Killer

pytestmark = pytest.mark.integration
FILES, PER_FILE, STEPS = 4, 4 * 512, 12


def _episode(f: int, i: int) -> dict:
    moves = ["north", "south", "east", "west"]
    return {"episode_id": f"f{f}-ep{i:05d}", "task": f"Find the coin number {i}.",
            "steps": [{"action": f"move {moves[j % 4]} {j}",
                       "observation": f"Room {j} of episode {i}. " + "You see a table and a chair. " * 12,
                       "candidates": [f"move {moves[j % 4]} {j}", "look", "inventory", f"take thing {j}"],
                       "reward": 0.0, "done": j == STEPS - 1} for j in range(STEPS)],
            "outcome": {"success": i % 3 == 0, "score": float(i % 5)}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("fault-corpus")
    paths = []
    for f in range(FILES):
        p = d / f"part-{f}.jsonl"
        p.write_text("".join(json.dumps(_episode(f, i)) + "\n" for i in range(PER_FILE)))
        paths.append(str(p))
    return paths


def _has_parquet(folder: Path) -> bool:
    return folder.is_dir() and any(folder.rglob("*.parquet"))


def test_killed_ingest_workers_lose_and_duplicate_nothing(ray_local, corpus, tmp_path):
    from harnessrl.pipelines.ingest import RECORDS_PER_BLOCK, STAGED, ingest

    assert PER_FILE // RECORDS_PER_BLOCK == 4  # 16 blocks: a kill lands mid-stage
    out = tmp_path / "ingest"
    parse_kill = Killer("MapBatches(_parse_batch)", lambda: _has_parquet(out / STAGED))
    split_kill = Killer("_split_staged", lambda: _has_parquet(out / "episodes"))
    parse_kill.start()
    split_kill.start()
    try:
        result = ingest(corpus, str(out))
    finally:
        parse_kill.stop()
        split_kill.stop()
    # The faults happened: a parse(+write) worker and a split worker were killed mid-stage.
    assert parse_kill.killed, "no parse worker was running once the first block was staged"
    assert split_kill.killed, "no split worker was running once the first output file was written"

    n = FILES * PER_FILE
    assert (result.records_in, result.records_ok, result.records_quarantined) == (n, n, 0), result.summary()
    assert result.steps == n * STEPS
    expected = {f"f{f}-ep{i:05d}" for f in range(FILES) for i in range(PER_FILE)}
    episodes = table(out / "episodes").column("native_id").to_pylist()
    counts = Counter(episodes)
    assert len(episodes) == n and set(counts) == expected and max(counts.values()) == 1
    steps = table(out / "steps").select(["episode_id", "step_idx"]).to_pylist()
    step_keys = Counter((s["episode_id"], s["step_idx"]) for s in steps)
    assert len(steps) == n * STEPS and max(step_keys.values()) == 1
    assert len({e for e, _ in step_keys}) == n
    assert not _has_parquet(out / "quarantine")
    assert not (out / STAGED).exists()
