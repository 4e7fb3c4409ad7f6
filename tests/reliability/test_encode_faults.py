"""Encode under a killed encoder actor: the encode stage runs on a slice of the session's
transitions in small blocks (block_texts=16) and one MiniLM actor of the pool is SIGKILLed once
the first encoded block is on disk. Ray Data restarts the actor and retries its block; the
output must have every transition row exactly once and every distinct text encoded exactly
once, with the same vectors as the session's undisturbed encode of the same rows."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import table
from faults import Killer

pytestmark = pytest.mark.integration
EPISODES = 8


def test_killed_encoder_actor_encodes_every_row_once(encoded, work, tmp_path):
    from harnessrl.config import EncoderConfig
    from harnessrl.pipelines.encode import encode

    full = table(work["dir"] / "transitions")
    keep = sorted(set(full.column("episode_id").to_pylist()))[:EPISODES]
    subset = full.filter(pc.is_in(full.column("episode_id"), pa_array(keep)))
    src = tmp_path / "transitions"
    src.mkdir()
    cuts = [i * subset.num_rows // 4 for i in range(5)]
    for i in range(4):  # several input files: several scan tasks
        pq.write_table(subset.slice(cuts[i], cuts[i + 1] - cuts[i]), src / f"part-{i}.parquet")
    out = tmp_path / "encoded"
    killer = Killer("MapWorker(MapBatches(_Encoder))",
                    lambda: (out / "_texts").is_dir() and any((out / "_texts").glob("*.parquet")))
    killer.start()
    try:
        result = encode(str(src), str(out), EncoderConfig(batch_size=32, max_seq_length=128, block_texts=16,
                                                          max_candidates=2))
    finally:
        killer.stop()
    assert killer.killed, "no encoder actor was running once the first block was written"

    from harnessrl.encoded_data import read_table

    rows = read_table(str(out))
    assert rows.num_rows == subset.num_rows == result.rows
    keys = Counter(zip(rows.column("episode_id").to_pylist(), rows.column("step_idx").to_pylist()))
    assert max(keys.values()) == 1
    assert set(keys) == set(zip(subset.column("episode_id").to_pylist(), subset.column("step_idx").to_pylist()))
    hashes = table(out / "_texts").column("text_hash").to_pylist()
    assert len(hashes) == len(set(hashes)) == result.texts_distinct == result.texts_encoded

    # The same vectors as the session's encode (undisturbed, same model): nothing mixed up by the retry.
    ref = read_table(str(work["dir"] / "encoded"))
    ref_by_key = {k: i for i, k in enumerate(zip(ref.column("episode_id").to_pylist(), ref.column("step_idx").to_pylist()))}
    order = [ref_by_key[k] for k in zip(rows.column("episode_id").to_pylist(), rows.column("step_idx").to_pylist())]
    for col in ("state_emb", "action_emb", "next_state_emb"):
        got = np.array(rows.column(col).to_pylist(), np.float32)
        want = np.array(ref.column(col).take(order).to_pylist(), np.float32)
        assert np.allclose(got, want, atol=1e-4), col


def pa_array(values):
    import pyarrow as pa

    return pa.array(values, pa.string())
