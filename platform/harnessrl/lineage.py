"""Our own content digests over whole datasets (MLflow's default reads only 10k rows, no lists).

A digest is order-independent: rows are sorted by their key columns first, so the same
content written by a different number of Ray tasks (different files) has the same digest.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.dataset as pads

from harnessrl import storage


def table_digest(table: pa.Table, keys: list[str]) -> str:
    table = table.sort_by([(k, "ascending") for k in keys]).replace_schema_metadata(None).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return "sha256:" + hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def dataset_digest(uri: str, keys: list[str]) -> str:
    """Digest of every row and column of the Parquet dataset at `uri`."""
    fs, path = storage.filesystem(uri)
    table = pads.dataset(path, filesystem=fs, format="parquet", exclude_invalid_files=True).to_table()
    return table_digest(table, keys)
