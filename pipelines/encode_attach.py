"""The encode stage's second pass: every transitions file -> its encoded file, each row's texts
looked up by hash in the run's sorted distinct-text index, a batch at a time, written as they go:
as references into that index (state_ref, action_ref, next_state_ref, candidate_ref; the
default, `encoder.vectors: references`) or as copies of the vectors (state_emb, action_emb,
next_state_emb, candidate_emb)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from harnessrl import schemas, storage
from harnessrl.embedding_cache import emb_array
from harnessrl.encoded_data import REF_COLUMNS
from harnessrl.encoders import text_hash
from harnessrl.errors import DataError
from harnessrl.pipelines.encode_pool import TASK_CPUS
from harnessrl.pipelines.encode_scan import _file_batches, _untaken, text_columns

ATTACH_ROWS = 4096  # transitions per attach batch (and row group of the output)
# Up to this many transitions the driver attaches them itself: 5k take ~1.2 s there, against
# ~4.5 s as tasks on 2 CPUs (new workers start and import, each for one small file).
DRIVER_ATTACH_ROWS = 20_000


def _list_prefix(column: pa.ChunkedArray | pa.Array, keep: np.ndarray) -> pa.Array:
    """Each row's list cut to its first `keep[i]` items (vectorised: no Python objects per item)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar([], arr.type))
    offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    starts, lengths = offsets[:-1], np.diff(offsets)
    keep = np.minimum(keep.astype(np.int64), lengths)
    new_offsets = np.concatenate([[0], np.cumsum(keep)])
    idx = np.repeat(starts - new_offsets[:-1], keep) + np.arange(new_offsets[-1], dtype=np.int64)
    values = arr.values.take(pa.array(idx, pa.int64()))
    return pa.ListArray.from_arrays(pa.array(new_offsets, pa.int32()), values, type=arr.type)


def _attach(batch: pa.Table, keys: np.ndarray, matrix: np.ndarray, max_candidates: int, schema_meta: dict,
            state_texts: bool = True, references: bool = True) -> pa.Table:
    """Transition rows + their texts' row numbers in the run's sorted distinct-text index
    (state_ref, action_ref, next_state_ref, candidate_ref: a list per row, the untaken candidates'),
    found by text hash; or, without `references`, the vectors themselves (state_emb, ...)."""
    memo: dict[str, int] = {}

    def rows(texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in memo]
        if missing:
            wanted = np.array([text_hash(t) for t in missing], dtype="S32")
            pos = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
            bad = keys[pos] != wanted
            if bad.any():
                raise DataError(f"encode: {int(bad.sum())} text(s) have no embedding "
                                f"(first: {missing[int(np.argmax(bad))][:80]!r})")
            memo.update(zip(missing, pos.tolist()))
        return np.array([memo[t] for t in texts], np.int64)

    dtype = "float16" if matrix.dtype == np.float16 else "float32"

    def column(refs: np.ndarray) -> pa.Array:
        return pa.array(refs, pa.int32()) if references else emb_array(matrix[refs].reshape(-1, matrix.shape[1]), dtype)

    for text_col in text_columns(state_texts):
        emb_col = schemas.EMBEDDING_COLUMNS[text_col]
        name = REF_COLUMNS[emb_col] if references else emb_col
        batch = batch.append_column(name, column(rows(batch.column(text_col).to_pylist())))
    actions = batch.column("action_text").to_pylist()
    untaken = _untaken(actions, batch.column("candidates").to_pylist() if max_candidates else actions, max_candidates)
    counts = np.array([len(u) for u in untaken], np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    flat = column(rows([t for u in untaken for t in u]))
    batch = batch.append_column("candidate_ref" if references else "candidate_emb",
                                pa.ListArray.from_arrays(pa.array(offsets), flat))
    if "candidate_features" in batch.column_names:
        # candidate_features follow the untaken candidates' order: keep the same prefix
        col = batch.schema.get_field_index("candidate_features")
        batch = batch.set_column(col, "candidate_features", _list_prefix(batch.column(col), counts))
    return batch.replace_schema_metadata({**(batch.schema.metadata or {}), **schema_meta})


def _attach_file(path: str, part: int, transitions_dir: str, data_dir: str, index: tuple[np.ndarray, np.ndarray],
                 max_candidates: int, schema_meta: dict, state_texts: bool = True, references: bool = True) -> int:
    """One transitions file -> its encoded file (`part-NNNNN.parquet`, same rows and order), read,
    attached and written ATTACH_ROWS at a time: a task holds one batch, whatever the file's size.
    A retried task rewrites the same file. Returns the rows written."""
    import pyarrow.parquet as pq

    keys, matrix = index
    fs, out = storage.filesystem(data_dir)
    writer, n = None, 0
    try:
        for rows in _file_batches(transitions_dir, path, None, ATTACH_ROWS):
            batch = _attach(rows, keys, matrix, max_candidates, schema_meta, state_texts, references)
            if writer is None:
                writer = pq.ParquetWriter(f"{out}/part-{part:05d}.parquet", batch.schema, filesystem=fs,
                                          compression="zstd")
            writer.write_table(batch)
            n += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    return n


def attach_all(files: list[str], transitions_dir: str, data_dir: str, index: tuple[np.ndarray, np.ndarray],
               max_candidates: int, schema_meta: dict, in_driver: bool, state_texts: bool = True,
               references: bool = True) -> int:
    """Every transitions file -> its encoded file; returns the rows written. A small corpus is
    attached here, file after file; a large one by one plain Ray task per file, all submitted at
    once (not a Ray Data execution: nothing flows between tasks, and its start-up was 3 s of the
    phase's 4.6 s on the example corpus), the index resolved zero-copy from the object store."""
    import ray

    fs, path = storage.filesystem(data_dir)
    fs.create_dir(path, recursive=True)
    if in_driver:
        return sum(_attach_file(f, k, transitions_dir, data_dir, index, max_candidates, schema_meta, state_texts,
                                references) for k, f in enumerate(files))
    shared = ray.put(index)
    attach = ray.remote(num_cpus=TASK_CPUS)(_attach_file)
    return sum(ray.get([attach.remote(f, k, transitions_dir, data_dir, shared, max_candidates, schema_meta,
                                      state_texts, references) for k, f in enumerate(files)]))
