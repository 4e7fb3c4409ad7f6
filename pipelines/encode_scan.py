"""The encode stage's first pass: each transitions file, read in batches, -> the distinct texts
its rows need (state, action, next state, untaken candidates), claimed against the run's claim
table, in blocks for the encoder pool. `_untaken` and `_file_batches` are the attach's too: it
looks up the same texts in the same files."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc

from harnessrl import schemas, storage
from harnessrl.embedding_cache import bucket_of
from harnessrl.encoders import text_hash
from harnessrl.pipelines.encode_claims import _claim
from harnessrl.render import EMBEDDED_ROLES
from harnessrl.transitions import untaken_candidates

TEXT_COLUMNS = list(schemas.EMBEDDING_COLUMNS)
SCAN_MEMORY = 512 << 20  # logical reservation of a scan task (one block of transitions)
SCAN_ROWS = 8192  # transitions per scan batch, read straight from the file


def _untaken(actions: list[str], candidates: list, limit: int) -> list[list[str]]:
    """`untaken_candidates` per row, computed once per distinct (action, candidates) in the batch."""
    if not limit:
        return [[] for _ in actions]
    memo: dict[tuple, list[str]] = {}
    out = []
    for action, cands in zip(actions, candidates):
        key = (action, tuple(cands or ()))
        found = memo.get(key)
        if found is None:
            found = memo[key] = untaken_candidates(action, cands, limit)
        out.append(found)
    return out


def text_columns(state_texts: bool = True) -> list[str]:
    """The transitions' text columns the stage embeds: the action always, the rendered states unless
    the head reads segments instead (`encoder.state_texts`)."""
    return TEXT_COLUMNS if state_texts else ["action_text"]


def _texts(batch: pa.Table, max_candidates: int, buckets: int, segments: bool = False, state_texts: bool = True
           ) -> pa.Table:
    """The block's distinct texts: hash, text, length, occurrences in the block, cache bucket. With
    `segments`, the texts of the state segments the reader head embeds too (render.EMBEDDED_ROLES)."""
    refs: dict[str, int] = {}
    for col in text_columns(state_texts):
        for text in batch.column(col).to_pylist():
            refs[text] = refs.get(text, 0) + 1
    for col in schemas.SEGMENT_COLUMNS if segments else ():
        if col in batch.column_names:
            for row in batch.column(col).to_pylist():
                for seg in row or ():
                    if seg["role"] in EMBEDDED_ROLES:
                        refs[seg["text"]] = refs.get(seg["text"], 0) + 1
    actions = batch.column("action_text").to_pylist()
    for untaken in _untaken(actions, batch.column("candidates").to_pylist() if max_candidates else actions,
                            max_candidates):
        for text in untaken:
            refs[text] = refs.get(text, 0) + 1
    texts = list(refs)
    hashes = [text_hash(t) for t in texts]
    return pa.table({
        "text_hash": pa.array(hashes, pa.string()),
        "text": pa.array(texts, pa.string()),
        "n_chars": pa.array([len(t) for t in texts], pa.int32()),
        "refs": pa.array(list(refs.values()), pa.int64()),
        "bucket": pa.array([bucket_of(h, buckets) for h in hashes], pa.int32()),
    })


def _scan(batch: pa.Table, registries: list, max_candidates: int, buckets: int, block_texts: int,
          segments: bool = False, state_texts: bool = True):
    """Transition rows -> the texts this block must encode (first seen in the run, not in the
    cache), in blocks of at most `block_texts`, longest first. Blocks are not sorted by length
    across the run (that needs a barrier); each actor sorts its block (`length_batches`), which
    with blocks much larger than a batch pads as little as a global sort. Longest first within
    a scan batch makes the run end on its cheapest blocks, so the actors finish together
    (a last block of long texts kept one actor busy ~5 s alone)."""
    distinct = _texts(batch, max_candidates, buckets, segments, state_texts)
    if distinct.num_rows == 0:
        return
    owner = hashlib.blake2b("".join(distinct.column("text_hash").to_pylist()).encode(), digest_size=12).hexdigest()
    keep = _claim(registries, owner, distinct, buckets)
    new = distinct.filter(pa.array(keep))
    new = new.take(pc.sort_indices(new, sort_keys=[("n_chars", "descending")]))
    for start in range(0, new.num_rows, block_texts):
        yield new.slice(start, block_texts).select(["text_hash", "text", "n_chars", "bucket"])


def _input_files(transitions_dir: str) -> list[str]:
    import pyarrow.fs as pafs

    fs, path = storage.filesystem(transitions_dir)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                  and not i.base_name.startswith(("_", ".")))


def _file_batches(transitions_dir: str, path: str, columns: list[str] | None, rows: int):
    """One transitions file, `rows` at a time (only one batch of it in memory)."""
    import pyarrow.parquet as pq

    fs, _ = storage.filesystem(transitions_dir)
    with fs.open_input_file(path) as fh:
        for batch in pq.ParquetFile(fh).iter_batches(batch_size=rows, columns=columns):
            yield pa.Table.from_batches([batch])


def _columns(transitions_dir: str, path: str, wanted: list[str]) -> list[str]:
    """Those of `wanted` the file has (transitions from before a column was added lack it)."""
    import pyarrow.parquet as pq

    fs, _ = storage.filesystem(transitions_dir)
    with fs.open_input_file(path) as fh:
        names = set(pq.ParquetFile(fh).schema_arrow.names)
    return [c for c in wanted if c in names]


def _scan_files(files: pa.Table, transitions_dir: str, registries: list, max_candidates: int, buckets: int,
                block_texts: int, progress=None, segments: bool = False, state_texts: bool = True):
    """`_scan` over transitions files (one task per file, read in batches of SCAN_ROWS)."""
    for path in files.column("path").to_pylist():
        columns = [*text_columns(state_texts), "candidates",
                   *(_columns(transitions_dir, path, list(schemas.SEGMENT_COLUMNS)) if segments else [])]
        for rows in _file_batches(transitions_dir, path, columns, SCAN_ROWS):
            yield from _scan(rows, registries, max_candidates, buckets, block_texts, segments, state_texts)
        if progress is not None:
            progress.scanned.remote()
