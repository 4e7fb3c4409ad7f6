"""A persistent embedding cache keyed by (encoder identity, text hash), on local disk or S3.

Re-runs, new data that shares old states, and the serving decision log reuse embeddings
instead of encoding the same text again. Layout (one folder per encoder identity and dtype):

    <root>/<identity digest>-<dtype>/
        _cache.json                    the full encoder identity, dtype, dim, bucket count
        b=007/part-<run>-<key>.parquet rows (text_hash: string, emb: fixed_size_list<dtype>[dim])

A text's bucket is a function of its hash (`bucket_of`), so a lookup reads one bucket's
files, never the whole cache: the encode stage hash-partitions its distinct texts by bucket
and each task looks up the buckets it holds. Writers only add files (one per bucket per write,
named by run and content, so a retried task overwrites its own file); readers take the union,
and a text stored twice (two runs that raced) is harmless: both rows hold the same vector.
Embeddings are stored in the dtype of the run that wrote them and the dtype is part of the
key, so a float32 run never reads float16-rounded vectors.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from harnessrl import storage
from harnessrl.encoders import ENCODER_KEY, EncoderIdentity, text_hash
from harnessrl.errors import ConfigError, ModelError

BUCKETS = 16
META = "_cache.json"
FORMAT_VERSION = 1


def bucket_of(hex_hash: str, buckets: int = BUCKETS) -> int:
    """The cache bucket of a text hash (hex, as `text_hash` returns it)."""
    return int(hex_hash[:4], 16) % buckets


def emb_type(dim: int, dtype: str) -> pa.DataType:
    return pa.list_(pa.float16() if dtype == "float16" else pa.float32(), dim)


def emb_array(emb: np.ndarray, dtype: str) -> pa.FixedSizeListArray:
    """A (n, d) matrix as a fixed_size_list<float16|float32>[d] column."""
    flat = np.ascontiguousarray(emb, dtype=np.float16 if dtype == "float16" else np.float32).ravel()
    return pa.FixedSizeListArray.from_arrays(pa.array(flat), emb.shape[1])


def emb_matrix(column: pa.Array | pa.ChunkedArray, dim: int) -> np.ndarray:
    """The inverse of `emb_array` (rows must not be null)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    return column.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)


class EmbeddingCache:
    """One encoder identity's embeddings under `root` (a local folder or `s3://bucket/prefix`).

    Picklable (the filesystem object carries the S3 endpoint and credentials), so Ray tasks and
    actors receive it as an argument. `open()` checks the stored identity before any use."""

    def __init__(self, root: str, identity: EncoderIdentity, dtype: str = "float32"):
        if not root or (storage.is_remote(root) and not root.startswith("s3://")):
            raise ConfigError(f"embedding cache {root!r}: use a local folder or an s3:// URI")
        if dtype not in ("float32", "float16"):
            raise ConfigError(f"embedding cache dtype must be float32 or float16, got {dtype!r}")
        self.root, self.identity, self.dtype = root, identity, dtype
        self.uri = storage.join(root, f"{identity.digest()}-{dtype}")
        self._fs, self._path = storage.portable_filesystem(self.uri)
        self.buckets = BUCKETS
        self.type = emb_type(identity.dim, dtype)

    # ---- metadata -------------------------------------------------------------------------
    def exists(self) -> bool:
        return self._fs.get_file_info(f"{self._path}/{META}").type == pafs.FileType.File

    def open(self) -> "EmbeddingCache":
        """Check the folder's identity (a mismatch is an error), or create the folder."""
        meta_path = f"{self._path}/{META}"
        if self.exists():
            with self._fs.open_input_stream(meta_path) as fh:
                meta = json.loads(fh.read())
            EncoderIdentity.from_json(meta["encoder"]).check_same(self.identity, f"embedding cache {self.uri}")
            if meta.get("dtype") != self.dtype or int(meta.get("dim", -1)) != self.identity.dim:
                raise ModelError(f"embedding cache {self.uri} holds {meta.get('dtype')}[{meta.get('dim')}] vectors, "
                                 f"not {self.dtype}[{self.identity.dim}]")
            self.buckets = int(meta.get("buckets", BUCKETS))
            return self
        self._fs.create_dir(self._path, recursive=True)
        meta = {"encoder": json.loads(self.identity.to_json()), "dtype": self.dtype, "dim": self.identity.dim,
                "buckets": self.buckets, "format_version": FORMAT_VERSION}
        with self._fs.open_output_stream(meta_path) as fh:
            fh.write(json.dumps(meta, indent=2, sort_keys=True).encode())
        return self

    def bucket_dir(self, bucket: int) -> str:
        return f"{self._path}/b={bucket:03d}"

    def files(self, bucket: int) -> list[str]:
        infos = self._fs.get_file_info(pafs.FileSelector(self.bucket_dir(bucket), allow_not_found=True))
        return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                      and not i.base_name.startswith((".", "_")))

    # ---- reading --------------------------------------------------------------------------
    def read_bucket(self, bucket: int, hashes: pa.Array | None = None) -> pa.Table:
        """(text_hash, emb) rows of one bucket, only those in `hashes` when given; each hash once."""
        empty = pa.table({"text_hash": pa.array([], pa.string()), "emb": pa.array([], self.type)})
        files = self.files(bucket)
        if not files or (hashes is not None and len(hashes) == 0):
            return empty
        import pyarrow.dataset as pads

        dataset = pads.dataset(files, filesystem=self._fs, format="parquet")
        wanted = None if hashes is None else pc.field("text_hash").isin(hashes)
        table = dataset.to_table(columns=["text_hash", "emb"], filter=wanted)
        if table.schema.field("emb").type != self.type:
            raise ModelError(f"embedding cache {self.uri}: a part file holds {table.schema.field('emb').type}, "
                             f"expected {self.type}")
        if table.num_rows == 0:
            return empty
        unique = pc.unique(table.column("text_hash"))
        if len(unique) < table.num_rows:  # the same text written by two runs: keep the first row
            table = table.take(pc.index_in(unique, value_set=table.column("text_hash")))
        return table.combine_chunks()

    def hashes(self, bucket: int) -> list[str]:
        """Every hash stored in one bucket (the hash column only: 32 bytes a text)."""
        files = self.files(bucket)
        if not files:
            return []
        import pyarrow.dataset as pads

        column = pads.dataset(files, filesystem=self._fs, format="parquet").to_table(columns=["text_hash"])
        return pc.unique(column.column("text_hash")).to_pylist() if column.num_rows else []

    def lookup(self, hashes: Sequence[str]) -> pa.Table:
        """(text_hash, emb) for those of `hashes` that are cached (any order; each once)."""
        by_bucket: dict[int, list[str]] = {}
        for h in dict.fromkeys(hashes):
            by_bucket.setdefault(bucket_of(h, self.buckets), []).append(h)
        parts = [self.read_bucket(b, pa.array(hs, pa.string())) for b, hs in sorted(by_bucket.items())]
        if not parts:
            return pa.table({"text_hash": pa.array([], pa.string()), "emb": pa.array([], self.type)})
        return pa.concat_tables(parts)

    def get(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Embeddings of `texts` (float32, zeros where missing) and a found mask: for callers
        outside Ray, such as a service that replays its decision log."""
        hashes = [text_hash(t) for t in texts]
        found = self.lookup(hashes)
        out = np.zeros((len(texts), self.identity.dim), np.float32)
        mask = np.zeros(len(texts), bool)
        if found.num_rows:
            idx = pc.index_in(pa.array(hashes, pa.string()), value_set=found.column("text_hash"))
            mask = idx.is_valid().to_numpy(zero_copy_only=False)
            rows = idx.filter(idx.is_valid())
            out[mask] = emb_matrix(found.column("emb").take(rows), self.identity.dim)
        return out, mask

    # ---- writing --------------------------------------------------------------------------
    def put(self, hashes: pa.Array | Sequence[str], emb: pa.Array | np.ndarray, run: str | None = None) -> int:
        """Add rows; one new file per bucket touched. Returns the rows written."""
        hashes = hashes if isinstance(hashes, pa.Array) else pa.array(list(hashes), pa.string())
        if isinstance(emb, np.ndarray):
            if emb.ndim != 2 or emb.shape[1] != self.identity.dim:
                raise ModelError(f"embedding cache {self.uri}: expected (n, {self.identity.dim}) vectors, got {emb.shape}")
            emb = emb_array(emb, self.dtype)
        if emb.type != self.type:
            raise ModelError(f"embedding cache {self.uri}: expected {self.type}, got {emb.type}")
        if len(hashes) != len(emb):
            raise ValueError("hashes and embeddings differ in length")
        if len(hashes) == 0:
            return 0
        run = run or uuid.uuid4().hex[:12]
        buckets = np.array([bucket_of(h, self.buckets) for h in hashes.to_pylist()])
        schema = pa.schema([("text_hash", pa.string()), ("emb", self.type)],
                           metadata={ENCODER_KEY: self.identity.to_json().encode(),
                                     b"harnessrl.dtype": self.dtype.encode()})
        for bucket in np.unique(buckets):
            rows = pa.array(np.flatnonzero(buckets == bucket))
            part = pa.Table.from_arrays([hashes.take(rows), emb.take(rows)], schema=schema)
            key = hashlib.blake2b("".join(part.column("text_hash").to_pylist()).encode(), digest_size=6).hexdigest()
            self._write(self.bucket_dir(int(bucket)), f"part-{run}-{key}.parquet", part)
        return len(hashes)

    def _write(self, folder: str, name: str, table: pa.Table) -> None:
        self._fs.create_dir(folder, recursive=True)
        final = f"{folder}/{name}"
        if isinstance(self._fs, pafs.LocalFileSystem):  # readers never see a half-written file
            tmp = f"{folder}/.{name}.{uuid.uuid4().hex[:6]}.tmp"
            pq.write_table(table, tmp, filesystem=self._fs, compression="zstd")
            self._fs.move(tmp, final)
        else:  # an S3 object appears whole or not at all
            pq.write_table(table, final, filesystem=self._fs, compression="zstd")

    def stats(self) -> dict:
        files = [f for b in range(self.buckets) for f in self.files(b)]
        rows = sum(pq.ParquetFile(f, filesystem=self._fs).metadata.num_rows for f in files)
        return {"uri": self.uri, "files": len(files), "rows": rows}
