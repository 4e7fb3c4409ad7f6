"""What an encoded dataset says about itself: `_dataset.json` beside its `data/` files (the
encoder identity that made its embeddings, counts, dtype, layout), and the same identity in the
Parquet files' schema; and its rows read as the arrays training needs (`load_arrays`).

Two layouts (`encoder.vectors`): `references`, the default, where a row holds the row numbers of
its texts in the run's distinct-text table (`_texts`, ordered by content hash: `vector_table`),
so each vector is stored once however many transitions name it; and `copies`, where every row
carries its vectors. Readers gather references a batch at a time (`load_arrays(..., vectors)`).

The encode stage writes it (`write_meta`); whatever consumes the embeddings (training, the
benchmarks' behaviour cloning) calls `check_identity` first: vectors of another encoder, cap or
precision are not comparable, and a mix fails late and silently otherwise.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from harnessrl import storage
from harnessrl.encoders import ENCODER_KEY, EncoderIdentity
from harnessrl.errors import DataError, ModelError
from harnessrl.features import FEATURE_NAMES

DATASET_META = "_dataset.json"


def write_meta(encoded_dir: str, meta: dict) -> None:
    """The stage's description of the dataset (it holds the identity under "encoder")."""
    fs, path = storage.filesystem(storage.join(encoded_dir, DATASET_META))
    with fs.open_output_stream(path) as fh:
        fh.write(json.dumps(meta, indent=2, sort_keys=True).encode())


def exists(encoded_dir: str) -> bool:
    """Whether the encode stage finished writing a dataset here (its description is written last)."""
    fs, path = storage.filesystem(storage.join(encoded_dir, DATASET_META))
    return fs.get_file_info(path).type.name != "NotFound"


def read_meta(encoded_dir: str) -> dict:
    fs, path = storage.filesystem(storage.join(encoded_dir, DATASET_META))
    with fs.open_input_stream(path) as fh:
        return json.loads(fh.read())


def read_identity(encoded_dir: str) -> EncoderIdentity:
    return EncoderIdentity.from_json(read_meta(encoded_dir)["encoder"])


def check_identity(encoded_dir: str, identity: EncoderIdentity, where: str = "") -> None:
    """Raise ModelError unless the encoded dataset's embeddings were made by `identity`: its
    `_dataset.json` and the encoder named in its Parquet files' schema must both agree."""
    import pyarrow.dataset as pads

    where = where or f"encoded dataset {encoded_dir}"
    try:
        stored = read_identity(encoded_dir)
    except (OSError, FileNotFoundError, KeyError, ValueError) as exc:
        raise ModelError(f"{where}: no readable encoder identity ({DATASET_META}): {exc}") from None
    stored.check_same(identity, where)
    fs, path = storage.filesystem(storage.join(encoded_dir, "data"))
    meta = pads.dataset(path, filesystem=fs, format="parquet").schema.metadata or {}
    if ENCODER_KEY in meta:
        EncoderIdentity.from_json(meta[ENCODER_KEY].decode()).check_same(identity, f"{where} (Parquet schema)")


def references(encoded_dir: str) -> bool:
    """Whether the rows hold references into the distinct-text table (else copies of the vectors)."""
    return read_meta(encoded_dir).get("vectors") == "references"


# ---- the distinct-text table ------------------------------------------------------------------
REF_COLUMNS = {"state_emb": "state_ref", "action_emb": "action_ref", "next_state_emb": "next_state_ref",
               "candidate_emb": "candidate_ref"}


def parquet_files(fs, path: str) -> list[str]:
    import pyarrow.fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet"))


def text_index(texts_dir: str, dtype: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """A run's distinct texts as (sorted 32-byte hex keys, their vectors in the same order): a
    reference is a row number of this order."""
    import pyarrow.dataset as pads

    from harnessrl.embedding_cache import emb_matrix

    fs, path = storage.filesystem(texts_dir)
    files = parquet_files(fs, path)
    if not files:
        return np.array([], dtype="S32"), np.zeros((0, dim), np.float16 if dtype == "float16" else np.float32)
    table = pads.dataset(files, filesystem=fs, format="parquet").to_table(columns=["text_hash", "emb"])
    keys = np.array(table.column("text_hash").to_pylist(), dtype="S32")
    order = np.argsort(keys, kind="stable")
    return keys[order], emb_matrix(table.column("emb"), dim)[order]


def vector_table(encoded_dir: str) -> np.ndarray | None:
    """The vectors a reference-layout dataset's rows point into (None for the copies layout)."""
    if not references(encoded_dir):
        return None
    meta = read_meta(encoded_dir)
    return text_index(storage.join(encoded_dir, "_texts"), meta.get("dtype", "float32"),
                      int(meta["encoder"]["dim"]))[1]


def read_table(encoded_dir: str) -> pa.Table:
    """The encoded rows as one table with their vectors in it whatever the layout (`state_emb`, ...,
    `candidate_emb`): for tools, benchmarks and tests that read a dataset whole."""
    return with_vectors(storage.read_parquet(storage.join(encoded_dir, "data")), vector_table(encoded_dir))


def with_vectors(table: pa.Table, vectors: np.ndarray | None) -> pa.Table:
    """`table` with each reference column replaced by the vectors it names (typed as the copies
    layout reads back from Parquet, so the two compare equal)."""
    if vectors is None:
        return table
    emb_type = pa.list_(pa.field("element", pa.float16() if vectors.dtype == np.float16 else pa.float32()),
                        vectors.shape[1])

    def embeddings(refs: pa.Array) -> pa.FixedSizeListArray:
        flat = np.ascontiguousarray(vectors[refs.to_numpy(zero_copy_only=False)]).ravel()
        return pa.FixedSizeListArray.from_arrays(pa.array(flat), type=emb_type)

    for emb, ref in REF_COLUMNS.items():
        if ref not in table.column_names:
            continue
        col = table.column(ref).combine_chunks()
        value = (pa.ListArray.from_arrays(col.offsets, embeddings(col.values), type=pa.list_(pa.field("element", emb_type)))
                 if emb == "candidate_emb" else embeddings(col))
        table = table.set_column(table.schema.get_field_index(ref), emb, value)
    return table


# ---- rows as arrays ---------------------------------------------------------------------------
ARRAY_COLUMNS = ("state_emb", "action_emb", "next_state_emb", "reward", "done", "outcome_success")


def _matrix(column) -> np.ndarray:
    """fixed_size_list<float>[d] -> (n, d) float32 without a Python loop."""
    arr = column.combine_chunks()
    return arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(arr), arr.type.list_size)


def _needed(vectors: np.ndarray | None) -> np.ndarray:
    if vectors is None:
        raise DataError("the encoded rows hold references into the run's distinct-text table: read them with "
                        "its vectors (encoded_data.vector_table)")
    return vectors


def vectors_of(batch: pa.Table, name: str, vectors: np.ndarray | None) -> np.ndarray | None:
    """The (n, d) float32 vectors of one embedding column (`state_emb`, `action_emb`, `next_state_emb`)
    of a batch, copied or gathered through its references; None when the batch has neither."""
    if name in batch.column_names:
        return _matrix(batch.column(name))
    ref = REF_COLUMNS[name]
    if ref not in batch.column_names:
        return None
    return _needed(vectors)[batch.column(ref).combine_chunks().to_numpy(zero_copy_only=False)].astype(np.float32)


def _padded(column, width: int | None = None, vectors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """list<list<float>[d]> -> (n, k_max, d) zero-padded float32 and its (n, k_max) mask.

    The inner lists are fixed-size embeddings, variable lists of `width` features, or (with
    `vectors`) references into `vectors`."""
    arr = column.combine_chunks()
    n = len(arr)
    offsets = arr.offsets.to_numpy()
    lengths = np.diff(offsets)
    k_max = int(lengths.max()) if n else 0
    if vectors is not None:
        refs = arr.values.to_numpy(zero_copy_only=False)[offsets[0]: offsets[-1]]
        values = vectors[refs].astype(np.float32)
    else:
        inner = arr.type.value_type
        d = inner.list_size if pa.types.is_fixed_size_list(inner) else width
        values = arr.values.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, d)
        values = values[offsets[0]: offsets[-1]]
    d = values.shape[1]
    rows = np.repeat(np.arange(n), lengths)
    cols = np.arange(len(values)) - np.repeat(offsets[:-1] - offsets[0], lengths)
    out = np.zeros((n, k_max, d), np.float32)
    mask = np.zeros((n, k_max), bool)
    out[rows, cols], mask[rows, cols] = values, True
    return out, mask


def _features(column) -> np.ndarray:
    """list<float> with one fixed length per table -> (n, F) float32."""
    arr = column.combine_chunks()
    flat = arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    return flat.reshape(len(arr), -1) if len(arr) else flat.reshape(0, len(FEATURE_NAMES))


def _pad_to(parts: list[np.ndarray], k: int) -> list[np.ndarray]:
    return [np.pad(x, ((0, 0), (0, k - x.shape[1])) + ((0, 0),) * (x.ndim - 2)) for x in parts]


def load_arrays(batches, candidates: bool = True, vectors: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Concatenate pyarrow batches of encoded transitions into the arrays training needs; the
    references of a reference-layout dataset are gathered from `vectors` (its `vector_table`)."""
    parts: dict[str, list] = {k: [] for k in (*ARRAY_COLUMNS, "features", "tool", "cand", "cand_mask", "cand_f")}
    for b in batches:
        names = b.column_names
        if candidates and ("candidate_emb" in names or "candidate_ref" in names):
            cand, mask = (_padded(b.column("candidate_emb")) if "candidate_emb" in names
                          else _padded(b.column("candidate_ref"), vectors=_needed(vectors)))
            parts["cand"].append(cand)
            parts["cand_mask"].append(mask)
            parts["cand_f"].append(_padded(b.column("candidate_features"), len(FEATURE_NAMES))[0][:, : cand.shape[1]])
        for k in ("state_emb", "action_emb", "next_state_emb"):
            v = vectors_of(b, k, vectors)
            if v is not None:  # a reader head's data embeds no rendered states (encoder.state_texts)
                parts[k].append(v)
        parts["features"].append(_features(b.column("features")))
        parts["tool"].append(np.array(b.column("tool").to_pylist(), dtype=object))
        parts["reward"].append(b.column("reward").to_numpy(zero_copy_only=False).astype(np.float32))
        parts["done"].append(b.column("done").to_numpy(zero_copy_only=False).astype(np.float32))
        parts["outcome_success"].append(
            np.array([bool(x) for x in b.column("outcome_success").to_pylist()], dtype=bool))
    if parts["cand"]:  # batches pad to their own k_max: pad to the largest
        k = max(c.shape[1] for c in parts["cand"])
        for key in ("cand", "cand_mask", "cand_f"):
            parts[key] = _pad_to(parts[key], k)
    return {k: np.concatenate(v) for k, v in parts.items() if v}


# ---- one streaming pass for what the driver needs -----------------------------------------------
SAMPLE_STATES = 20_000  # training states kept for the OOD reference (ood.fit_reference keeps 2048 of them)
HELD_OUT_STATES = 4096  # held-out states that set the OOD threshold


def keep_rows(batch: pa.Table, share: float, seed: int) -> np.ndarray:
    """A seeded sample of about `share` of the rows, by each row's (episode_id, step_idx), so the
    same rows are kept whatever the order or the batching the rows come in."""
    import zlib

    if share >= 1:
        return np.ones(batch.num_rows, bool)
    keys = zip(batch.column("episode_id").to_pylist(), batch.column("step_idx").to_pylist())
    return np.array([zlib.crc32(f"{seed}:{e}:{s}".encode()) < share * 2**32 for e, s in keys], bool)


def sampled(batch: pa.Table, share: float, seed: int) -> pa.Table:
    """The rows of `batch` that `keep_rows` keeps."""
    return batch if share >= 1 else batch.filter(pa.array(keep_rows(batch, share, seed)))


class DataStats:
    """What the train job's driver needs of the whole dataset, from one pass a batch at a time: the
    row count, the history features' mean and std, the tools called and those the episodes define,
    the rows of each task group (the validation split's), the largest |reward| of a step, the vector
    width and a sample of the training states' vectors (the OOD reference is drawn from it). One pass,
    not one Ray Data job for each: on a small machine each job costs seconds to start."""

    def __init__(self, batches, n_rows: int, vectors: np.ndarray | None, seed: int = 0,
                 sample_states: int = SAMPLE_STATES):
        from collections import Counter

        share = sample_states / max(n_rows, 1)
        self.rows, self.max_abs_reward = 0, 0.0
        self.dim = int(vectors.shape[1]) if vectors is not None else 0
        self.tools: Counter = Counter()
        self.groups: Counter = Counter()  # rows per group_id, "None" for rows without one
        defined: set[str] = set()
        total = squares = None
        states = []
        for b in batches:
            self.rows += b.num_rows
            f = _features(b.column("features")).astype(np.float64)
            total, squares = (f.sum(0), (f * f).sum(0)) if total is None else (total + f.sum(0), squares + (f * f).sum(0))
            self.tools.update(b.column("tool").to_pylist())
            if "group_id" in b.column_names:
                counts = pc.value_counts(pc.fill_null(pc.cast(b.column("group_id"), pa.string()), "None"))
                self.groups.update(dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist())))
            if "defined_tools" in b.column_names:  # absent in data from before tools were recorded
                defined.update(pc.unique(pc.list_flatten(b.column("defined_tools"))).to_pylist())
            rew = np.abs(b.column("reward").to_numpy(zero_copy_only=False))
            self.max_abs_reward = max(self.max_abs_reward, float(rew.max()) if len(rew) else 0.0)
            s = vectors_of(sampled(b, share, seed), "state_emb", vectors)
            if s is not None:
                states.append(s)
            if not self.dim:  # copies: the width of the first batch's vectors
                a = vectors_of(b.slice(0, 1), "action_emb", vectors)
                self.dim = a.shape[1] if a is not None else 0
        self.defined_tools = sorted(t for t in defined if t)
        n = max(self.rows, 1)
        self.feature_mean = total / n if total is not None else np.zeros(0)
        self.feature_std = np.sqrt(np.maximum(squares / n - self.feature_mean ** 2, 0)) if total is not None \
            else np.zeros(0)
        self.states = np.concatenate(states) if states else None  # None: the data embeds no rendered states
