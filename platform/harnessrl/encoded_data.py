"""What an encoded dataset says about itself: `_dataset.json` beside its `data/` files (the
encoder identity that made its embeddings, counts, dtype), and the same identity in the Parquet
files' schema.

The encode stage writes it (`write_meta`); whatever consumes the embeddings (training, the
benchmarks' behaviour cloning) calls `check_identity` first: vectors of another encoder, cap or
precision are not comparable, and a mix fails late and silently otherwise.
"""

from __future__ import annotations

import json

from harnessrl import storage
from harnessrl.encoders import ENCODER_KEY, EncoderIdentity
from harnessrl.errors import ModelError

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
