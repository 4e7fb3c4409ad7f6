"""Encode stage: transitions -> encoded transitions with fixed-size embedding columns, on Ray Data.

One streaming pass finds, encodes and stores every distinct text; a second attaches the
vectors to the transition rows:

  read transitions -> scan tasks: each block's distinct texts (content hash, length, cache
     bucket), claimed against a run-wide claim table (`_Registry` actors, sharded by bucket):
     a text goes on only from the first block that presents it, and not at all when the
     persistent cache holds it (looked up per bucket, hash column only)
  -> blocks of `block_texts` texts -> encoder actor pool (one model load per actor, CPU or
     GPU, fp16 on GPU): each block sorted by length and cut into batches of a fixed token
     budget, so short texts are not padded to long ones -> `_texts/` (text_hash, emb, bucket)
  -> with a cache: per bucket, copy the cached vectors into `_texts/` and add the new ones to
     the cache (one file per bucket per run)
  -> attach tasks, one per transitions file: its rows, a batch at a time, + the sorted `_texts`
     index (object store, zero-copy) -> `data/part-NNNNN.parquet` (+ state_emb, action_emb,
     next_state_emb, candidate_emb), written as they go

Both passes read the transitions files themselves, in batches, and the attach writes its
own files: memory follows a batch per task in flight, not the corpus (Ray's Parquet reader
bundled files into tasks whose worker heap grew with the corpus, and its writer holds every
block of a task until it writes).

No shuffle: memory follows the distinct texts, not the rows, and a small machine does not
pay for an all-to-all exchange. Each distinct text is encoded at most once per run. The
encoder identity is derived from the model's files on the driver, checked by every actor
against the model it loaded, written beside the data (`_dataset.json`) and into the Parquet
schema, and checked by whatever consumes the embeddings (`check_identity`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from harnessrl import console, schemas, storage
from harnessrl.config import EncoderConfig
from harnessrl.embedding_cache import BUCKETS, EmbeddingCache, bucket_of, emb_array, emb_matrix
from harnessrl.encoders import EncoderIdentity, cpu_has_native_bf16, encoder_identity, load_encoder, text_hash
from harnessrl.errors import ConfigError, DataError, ModelError
from harnessrl.ray_runtime import object_store_budget
from harnessrl.transitions import untaken_candidates

log = logging.getLogger(__name__)
DATASET_META = "_dataset.json"
TEXT_COLUMNS = list(schemas.EMBEDDING_COLUMNS)
TASK_CPUS = 0.5  # the stage's own tasks (scan, cache finish, attach)
ACTOR_MEMORY = 1 << 30  # per encoder actor, for sizing the pool (MiniLM on CPU measured ~650 MB)
ENCODER_KEY = b"harnessrl.encoder"
SCAN_MEMORY = 512 << 20  # logical reservation of a scan task (one block of transitions)
SCAN_ROWS = 8192  # transitions per scan batch, read straight from the file
ATTACH_ROWS = 4096  # transitions per attach batch (and row group of the output)
# Up to this many transitions the driver attaches them itself: 5k take ~1.2 s there, against
# ~4.5 s as tasks on 2 CPUs (new workers start and import, each for one small file).
DRIVER_ATTACH_ROWS = 20_000


@dataclass
class EncodeResult:
    out_dir: str
    rows: int
    texts_total: int
    texts_distinct: int
    actors: int
    seconds: float
    encoder: dict
    texts_cached: int = 0
    texts_encoded: int = 0
    min_actors: int = 0
    cpus_per_actor: float = 0.0
    gpus_per_actor: float = 0.0
    cache: str | None = None
    driver_peak_rss_mb: float = 0.0
    phases: dict = field(default_factory=dict)  # seconds: setup, texts (scan .. encode .. write), attach

    def summary(self) -> dict:
        return asdict(self)


# ---- pool sizing ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolPlan:
    """Where the encoder actors run; computed from the configuration and the cluster's resources."""

    min_actors: int
    max_actors: int
    cpus_per_actor: float
    gpus_per_actor: float
    threads: int
    device: str
    half: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    def map_kwargs(self, block_texts: int) -> dict:
        """The `map_batches` arguments that place the actor pool: each call gets one block (of at
        most `block_texts` texts); Ray Data refuses GPU actors without an explicit batch size, so
        GPU pools get `block_texts` (small blocks are then bundled up to it)."""
        import ray

        # (Ray Data places pool actors with its default SPREAD strategy: on a cluster the encoders go
        # to different nodes before doubling up; tests/test_cluster_jobs.py checks it.)
        kwargs: dict = {"compute": ray.data.ActorPoolStrategy(min_size=self.min_actors, max_size=self.max_actors),
                        "num_cpus": self.cpus_per_actor, "batch_size": None}
        if self.gpus_per_actor:
            kwargs.update(num_gpus=self.gpus_per_actor, batch_size=block_texts)
        return kwargs


def cpu_budget(cpus: float) -> float:
    """CPUs the encoder actors may reserve on a node of `cpus` CPUs: all but one, which the
    stage's read, map and write tasks need (Ray Data's ListFiles and read tasks take 1 CPU: a
    pool that leaves less on every node starves them and hangs, e.g. two 1-CPU actors on 2
    CPUs, or 1.25-CPU actors on 2-CPU nodes), and at least half."""
    return max(cpus - 1.0, cpus / 2.0)


def _node_list(resources: dict, node_cpus: float | None, nodes: list[dict] | None) -> list[tuple[float, float]]:
    """(CPUs, GPUs) per node: from `nodes` (per-node resource dicts, as `ray.nodes()` gives),
    else `resources` split into nodes of `node_cpus` CPUs, else one node."""
    if nodes:
        found = [(float(n.get("CPU", 0)), float(n.get("GPU", 0))) for n in nodes]
        found = [n for n in found if n[0] > 0]
        if found:
            return found
    cpus, gpus = float(resources.get("CPU", 0)), float(resources.get("GPU", 0))
    if node_cpus and 0 < node_cpus < cpus:
        k = max(1, round(cpus / node_cpus))
        return [(cpus / k, gpus / k)] * k
    return [(cpus, gpus)]


def plan_pool(cfg: EncoderConfig, resources: dict, node_cpus: float | None = None, max_blocks: int | None = None,
              actor_memory: float = ACTOR_MEMORY, nodes: list[dict] | None = None) -> PoolPlan:
    """Actor pool size, CPU share and device that fit `resources` (`ray.cluster_resources()`)
    node by node (`nodes`: per-node resource dicts; without them, nodes of `node_cpus` CPUs).

    Every actor must fit one node beside that node's read tasks (`cpu_budget` of the node, not
    of the cluster: eight 2-CPU nodes take 1-CPU actors, not 1.25-CPU ones). A configured size
    or CPU share that does not fit is reduced (with a note), never left to wait for resources;
    GPU options that the cluster cannot serve are a ConfigError."""
    cpus, gpus = float(resources.get("CPU", 0)), float(resources.get("GPU", 0))
    memory = float(resources.get("memory", 0))
    if cpus <= 0:
        raise ConfigError("the Ray cluster reports no CPUs; the encode stage needs at least one")
    gpu = cfg.gpus_per_actor > 0
    if gpu and gpus < cfg.gpus_per_actor:
        raise ConfigError(
            f"encoder.gpus_per_actor is {cfg.gpus_per_actor:g} but the Ray cluster has {gpus:g} GPU(s): "
            "set encoder.gpus_per_actor: 0 to encode on CPUs, or join a cluster with GPUs "
            "(ray start --num-gpus=N); waiting for a GPU that does not exist would hang the stage")
    node_list = _node_list(resources, node_cpus, nodes)
    budgets = [cpu_budget(c) for c, _ in node_list]
    largest = max(c for c, _ in node_list)

    def fits(share: float) -> int:
        """Actors of `share` CPUs that fit, summed over the nodes."""
        total = 0
        for (_, node_gpus), budget in zip(node_list, budgets):
            n = math.floor(budget / share + 1e-9)
            if gpu:
                n = min(n, math.floor(node_gpus / cfg.gpus_per_actor + 1e-9))
            total += n
        return total

    mem_fit = max(1, int(memory * 0.8 // actor_memory)) if memory else 1 << 30
    notes: list[str] = []
    want_min = cfg.actors or cfg.min_actors
    want_max = cfg.actors or cfg.max_actors
    share = cfg.cpus_per_actor
    if share > max(budgets):
        notes.append(f"cpus_per_actor {share:g} does not fit beside the read tasks on a {largest:g}-CPU node: "
                     f"using {max(budgets):g}")
        share = max(budgets)
    if gpu and fits(share) == 0:
        raise ConfigError(f"encoder.gpus_per_actor {cfg.gpus_per_actor:g}: no node has that many GPUs free "
                          f"beside {share:g} CPU")
    fit = max(1, min(fits(share), mem_fit))
    if want_min and want_min > fit and not gpu:
        # a fixed or minimum size that does not fit: first a smaller CPU share (down to 0.25), then fewer actors
        smaller = share
        while smaller > 0.25 and fits(smaller) < want_min:
            smaller = max(0.25, round(smaller - 0.01, 2))
        if smaller < share:
            notes.append(f"{want_min} actors x {share:g} CPU do not fit beside the read tasks on "
                         f"{len(node_list)} node(s) of {largest:g} CPU: {smaller:g} CPU each")
            share = smaller
            fit = max(1, min(fits(share), mem_fit))
    hi = want_max or fit
    if hi > fit:
        notes.append(f"{hi} actors do not fit the cluster ({cpus:g} CPU on {len(node_list)} node(s), {gpus:g} GPU, "
                     f"{memory / 2**30:.0f} GiB for Ray): using {fit}")
        hi = fit
    if max_blocks:
        hi = max(1, min(hi, max_blocks))  # no more actors than blocks of work
    lo = min(want_min or hi, hi)
    if gpu:
        threads = max(1, round(share))
    else:
        per_node = math.ceil(hi / len(node_list))  # Ray Data spreads pool actors over the nodes
        threads = max(1, int(min(largest, max(share, largest / per_node))))
    return PoolPlan(min_actors=lo, max_actors=hi, cpus_per_actor=share, gpus_per_actor=cfg.gpus_per_actor,
                    threads=threads, device="cuda" if gpu else "cpu",
                    half=gpu and cfg.precision in ("auto", "float16"), notes=tuple(notes))


def bf16_hint(device: str, precision: str, native: bool) -> str | None:
    """What the stage tells a CPU user who could encode faster: float32 is the default because
    its vectors do not depend on the batch they are computed in; bfloat16's move by up to 1e-3."""
    if device == "cpu" and precision == "float32" and native:
        return ("this CPU computes bfloat16 natively: encoder.precision: bfloat16 would encode about 2x faster "
                "(cosine to float32 0.9999+, but a text's vector then moves with its batch by up to 1e-3)")
    return None


def pool_size(cfg: EncoderConfig) -> int:
    """Largest encoder pool the connected cluster takes for `cfg`."""
    import ray

    return plan_pool(cfg, ray.cluster_resources(), nodes=_nodes()).max_actors


def _nodes() -> list[dict]:
    """Resources of each alive node."""
    import ray

    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


# ---- length-aware batching -----------------------------------------------------------------
def length_batches(lengths, batch_size: int, max_tokens: int, chars_per_token: float = 4.0) -> list[np.ndarray]:
    """Indices in ascending length, cut into batches whose padded size (rows x longest, in
    estimated tokens) stays within `batch_size * max_tokens`: long texts go `batch_size` at a
    time, short ones many more (at most 8x), and no text is padded to a much longer one."""
    lengths = np.asarray(lengths, dtype=np.int64)
    tokens = np.minimum(max_tokens, lengths // chars_per_token + 2).astype(np.int64)
    order = np.argsort(lengths, kind="stable")
    budget, cap = batch_size * max_tokens, 8 * batch_size
    batches, start = [], 0
    for pos in range(1, len(order) + 1):
        size = pos - start
        longest = tokens[order[pos - 1]]
        if pos == len(order):
            batches.append(order[start:pos])
        elif size >= cap or (size + 1) * max(longest, tokens[order[pos]]) > budget:
            batches.append(order[start:pos])
            start = pos
    return batches


# ---- stage steps ---------------------------------------------------------------------------
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


def _texts(batch: pa.Table, max_candidates: int, buckets: int) -> pa.Table:
    """The block's distinct texts: hash, text, length, occurrences in the block, cache bucket."""
    refs: dict[str, int] = {}
    for col in TEXT_COLUMNS:
        for text in batch.column(col).to_pylist():
            refs[text] = refs.get(text, 0) + 1
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


class _Registry:
    """The run's claim table for one shard of cache buckets (a Ray actor, no CPU reserved).

    A scan task asks it which of its block's distinct texts it should send to the encoder:
    the first block to present a hash claims it; later blocks drop it; a hash the persistent
    cache holds is claimed for a copy instead of a model call. Claims are keyed by the block's
    content, so a retried task gets its own claims back. Cached hashes are looked up in a
    sorted array per bucket, loaded once per run from that bucket's hash column only."""

    CACHED = ""

    def __init__(self, cache: EmbeddingCache | None):
        self.cache = cache
        self.owner: dict[str, str] = {}
        self.known: dict[int, np.ndarray] = {}
        self.cached: dict[int, list[str]] = {}
        self.refs: dict[str, int] = {}

    def _known(self, bucket: int) -> np.ndarray:
        if bucket not in self.known:
            hashes = self.cache.hashes(bucket) if self.cache is not None else []
            self.known[bucket] = np.sort(np.array(hashes, dtype="S32"))
        return self.known[bucket]

    def claim(self, owner: str, hashes: list[str], buckets: list[int], refs: int) -> list[bool]:
        """True for the hashes this block must encode."""
        self.refs[owner] = refs
        fresh = [i for i, h in enumerate(hashes) if h not in self.owner]
        by_bucket: dict[int, list[int]] = {}
        for i in fresh:
            by_bucket.setdefault(buckets[i], []).append(i)
        for bucket, rows in by_bucket.items():
            known = self._known(bucket)
            wanted = np.array([hashes[i] for i in rows], dtype="S32")
            hit = np.zeros(len(rows), bool)
            if len(known):
                pos = np.minimum(np.searchsorted(known, wanted), len(known) - 1)
                hit = known[pos] == wanted
            for i, cached in zip(rows, hit.tolist()):
                self.owner[hashes[i]] = self.CACHED if cached else owner
                if cached:
                    self.cached.setdefault(bucket, []).append(hashes[i])
        return [self.owner[h] == owner for h in hashes]

    def counts(self) -> tuple[int, int]:
        """(distinct texts claimed so far, of them from the cache): for the progress line."""
        return len(self.owner), sum(len(v) for v in self.cached.values())

    def summary(self) -> dict:
        distinct, n_cached = self.counts()
        return {"distinct": distinct, "cached": self.cached, "n_cached": n_cached,
                "refs": sum(self.refs.values())}


def _claim(registries: list, owner: str, table: pa.Table, buckets: int) -> np.ndarray:
    """Ask each registry shard about its part of `table`; registries are actor handles (or,
    in tests, plain `_Registry` objects)."""
    hashes = table.column("text_hash").to_pylist()
    bucket_ids = table.column("bucket").to_pylist()
    refs = table.column("refs").to_numpy()
    shard = np.array(bucket_ids, np.int64) % len(registries)
    keep = np.zeros(len(hashes), bool)
    pending = []
    for k, reg in enumerate(registries):
        rows = np.flatnonzero(shard == k)
        if not len(rows):
            continue
        args = (owner, [hashes[i] for i in rows], [bucket_ids[i] for i in rows], int(refs[rows].sum()))
        if hasattr(reg.claim, "remote"):
            pending.append((rows, reg.claim.remote(*args)))
        else:
            keep[rows] = reg.claim(*args)
    if pending:
        import ray

        for rows, answer in zip([r for r, _ in pending], ray.get([ref for _, ref in pending])):
            keep[rows] = answer
    return keep


def _scan(batch: pa.Table, registries: list, max_candidates: int, buckets: int, block_texts: int):
    """Transition rows -> the texts this block must encode (first seen in the run, not in the
    cache), in blocks of at most `block_texts`, longest first. Blocks are not sorted by length
    across the run (that needs a barrier); each actor sorts its block (`length_batches`), which
    with blocks much larger than a batch pads as little as a global sort. Longest first within
    a scan batch makes the run end on its cheapest blocks, so the actors finish together
    (a last block of long texts kept one actor busy ~5 s alone)."""
    distinct = _texts(batch, max_candidates, buckets)
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


def _scan_files(files: pa.Table, transitions_dir: str, registries: list, max_candidates: int, buckets: int,
                block_texts: int, progress=None):
    """`_scan` over transitions files (one task per file, read in batches of SCAN_ROWS)."""
    for path in files.column("path").to_pylist():
        for rows in _file_batches(transitions_dir, path, [*TEXT_COLUMNS, "candidates"], SCAN_ROWS):
            yield from _scan(rows, registries, max_candidates, buckets, block_texts)
        if progress is not None:
            progress.scanned.remote()


class _Encoder:
    """One model load per actor: at start, or at its first text when a cache may answer
    everything (then a fully cached run loads no model at all)."""

    def __init__(self, cfg: EncoderConfig, plan: PoolPlan, identity: str, eager: bool, progress=None):
        import torch

        torch.set_num_threads(plan.threads)
        self.cfg, self.plan, self.progress = cfg, plan, progress
        self.identity = EncoderIdentity.from_json(identity)
        self.model = None
        self.texts_encoded = 0
        if eager:
            self._load()

    def _load(self) -> None:
        # the precision of the run's identity (the driver's), not this actor's configuration: one run, one precision
        model, identity = load_encoder(self.cfg.model, self.plan.device, self.cfg.max_seq_length,
                                       self.identity.precision)
        if self.plan.half:
            model.half()
        self.identity.check_same(identity, f"encoder actor ({self.plan.device})")
        self.model = model

    def encode(self, texts: list[str]) -> np.ndarray:
        if self.model is None:
            self._load()
        out = np.empty((len(texts), self.identity.dim), np.float32)
        for idx in length_batches([len(t) for t in texts], self.cfg.batch_size, self.identity.max_seq_length):
            out[idx] = self.model.encode([texts[i] for i in idx], batch_size=len(idx), convert_to_numpy=True,
                                         show_progress_bar=False)
        self.texts_encoded += len(texts)
        if self.progress is not None:
            self.progress.encoded.remote(len(texts))
        return out

    def __call__(self, block: pa.Table) -> pa.Table:
        emb = self.encode(block.column("text").to_pylist())
        return pa.table({"text_hash": block.column("text_hash"), "emb": emb_array(emb, self.cfg.dtype),
                         "bucket": block.column("bucket"), "cached": pa.array(np.zeros(block.num_rows, bool))})


def _finish_bucket(bucket: int, cached: list[str], cache: EmbeddingCache, texts_dir: str, run_id: str) -> tuple[int, int]:
    """After the encoder pool: copy the bucket's cached vectors into `_texts`, and add the
    bucket's new vectors to the cache (one file per bucket per run). Returns (copied, added)."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    fs, path = storage.filesystem(texts_dir)
    files = [f for f in storage_files(fs, path) if not f.rsplit("/", 1)[-1].startswith("cached-")]
    added = 0
    if files:
        new = pads.dataset(files, filesystem=fs, format="parquet").to_table(
            columns=["text_hash", "emb"], filter=pc.field("bucket") == bucket)
        if new.num_rows:
            added = cache.put(new.column("text_hash").combine_chunks(), new.column("emb").combine_chunks(), run=run_id)
    copied = 0
    if cached:
        found = cache.read_bucket(bucket, pa.array(cached, pa.string()))
        if found.num_rows != len(set(cached)):
            raise ModelError(f"embedding cache {cache.uri}: bucket {bucket} lost {len(set(cached)) - found.num_rows} "
                             "vector(s) during the run")
        out = pa.table({"text_hash": found.column("text_hash"), "emb": found.column("emb"),
                        "bucket": pa.array(np.full(found.num_rows, bucket, np.int32)),
                        "cached": pa.array(np.ones(found.num_rows, bool))})
        fs.create_dir(path, recursive=True)
        pq.write_table(out, f"{path}/cached-b{bucket:03d}.parquet", filesystem=fs, compression="zstd")
        copied = found.num_rows
    return copied, added


def storage_files(fs, path: str) -> list[str]:
    import pyarrow.fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet"))


def _attach(batch: pa.Table, keys: np.ndarray, matrix: np.ndarray, max_candidates: int, schema_meta: dict
            ) -> pa.Table:
    """Transition rows + state_emb, action_emb, next_state_emb, candidate_emb (a list per row:
    the untaken candidates' vectors), by text hash against the run's sorted distinct-text index."""
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
    for text_col, emb_col in schemas.EMBEDDING_COLUMNS.items():
        batch = batch.append_column(emb_col, emb_array(matrix[rows(batch.column(text_col).to_pylist())], dtype))
    actions = batch.column("action_text").to_pylist()
    untaken = _untaken(actions, batch.column("candidates").to_pylist() if max_candidates else actions, max_candidates)
    counts = np.array([len(u) for u in untaken], np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    flat = matrix[rows([t for u in untaken for t in u])].reshape(-1, matrix.shape[1])
    batch = batch.append_column("candidate_emb", pa.ListArray.from_arrays(pa.array(offsets), emb_array(flat, dtype)))
    if "candidate_features" in batch.column_names:
        # candidate_features follow the untaken candidates' order: keep the same prefix
        col = batch.schema.get_field_index("candidate_features")
        batch = batch.set_column(col, "candidate_features", _list_prefix(batch.column(col), counts))
    return batch.replace_schema_metadata({**(batch.schema.metadata or {}), **schema_meta})


def _attach_file(path: str, part: int, transitions_dir: str, data_dir: str, index: tuple[np.ndarray, np.ndarray],
                 max_candidates: int, schema_meta: dict) -> int:
    """One transitions file -> its encoded file (`part-NNNNN.parquet`, same rows and order), read,
    attached and written ATTACH_ROWS at a time: a task holds one batch, whatever the file's size.
    A retried task rewrites the same file. Returns the rows written."""
    import pyarrow.parquet as pq

    keys, matrix = index
    fs, out = storage.filesystem(data_dir)
    writer, n = None, 0
    try:
        for rows in _file_batches(transitions_dir, path, None, ATTACH_ROWS):
            batch = _attach(rows, keys, matrix, max_candidates, schema_meta)
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
               max_candidates: int, schema_meta: dict, in_driver: bool) -> int:
    """Every transitions file -> its encoded file; returns the rows written. A small corpus is
    attached here, file after file; a large one by one plain Ray task per file, all submitted at
    once (not a Ray Data execution: nothing flows between tasks, and its start-up was 3 s of the
    phase's 4.6 s on the example corpus), the index resolved zero-copy from the object store."""
    import ray

    fs, path = storage.filesystem(data_dir)
    fs.create_dir(path, recursive=True)
    if in_driver:
        return sum(_attach_file(f, k, transitions_dir, data_dir, index, max_candidates, schema_meta)
                   for k, f in enumerate(files))
    shared = ray.put(index)
    attach = ray.remote(num_cpus=TASK_CPUS)(_attach_file)
    return sum(ray.get([attach.remote(f, k, transitions_dir, data_dir, shared, max_candidates, schema_meta)
                        for k, f in enumerate(files)]))


def _index(texts_dir: str, dtype: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The run's distinct texts as (sorted 32-byte hex keys, matrix in the same order)."""
    import pyarrow.dataset as pads

    fs, path = storage.filesystem(texts_dir)
    files = storage_files(fs, path)
    if not files:
        return np.array([], dtype="S32"), np.zeros((0, dim), np.float16 if dtype == "float16" else np.float32)
    table = pads.dataset(files, filesystem=fs, format="parquet").to_table(columns=["text_hash", "emb"])
    keys = np.array(table.column("text_hash").to_pylist(), dtype="S32")
    order = np.argsort(keys, kind="stable")
    return keys[order], emb_matrix(table.column("emb"), dim)[order]


# ---- identity of an encoded dataset ----------------------------------------------------------
def read_identity(encoded_dir: str) -> EncoderIdentity:
    fs, path = storage.filesystem(storage.join(encoded_dir, DATASET_META))
    with fs.open_input_stream(path) as fh:
        return EncoderIdentity.from_json(json.loads(fh.read())["encoder"])


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


# ---- progress -----------------------------------------------------------------------------------
PROGRESS_SECONDS = 30.0  # between progress lines while texts are encoded


class _Progress:
    """The run's counters for the driver's progress line (a Ray actor, no CPU reserved): input
    files scanned and texts encoded so far."""

    def __init__(self):
        self.files, self.texts = 0, 0

    def scanned(self) -> None:
        self.files += 1

    def encoded(self, n: int) -> None:
        self.texts += n

    def snapshot(self) -> tuple[int, int]:
        return self.files, self.texts


def progress_line(encoded: int, to_encode: int, files_done: int, files: int, seconds: float) -> str:
    """What the stage has done so far. Until every file is scanned the total is not known yet,
    so there is no share and no time left."""
    rate = encoded / seconds if seconds > 0 else 0.0
    if files_done < files:
        return (f"encode: {encoded:,} texts encoded of {to_encode:,} found so far (scanned {files_done}/{files} "
                f"files), {rate:.0f} texts/s")
    left = max(to_encode - encoded, 0)
    eta = f", about {_duration(left / rate)} left" if rate > 0 and left else ""
    return (f"encode: {encoded:,} of {to_encode:,} texts encoded ({encoded / max(to_encode, 1):.0%}), "
            f"{rate:.0f} texts/s{eta}")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class _ProgressLog:
    """Logs `progress_line` every `every` seconds from a driver thread while the texts are
    encoded (the stage's long phase: minutes to hours on a large corpus)."""

    def __init__(self, progress, registries: list, files: int, every: float | None):
        self.progress, self.registries, self.files, self.every = progress, registries, files, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="encode-progress")
        self._start = time.time()

    def _run(self) -> None:
        import ray

        every = min(self.every, 2.0) if console.bars_on() else self.every  # a bar moves more often than a line
        while not self._stop.wait(every):
            try:
                files_done, encoded = ray.get(self.progress.snapshot.remote(), timeout=10)
                counts = ray.get([r.counts.remote() for r in self.registries], timeout=10)
            except Exception:  # a late or failed poll only skips a line
                continue
            to_encode = sum(d - c for d, c in counts)
            total = to_encode if files_done >= self.files else None  # known once every file is scanned
            log.info("%s", progress_line(encoded, to_encode, files_done, self.files, time.time() - self._start),
                     extra=console.progress("encode", encoded, total, "texts"))

    def __enter__(self):
        if self.progress is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)


# ---- the stage --------------------------------------------------------------------------------
class _PeakRss:
    """Peak resident memory of this process while the stage runs (sampled every 0.1 s)."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def now() -> int:
        try:
            with open("/proc/self/statm") as fh:
                import os

                return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    def _run(self):
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self.now())

    def __enter__(self):
        self.peak = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=1)
        self.peak = max(self.peak, self.now())


def _count_rows(transitions_dir: str) -> int:
    import pyarrow.dataset as pads

    fs, path = storage.filesystem(transitions_dir)
    try:
        return pads.dataset(path, filesystem=fs, format="parquet").count_rows()
    except (OSError, FileNotFoundError) as exc:
        raise DataError(f"no transitions at {transitions_dir}: {exc}") from None


def registry_shards(cpus: float, buckets: int) -> int:
    """Claim-table actors: one on a small cluster, one per 16 CPUs on a large one."""
    return max(1, min(buckets, int(cpus // 16)))


def encode(transitions_dir: str, out_dir: str, cfg: EncoderConfig,
           progress_every: float | None = PROGRESS_SECONDS) -> EncodeResult:
    """Encode every distinct text of the transitions once and write them with their embeddings;
    logs a progress line every `progress_every` seconds (None: none) while texts are encoded."""
    import ray

    start = time.time()
    with _PeakRss() as rss:
        # from the model's files: no weights loaded here
        identity = encoder_identity(cfg.model, cfg.max_seq_length, cfg.identity_precision)
        cache = EmbeddingCache(cfg.cache, identity, cfg.dtype) if cfg.cache else None
        eager = cache is None or not cache.exists()  # a cache may answer everything: then load lazily
        if cache is not None:
            cache.open()
        rows = _count_rows(transitions_dir)
        files = _input_files(transitions_dir)
        if rows == 0:
            raise DataError(f"no transitions at {transitions_dir}: nothing to encode")
        resources = ray.cluster_resources()
        plan = plan_pool(cfg, resources, nodes=_nodes(),
                         max_blocks=math.ceil(rows * (3 + cfg.max_candidates) / cfg.block_texts))
        for note in plan.notes:
            log.warning("encode: %s", note)
        hint = bf16_hint(plan.device, identity.precision, cpu_has_native_bf16())
        if hint:
            log.info("encode: %s", hint)
        buckets = cache.buckets if cache is not None else BUCKETS
        log.info("encode: %d transitions; %d-%d %s encoder actor(s) x %g CPU%s, %d thread(s) each%s", rows,
                 plan.min_actors, plan.max_actors, plan.device, plan.cpus_per_actor,
                 f" + {plan.gpus_per_actor:g} GPU" if plan.gpus_per_actor else "", plan.threads,
                 f"; cache {cache.uri}" if cache else "")
        phases = {"setup": time.time() - start}

        storage.reset_dir(out_dir)
        emb_dir = storage.join(out_dir, "_texts")
        run_id = uuid.uuid4().hex[:12]
        registry = ray.remote(num_cpus=0, max_restarts=0)(_Registry)
        registries = [registry.remote(cache) for _ in range(registry_shards(float(resources.get("CPU", 1)), buckets))]
        progress = ray.remote(num_cpus=0, max_restarts=0)(_Progress).remote() if progress_every else None
        try:
            # Each scan task reads one transitions file in batches (pyarrow, no Ray read operator: Ray's
            # reader bundles files and its worker's heap grew with the corpus) and yields only the texts
            # to encode; `memory` keeps Ray from fusing the scan into the encoder actors (same CPU
            # share): fused, the pool would get one task per file instead of one per block of texts.
            # the object-store budget is set before the dataset is made
            with object_store_budget(), _ProgressLog(progress, registries, len(files), progress_every):
                by_file = ray.data.from_items([{"path": f} for f in files], override_num_blocks=len(files))
                new_texts = by_file.map_batches(
                    _scan_files, batch_format="pyarrow", batch_size=1, num_cpus=TASK_CPUS, memory=SCAN_MEMORY,
                    fn_kwargs={"transitions_dir": transitions_dir, "registries": registries,
                               "max_candidates": cfg.max_candidates, "buckets": buckets, "block_texts": cfg.block_texts,
                               "progress": progress})
                # a task's outputs are merged into one block: cut them again, so that the pool's
                # unit of work is `block_texts` texts of similar length, not one input file
                new_texts = new_texts.repartition(target_num_rows_per_block=cfg.block_texts)
                new_texts.map_batches(
                    _Encoder, batch_format="pyarrow",
                    fn_constructor_kwargs={"cfg": cfg, "plan": plan, "identity": identity.to_json(), "eager": eager,
                                           "progress": progress},
                    **plan.map_kwargs(cfg.block_texts),
                ).write_parquet(emb_dir, compression="zstd")
            summaries = ray.get([r.summary.remote() for r in registries])
        finally:
            for r in [*registries, progress]:
                if r is not None:
                    ray.kill(r)
        n_distinct = sum(x["distinct"] for x in summaries)
        n_cached = sum(x["n_cached"] for x in summaries)
        texts_total = sum(x["refs"] for x in summaries)
        if cache is not None:
            cached = {b: h for x in summaries for b, h in x["cached"].items()}
            finish = ray.remote(num_cpus=TASK_CPUS)(_finish_bucket)
            ray.get([finish.remote(b, cached.get(b, []), cache, emb_dir, run_id) for b in range(buckets)])
        phases["texts"] = time.time() - start

        keys, matrix = _index(emb_dir, cfg.dtype, identity.dim)
        if len(keys) != n_distinct:
            raise DataError(f"encode: {n_distinct} distinct texts but {len(keys)} vectors under {emb_dir}")
        schema_meta = {ENCODER_KEY: identity.to_json().encode(), b"harnessrl.embedding_dtype": cfg.dtype.encode()}
        data_dir = storage.join(out_dir, "data")
        written = attach_all(files, transitions_dir, data_dir, (keys, matrix), cfg.max_candidates, schema_meta,
                             in_driver=rows <= DRIVER_ATTACH_ROWS)
        if written != rows:
            raise DataError(f"encode: {rows} transitions but {written} written to {data_dir}")
        phases["attach"] = time.time() - start - phases["texts"]

        meta = {"encoder": json.loads(identity.to_json()), "encoder_digest": identity.digest(), "rows": rows,
                "texts_total": texts_total, "texts_distinct": n_distinct, "texts_cached": n_cached,
                "texts_encoded": n_distinct - n_cached, "dtype": cfg.dtype, "cache": cache.uri if cache else None,
                "schema_version": schemas.SCHEMA_VERSION}
        fs, path = storage.filesystem(storage.join(out_dir, DATASET_META))
        with fs.open_output_stream(path) as fh:
            fh.write(json.dumps(meta, indent=2, sort_keys=True).encode())
    result = EncodeResult(out_dir, rows, texts_total, n_distinct, plan.max_actors, time.time() - start, meta["encoder"],
                          texts_cached=n_cached, texts_encoded=n_distinct - n_cached, min_actors=plan.min_actors,
                          cpus_per_actor=plan.cpus_per_actor, gpus_per_actor=plan.gpus_per_actor,
                          cache=cache.uri if cache else None, driver_peak_rss_mb=round(rss.peak / 2**20, 1),
                          phases={"setup": round(phases["setup"], 2),
                                  "texts": round(phases["texts"] - phases["setup"], 2),
                                  "attach": round(phases["attach"], 2)})
    log.info("encode: %d texts, %d distinct (%d from the cache, %d encoded) in %.1f s (%.0f distinct texts/s "
             "end to end; %s)", texts_total, n_distinct, n_cached, n_distinct - n_cached, result.seconds,
             n_distinct / max(result.seconds, 1e-9), result.phases)
    return result
