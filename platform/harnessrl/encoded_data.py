"""What an encoded dataset says about itself: `_dataset.json` beside its `data/` files (the
encoder identity that made its embeddings, counts, dtype), and the same identity in the Parquet
files' schema; and its rows read as the arrays training needs (`load_arrays`).

The encode stage writes it (`write_meta`); whatever consumes the embeddings (training, the
benchmarks' behaviour cloning) calls `check_identity` first: vectors of another encoder, cap or
precision are not comparable, and a mix fails late and silently otherwise.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from harnessrl import storage
from harnessrl.encoders import ENCODER_KEY, EncoderIdentity
from harnessrl.errors import ModelError
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


# ---- rows as arrays ---------------------------------------------------------------------------
ARRAY_COLUMNS = ("state_emb", "action_emb", "next_state_emb", "reward", "done", "outcome_success")


def _matrix(column) -> np.ndarray:
    """fixed_size_list<float>[d] -> (n, d) float32 without a Python loop."""
    arr = column.combine_chunks()
    return arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(arr), arr.type.list_size)


def _padded(column, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """list<list<float>[d]> -> (n, k_max, d) zero-padded float32 and its (n, k_max) mask.

    The inner lists are fixed-size embeddings, or variable lists of `width` features."""
    arr = column.combine_chunks()
    inner = arr.type.value_type
    n, d = len(arr), (inner.list_size if pa.types.is_fixed_size_list(inner) else width)
    offsets = arr.offsets.to_numpy()
    lengths = np.diff(offsets)
    k_max = int(lengths.max()) if n else 0
    values = arr.values.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, d)
    values = values[offsets[0]: offsets[-1]]
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


def load_arrays(batches, candidates: bool = True) -> dict[str, np.ndarray]:
    """Concatenate pyarrow batches of encoded transitions into the arrays training needs."""
    parts: dict[str, list] = {k: [] for k in (*ARRAY_COLUMNS, "features", "tool", "cand", "cand_mask", "cand_f")}
    for b in batches:
        if candidates and "candidate_emb" in b.column_names:
            cand, mask = _padded(b.column("candidate_emb"))
            parts["cand"].append(cand)
            parts["cand_mask"].append(mask)
            parts["cand_f"].append(_padded(b.column("candidate_features"), len(FEATURE_NAMES))[0][:, : cand.shape[1]])
        for k in ("state_emb", "action_emb", "next_state_emb"):
            if k in b.column_names:  # a reader head's data embeds no rendered states (encoder.state_texts)
                parts[k].append(_matrix(b.column(k)))
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
