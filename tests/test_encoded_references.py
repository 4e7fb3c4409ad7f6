"""Encoded transitions that hold references into the run's distinct-text table instead of copies
of their vectors (`encoder.vectors: references`, the default), read a batch at a time.

Unit tests build small tables by hand; the integration test encodes the stage chain's
transitions in both layouts and trains, exports and scores a critic from each."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from harnessrl import encoded_data
from harnessrl.errors import DataError
from harnessrl.features import FEATURE_NAMES
from harnessrl.heads.base import Shard

from conftest import ShardReader, batches_of

DIM = 8


def _rows(n: int = 40, seed: int = 0) -> tuple[pa.Table, np.ndarray]:
    """n encoded rows in the reference layout (0-3 untaken candidates each) and the vectors they name."""
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(25, DIM)).astype(np.float32)
    k, f = rng.integers(0, 4, n), len(FEATURE_NAMES)
    cands = [rng.integers(0, 25, int(x)).astype(np.int32).tolist() for x in k]
    table = pa.table({
        "episode_id": [f"e{i // 5}" for i in range(n)], "step_idx": [i % 5 for i in range(n)],
        "group_id": [[f"g{i // 15}", None][i % 7 == 6] for i in range(n)],
        "state_ref": pa.array(rng.integers(0, 25, n), pa.int32()),
        "action_ref": pa.array(rng.integers(0, 25, n), pa.int32()),
        "next_state_ref": pa.array(rng.integers(0, 25, n), pa.int32()),
        "candidate_ref": pa.array(cands, pa.list_(pa.int32())),
        "candidate_features": [[rng.normal(size=f).astype(np.float32).tolist() for _ in c] for c in cands],
        "features": [rng.normal(size=f).astype(np.float32).tolist() for _ in range(n)],
        "tool": [["search", "read", None][i % 3] for i in range(n)],
        "reward": rng.normal(size=n).astype(np.float32), "done": [i % 5 == 4 for i in range(n)],
        "outcome_success": [i % 2 == 0 for i in range(n)], "return_to_go": rng.normal(size=n) * 3,
    })
    return table, vectors


def test_references_read_as_the_copies_they_name():
    table, vectors = _rows()
    copies = encoded_data.with_vectors(table, vectors)
    assert not set(encoded_data.REF_COLUMNS.values()) & set(copies.column_names)
    assert str(copies.schema.field("state_emb").type) == f"fixed_size_list<element: float>[{DIM}]"  # as Parquet reads
    refs = encoded_data.load_arrays(batches_of(table, 7), vectors=vectors)
    copied = encoded_data.load_arrays(batches_of(copies, 7))
    assert refs.keys() == copied.keys()
    for key in refs:
        np.testing.assert_array_equal(refs[key], copied[key], err_msg=key)
    i = int(np.argmax([len(c) for c in table.column("candidate_ref").to_pylist()]))
    np.testing.assert_array_equal(refs["cand"][i][refs["cand_mask"][i]],
                                  vectors[table.column("candidate_ref")[i].as_py()])
    np.testing.assert_array_equal(refs["state_emb"], vectors[table.column("state_ref").to_numpy()])
    with pytest.raises(DataError, match="references into the run's distinct-text table"):
        encoded_data.load_arrays([table])


def test_sampled_rows_follow_their_keys_not_their_order():
    table, _ = _rows(400)
    kept = encoded_data.sampled(table, 0.25, seed=3)
    shuffled = table.take(np.random.default_rng(1).permutation(table.num_rows))
    again = encoded_data.sampled(shuffled, 0.25, seed=3)
    key = lambda t: sorted(zip(t.column("episode_id").to_pylist(), t.column("step_idx").to_pylist()))  # noqa: E731
    assert key(kept) == key(again) and 40 < kept.num_rows < 160
    assert encoded_data.keep_rows(table, 1.0, seed=3).all()


def test_one_streaming_pass_gives_the_whole_data_statistics():
    table, vectors = _rows(300)
    stats = encoded_data.DataStats(batches_of(table, 64), table.num_rows, vectors, seed=0,
                                   sample_states=100)
    whole = encoded_data.load_arrays([table], vectors=vectors)
    assert stats.rows == 300 and stats.dim == DIM
    np.testing.assert_allclose(stats.feature_mean, whole["features"].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats.feature_std, whole["features"].std(0), rtol=1e-4, atol=1e-6)
    assert stats.tools == Counter(table.column("tool").to_pylist())
    assert stats.groups == Counter(str(g) for g in table.column("group_id").to_pylist())  # None counted as "None"
    assert stats.max_abs_reward == pytest.approx(np.abs(table.column("reward").to_numpy()).max())
    assert 40 < len(stats.states) < 200  # a sample, of the rows' own state vectors
    assert {tuple(v) for v in stats.states} <= {tuple(v) for v in whole["state_emb"]}


def test_a_streamed_shard_gives_full_batches_each_row_once_an_epoch():
    table, vectors = _rows(40)
    reader = ShardReader(table)
    stream = Shard(reader, vectors).stream(batch_size=8, seed=0, shuffle_buffer=16)
    epoch = [next(stream) for _ in range(5)]  # 40 rows
    assert all(len(b["reward"]) == 8 for b in epoch) and reader.epochs == 1
    seen = np.concatenate([b["state_emb"] for b in epoch])
    assert sorted(map(tuple, seen)) == sorted(map(tuple, vectors[table.column("state_ref").to_numpy()]))
    second = np.concatenate([next(stream)["reward"] for _ in range(5)])
    assert reader.epochs == 2 and sorted(second) == sorted(table.column("reward").to_numpy())
    assert not np.array_equal(second, np.concatenate([b["reward"] for b in epoch]))  # reshuffled

    small = Shard(ShardReader(table.slice(0, 3)), vectors).stream(batch_size=8, seed=0, shuffle_buffer=0)
    assert len(next(small)["reward"]) == 8  # a shard smaller than a batch fills it over epochs
    with pytest.raises(RuntimeError, match="empty shard"):
        next(Shard(ShardReader(table.slice(0, 0)), vectors).stream(batch_size=8, seed=0, shuffle_buffer=0))


def test_memory_replay_samples_the_whole_shard():
    table, vectors = _rows(40)
    batches = Shard(ShardReader(table), vectors).sample(batch_size=16, seed=0)
    drawn = np.concatenate([next(batches)["state_emb"] for _ in range(20)])
    stored = {tuple(v) for v in vectors[table.column("state_ref").to_numpy()]}
    assert {tuple(v) for v in drawn} == stored  # 320 draws with replacement reach all 40 rows' states


# ---- the real stage chain ------------------------------------------------------------------------
def _size(folder) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.parquet"))


@pytest.mark.integration
def test_references_train_export_and_serve_as_copies_do(encoded, work, monkeypatch):
    """The same transitions encoded in both layouts: the same vectors row for row, less than half
    the disk with references, and a critic trained on each (same seed) scores alike; so does one
    trained on the references streamed from their files rather than held in the object store."""
    from harnessrl import Critic
    from harnessrl.config import EncoderConfig, TrainConfig
    from harnessrl.jobs.train import rows_in, train
    from harnessrl.model_card import ModelCard
    from harnessrl.pipelines.encode import encode

    refs_dir = work["dir"] / "encoded"
    copies_dir = work["dir"] / "encoded-copies"
    encode(str(work["dir"] / "transitions"), str(copies_dir), EncoderConfig(batch_size=32, max_seq_length=128,
                                                                           vectors="copies"))
    assert encoded_data.references(str(refs_dir)) and not encoded_data.references(str(copies_dir))
    assert encoded_data.vector_table(str(copies_dir)) is None
    key = ["episode_id", "step_idx"]
    a = encoded_data.read_table(str(refs_dir)).sort_by([(k, "ascending") for k in key])
    b = encoded_data.read_table(str(copies_dir)).sort_by([(k, "ascending") for k in key])
    for col in ("state_emb", "action_emb", "next_state_emb", "candidate_emb"):
        assert a.column(col).equals(b.column(col)), col
    assert _size(refs_dir / "data") < 0.5 * _size(copies_dir / "data")

    cfg = TrainConfig(head="frozen", steps=80, batch_size=64, num_workers=1, cpus_per_worker=1, checkpoint_every=80, log_every=40,
                      validation_fraction=0.2, alpha=0.5)
    card = ModelCard(head_config={}, encoder=encoded.encoder, render={"window": 3, "max_chars": 1500})
    # "files": the references again, streamed from their Parquet files each epoch (train.rows: files,
    # a corpus beyond the object store) instead of held in the store (auto, at this size)
    runs = (("references", refs_dir, cfg), ("copies", copies_dir, cfg),
            ("files", refs_dir, cfg.model_copy(update={"rows": "files"})))
    results = {name: train(str(d), str(work["dir"] / f"layout-{name}"), c, f"layout-{name}",
                           str(work["dir"] / f"layout-model-{name}"), card) for name, d, c in runs}
    assert rows_in(str(refs_dir)) == "store"  # auto: 0.3 MB of rows, well under a quarter of the store
    # and under the cap on rows held whatever the store's size: above it (lowered here to their size on disk), files
    monkeypatch.setattr("harnessrl.jobs.train.STORE_ROWS_BYTES", _size(refs_dir / "data"))
    assert rows_in(str(refs_dir)) == "files" and rows_in(str(refs_dir), "store") == "store"
    for other in ("copies", "files"):
        assert results["references"].fallback_threshold == pytest.approx(results[other].fallback_threshold, abs=1e-5)
    cards = {n: json.loads((work["dir"] / f"layout-model-{n}" / "critic.json").read_text()) for n in results}
    assert cards["references"]["ood"] == pytest.approx(cards["copies"]["ood"]) == cards["files"]["ood"]
    critics = {n: Critic.load(work["dir"] / f"layout-model-{n}") for n in results}
    states = a.column("state_text").to_pylist()[:: max(1, a.num_rows // 6)][:6]
    for state in states:
        cands = ["take coin", "move north", "inventory", "look"]
        for other in ("copies", "files"):
            np.testing.assert_allclose(critics["references"].score(state, cands), critics[other].score(state, cands),
                                       atol=1e-5)
