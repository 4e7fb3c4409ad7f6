"""Encode stage: transitions -> encoded transitions with fixed-size embedding columns, on Ray Data.

Every distinct text (states, actions, next states) is encoded once: texts are keyed by
content hash and deduplicated before they reach the encoder actors. The encoder identity
is written beside the data (`_dataset.json`) and checked by whatever consumes it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from harnessrl import schemas, storage
from harnessrl.config import EncoderConfig
from harnessrl.encoders import EncoderIdentity, load_encoder, text_hash
from harnessrl.ray_runtime import shuffle_partitions
from harnessrl.transitions import untaken_candidates

log = logging.getLogger(__name__)
DATASET_META = "_dataset.json"
TEXT_COLUMNS = list(schemas.EMBEDDING_COLUMNS)


@dataclass
class EncodeResult:
    out_dir: str
    rows: int
    texts_total: int
    texts_distinct: int
    actors: int
    seconds: float
    encoder: dict

    def summary(self) -> dict:
        return asdict(self)


def _texts(batch: pa.Table, max_candidates: int) -> pa.Table:
    seen: dict[str, str] = {}
    for col in TEXT_COLUMNS:
        for text in batch.column(col).to_pylist():
            seen.setdefault(text_hash(text), text)
    if max_candidates:
        actions = batch.column("action_text").to_pylist()
        for action, cands in zip(actions, batch.column("candidates").to_pylist()):
            for text in untaken_candidates(action, cands, max_candidates):
                seen.setdefault(text_hash(text), text)
    return pa.table({"text_hash": list(seen), "text": list(seen.values())})


def _count_texts(batch: pa.Table, max_candidates: int) -> pa.Table:
    n = [3 + len(untaken_candidates(a, c, max_candidates)) if max_candidates else 3
         for a, c in zip(batch.column("action_text").to_pylist(), batch.column("candidates").to_pylist())]
    return pa.table({"n": pa.array(n, pa.int64())})


def _first(group: pa.Table) -> pa.Table:
    return group.slice(0, 1)


def _emb_array(emb: np.ndarray, dtype: str) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(emb, dtype=np.float16 if dtype == "float16" else np.float32).ravel())
    return pa.FixedSizeListArray.from_arrays(flat, emb.shape[1])


class _Encoder:
    """One model load per actor; sentence-transformers sorts each batch by length itself."""

    def __init__(self, cfg: EncoderConfig, threads: int):
        import torch

        torch.set_num_threads(max(1, threads))
        device = "cuda" if cfg.gpus_per_actor > 0 else "cpu"
        self.model, self.identity = load_encoder(cfg.model, device, cfg.max_seq_length)
        if device == "cuda":
            self.model.half()
        self.cfg = cfg

    def __call__(self, batch: pa.Table) -> pa.Table:
        emb = self.model.encode(
            batch.column("text").to_pylist(), batch_size=self.cfg.batch_size, convert_to_numpy=True, show_progress_bar=False
        )
        # Each row names the encoder that made it, so the driver can check all actors agreed.
        identity = pa.array([self.identity.to_json()] * len(batch), pa.string()).dictionary_encode()
        return pa.table({"text_hash": batch.column("text_hash"), "emb": _emb_array(emb, self.cfg.dtype), "encoder": identity})


class _Attach:
    """Joins embeddings back onto transitions by text hash (the table is loaded once per actor);
    `candidate_emb` holds the untaken candidates' embeddings, a list per row."""

    def __init__(self, emb_dir: str, max_candidates: int):
        self.max_candidates = max_candidates
        import pyarrow.dataset as pads

        fs, path = storage.filesystem(emb_dir)
        table = pads.dataset(path, filesystem=fs, format="parquet").to_table()
        self.index = {h: i for i, h in enumerate(table.column("text_hash").to_pylist())}
        self.matrix = table.column("emb").combine_chunks()

    def __call__(self, batch: pa.Table) -> pa.Table:
        for text_col, emb_col in schemas.EMBEDDING_COLUMNS.items():
            idx = pa.array([self.index[text_hash(t)] for t in batch.column(text_col).to_pylist()], pa.int64())
            batch = batch.append_column(emb_col, self.matrix.take(idx))
        offsets, flat = [0], []
        for action, cands in zip(batch.column("action_text").to_pylist(), batch.column("candidates").to_pylist()):
            flat.extend(self.index[text_hash(c)] for c in untaken_candidates(action, cands, self.max_candidates))
            offsets.append(len(flat))
        values = self.matrix.take(pa.array(flat, pa.int64()))
        batch = batch.append_column("candidate_emb", pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values))
        # candidate_features follow the same order and keep the same prefix
        kept = [f[: offsets[i + 1] - offsets[i]] for i, f in enumerate(batch.column("candidate_features").to_pylist())]
        col = batch.schema.get_field_index("candidate_features")
        return batch.set_column(col, "candidate_features", pa.array(kept, batch.schema.field(col).type))


def pool_size(cfg: EncoderConfig) -> int:
    """Actors that fit: half the cluster's CPUs (reads need the rest; see the 2-CPU deadlock note) or its GPUs."""
    import ray

    if cfg.actors:
        return cfg.actors
    res = ray.cluster_resources()
    if cfg.gpus_per_actor > 0:
        return max(1, int(res.get("GPU", 0) // cfg.gpus_per_actor))
    return max(1, min(8, int(res.get("CPU", 1) * 0.5 // cfg.cpus_per_actor)))


def read_identity(encoded_dir: str) -> EncoderIdentity:
    fs, path = storage.filesystem(storage.join(encoded_dir, DATASET_META))
    with fs.open_input_stream(path) as fh:
        return EncoderIdentity.from_json(json.loads(fh.read())["encoder"])


def encode(transitions_dir: str, out_dir: str, cfg: EncoderConfig) -> EncodeResult:
    import ray

    start = time.time()
    actors = pool_size(cfg)
    transitions = ray.data.read_parquet(transitions_dir)
    rows = transitions.count()
    texts_total = transitions.select_columns(["action_text", "candidates"]).map_batches(
        _count_texts, batch_format="pyarrow", fn_kwargs={"max_candidates": cfg.max_candidates}).sum("n")
    texts = transitions.select_columns([*TEXT_COLUMNS, "candidates"]).map_batches(
        _texts, batch_format="pyarrow", fn_kwargs={"max_candidates": cfg.max_candidates})
    distinct = texts.groupby("text_hash", num_partitions=shuffle_partitions()).map_groups(
        _first, batch_format="pyarrow").materialize()
    n_distinct = distinct.count()
    log.info("encode: %d transitions, %d distinct texts (states, actions, next states, up to %d untaken "
             "candidates per step); %d encoder actor(s)", rows, n_distinct, cfg.max_candidates, actors)

    threads = max(1, round(cfg.cpus_per_actor)) if cfg.gpus_per_actor == 0 else 2
    emb_dir = storage.join(out_dir, "_texts")
    storage.reset_dir(out_dir)
    distinct.repartition(max(actors * 4, 1)).map_batches(
        _Encoder,
        fn_constructor_kwargs={"cfg": cfg, "threads": threads},
        batch_format="pyarrow",
        batch_size=max(cfg.batch_size * 4, 256),
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=cfg.cpus_per_actor,
        num_gpus=cfg.gpus_per_actor or None,
    ).write_parquet(emb_dir, compression="zstd")

    identities = ray.data.read_parquet(emb_dir).unique("encoder")
    if len(identities) != 1:
        raise RuntimeError(f"encoder actors disagree on the encoder identity: {identities}")
    identity = EncoderIdentity.from_json(str(identities[0]))
    transitions.map_batches(
        _Attach, fn_constructor_kwargs={"emb_dir": emb_dir, "max_candidates": cfg.max_candidates}, batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=1), num_cpus=0.25,
    ).write_parquet(storage.join(out_dir, "data"), compression="zstd")

    meta = {"encoder": json.loads(identity.to_json()), "rows": rows, "texts_distinct": n_distinct,
            "dtype": cfg.dtype, "schema_version": schemas.SCHEMA_VERSION}
    fs, path = storage.filesystem(storage.join(out_dir, DATASET_META))
    with fs.open_output_stream(path) as fh:
        fh.write(json.dumps(meta, indent=2, sort_keys=True).encode())
    result = EncodeResult(out_dir, rows, texts_total, n_distinct, actors, time.time() - start, meta["encoder"])
    log.info("encode: %d distinct texts in %.1f s (%.0f texts/s end to end)", n_distinct, result.seconds,
             n_distinct / max(result.seconds, 1e-9))
    return result
