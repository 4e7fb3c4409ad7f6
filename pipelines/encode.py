"""Encode stage: transitions -> encoded transitions with fixed-size embedding columns, on Ray Data.

One streaming pass finds, encodes and stores every distinct text, a second attaches the
vectors to the transition rows:

  read transitions -> per block: distinct texts (content hash, length, occurrences, cache bucket)
  -> hash-partition by bucket -> per partition: global dedupe, persistent-cache lookup for the
     buckets it holds, length sort, cut into blocks of `block_texts` (one bucket, one length band)
  -> encoder actor pool (one model load per actor, CPU or GPU, fp16 on GPU): texts in ascending
     length, cut into batches of a fixed token budget, so short texts are not padded to long ones;
     new vectors are added to the cache -> `_texts/` (text_hash, emb, refs, cached)
  -> attach: transitions + `_texts` -> `data/` (+ state_emb, action_emb, next_state_emb, candidate_emb)

Each distinct text is encoded at most once per run, and not at all when the cache has it. The
encoder identity is derived from the model's files on the driver, checked by every actor against
the model it loaded, written beside the data (`_dataset.json`) and into the Parquet schema,
and checked by whatever consumes the embeddings (`check_identity`).
"""

from __future__ import annotations

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

from harnessrl import schemas, storage
from harnessrl.config import EncoderConfig
from harnessrl.embedding_cache import BUCKETS, EmbeddingCache, bucket_of, emb_array, emb_matrix, emb_type
from harnessrl.encoders import EncoderIdentity, encoder_identity, load_encoder, text_hash
from harnessrl.errors import ConfigError, DataError, ModelError
from harnessrl.ray_runtime import shuffle_partitions
from harnessrl.transitions import untaken_candidates

log = logging.getLogger(__name__)
DATASET_META = "_dataset.json"
TEXT_COLUMNS = list(schemas.EMBEDDING_COLUMNS)
TASK_CPUS = 0.5  # the stage's own map tasks (scan, resolve, attach)
ACTOR_MEMORY = 1 << 30  # per encoder actor, for sizing the pool (MiniLM on CPU measured ~650 MB)
ENCODER_KEY = b"harnessrl.encoder"


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

    def map_kwargs(self) -> dict:
        """The `map_batches` arguments that place the actor pool."""
        import ray

        kwargs: dict = {"compute": ray.data.ActorPoolStrategy(min_size=self.min_actors, max_size=self.max_actors),
                        "num_cpus": self.cpus_per_actor}
        if self.gpus_per_actor:
            kwargs["num_gpus"] = self.gpus_per_actor
        return kwargs


def cpu_budget(cpus: float) -> float:
    """CPUs an actor pool may reserve: all but one, which the stage's read, map and write tasks
    need (a pool that takes every CPU starves the reads and hangs: two 1-CPU actors on 2 CPUs),
    and at least half."""
    return max(cpus - 1.0, cpus / 2.0)


def plan_pool(cfg: EncoderConfig, resources: dict, node_cpus: float | None = None, max_blocks: int | None = None,
              actor_memory: float = ACTOR_MEMORY) -> PoolPlan:
    """Actor pool size, CPU share and device that fit `resources` (`ray.cluster_resources()`).

    A configured size or CPU share that does not fit is reduced (with a note), never left to wait
    for resources; GPU options that the cluster cannot serve are a ConfigError."""
    cpus, gpus = float(resources.get("CPU", 0)), float(resources.get("GPU", 0))
    memory = float(resources.get("memory", 0))
    node_cpus = float(node_cpus or cpus)
    if cpus <= 0:
        raise ConfigError("the Ray cluster reports no CPUs; the encode stage needs at least one")
    gpu = cfg.gpus_per_actor > 0
    if gpu and gpus < cfg.gpus_per_actor:
        raise ConfigError(
            f"encoder.gpus_per_actor is {cfg.gpus_per_actor:g} but the Ray cluster has {gpus:g} GPU(s): "
            "set encoder.gpus_per_actor: 0 to encode on CPUs, or join a cluster with GPUs "
            "(ray start --num-gpus=N); waiting for a GPU that does not exist would hang the stage")
    notes: list[str] = []
    budget = cpu_budget(cpus)
    want_min = cfg.actors or cfg.min_actors
    want_max = cfg.actors or cfg.max_actors
    share = cfg.cpus_per_actor
    if share > budget:
        notes.append(f"cpus_per_actor {share:g} does not fit beside the read tasks on a {cpus:g}-CPU cluster: "
                     f"using {budget:g}")
        share = budget
    fit = math.floor(budget / share + 1e-9)
    if gpu:
        fit = min(fit, math.floor(gpus / cfg.gpus_per_actor + 1e-9))
    if memory:
        fit = min(fit, max(1, int(memory * 0.8 // actor_memory)))
    fit = max(1, fit)
    if want_min and want_min > fit and not gpu:
        # a fixed or minimum size that does not fit: first a smaller CPU share (down to 0.25), then fewer actors
        smaller = max(0.25, math.floor(budget / want_min * 100) / 100)
        if smaller < share:
            notes.append(f"{want_min} actors x {share:g} CPU do not fit beside the read tasks on a {cpus:g}-CPU "
                         f"cluster: {smaller:g} CPU each")
            share = smaller
            fit = max(1, min(math.floor(budget / share + 1e-9),
                             max(1, int(memory * 0.8 // actor_memory)) if memory else 1 << 30))
    hi = want_max or fit
    if hi > fit:
        notes.append(f"{hi} actors do not fit the cluster ({cpus:g} CPU, {gpus:g} GPU, "
                     f"{memory / 2**30:.0f} GiB for Ray): using {fit}")
        hi = fit
    if max_blocks:
        hi = max(1, min(hi, max_blocks))  # no more actors than blocks of work
    lo = min(want_min or hi, hi)
    if gpu:
        threads = max(1, round(share))
    else:
        threads = max(1, int(min(node_cpus, max(share, node_cpus / hi))))
    return PoolPlan(min_actors=lo, max_actors=hi, cpus_per_actor=share, gpus_per_actor=cfg.gpus_per_actor,
                    threads=threads, device="cuda" if gpu else "cpu",
                    half=gpu and cfg.precision != "float32", notes=tuple(notes))


def pool_size(cfg: EncoderConfig) -> int:
    """Largest encoder pool the connected cluster takes for `cfg`."""
    import ray

    return plan_pool(cfg, ray.cluster_resources(), _node_cpus()).max_actors


def _node_cpus() -> float | None:
    import ray

    sizes = [n.get("Resources", {}).get("CPU", 0) for n in ray.nodes() if n.get("Alive")]
    return max(sizes) if sizes else None


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
def _texts(batch: pa.Table, max_candidates: int, buckets: int) -> pa.Table:
    """The block's distinct texts: hash, text, length, occurrences in the block, cache bucket."""
    refs: dict[str, int] = {}
    for col in TEXT_COLUMNS:
        for text in batch.column(col).to_pylist():
            refs[text] = refs.get(text, 0) + 1
    if max_candidates:
        for action, cands in zip(batch.column("action_text").to_pylist(), batch.column("candidates").to_pylist()):
            for text in untaken_candidates(action, cands, max_candidates):
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


def _resolve(block: pa.Table, cache: EmbeddingCache | None, block_texts: int, dim: int, dtype: str):
    """One hash partition (whole buckets): global dedupe, cache lookup, length sort, blocks of
    at most `block_texts` texts that each hold one bucket and are all cached or all new."""
    if block.num_rows == 0:
        return
    grouped = block.group_by(["text_hash"], use_threads=False).aggregate(
        [("text", "first"), ("n_chars", "first"), ("refs", "sum"), ("bucket", "first")])
    grouped = grouped.rename_columns([c.replace("_first", "").replace("_sum", "") for c in grouped.column_names])
    etype = emb_type(dim, dtype)
    for bucket in sorted(pc.unique(grouped.column("bucket")).to_pylist()):
        part = grouped.filter(pc.equal(grouped.column("bucket"), bucket))
        hashes = part.column("text_hash")
        found = cache.read_bucket(bucket, hashes.combine_chunks()) if cache is not None else None
        hit = None
        if found is not None and found.num_rows:
            idx = pc.index_in(hashes, value_set=found.column("text_hash"))
            hit = idx.is_valid()
            cached = part.filter(hit)
            yield pa.table({"text_hash": cached.column("text_hash"), "text": pa.nulls(cached.num_rows, pa.string()),
                            "n_chars": cached.column("n_chars"), "refs": cached.column("refs"),
                            "cached": pa.array(np.ones(cached.num_rows, bool)),
                            "emb": found.column("emb").take(idx.filter(hit))})
        new = part.filter(pc.invert(hit)) if hit is not None else part
        new = new.sort_by([("n_chars", "ascending")])
        for start in range(0, new.num_rows, block_texts):
            chunk = new.slice(start, block_texts)
            yield pa.table({"text_hash": chunk.column("text_hash"), "text": chunk.column("text"),
                            "n_chars": chunk.column("n_chars"), "refs": chunk.column("refs"),
                            "cached": pa.array(np.zeros(chunk.num_rows, bool)),
                            "emb": pa.nulls(chunk.num_rows, etype)})


class _Encoder:
    """One model load per actor (at start, or at the first new text when a cache may answer
    everything); cached rows pass through without a model call."""

    def __init__(self, cfg: EncoderConfig, plan: PoolPlan, identity: str, cache: EmbeddingCache | None, run_id: str,
                 eager: bool):
        import torch

        torch.set_num_threads(plan.threads)
        self.cfg, self.plan, self.cache, self.run_id = cfg, plan, cache, run_id
        self.identity = EncoderIdentity.from_json(identity)
        self.model = None
        self.texts_encoded = 0
        if eager:
            self._load()

    def _load(self) -> None:
        model, identity = load_encoder(self.cfg.model, self.plan.device, self.cfg.max_seq_length)
        if self.plan.half:
            model.half()
        self.identity.check_same(identity, f"encoder actor ({self.plan.device})")
        self.model = model

    def encode(self, texts: list[str]) -> np.ndarray:
        if self.model is None:
            self._load()
        dim = self.identity.dim
        out = np.empty((len(texts), dim), np.float32)
        for idx in length_batches([len(t) for t in texts], self.cfg.batch_size, self.identity.max_seq_length):
            out[idx] = self.model.encode([texts[i] for i in idx], batch_size=len(idx), convert_to_numpy=True,
                                         show_progress_bar=False)
        self.texts_encoded += len(texts)
        return out

    def __call__(self, block: pa.Table) -> pa.Table:
        dim, dtype = self.identity.dim, self.cfg.dtype
        cached = block.column("cached").to_numpy(zero_copy_only=False)
        emb = np.empty((block.num_rows, dim), np.float16 if dtype == "float16" else np.float32)
        if cached.any():
            emb[cached] = emb_matrix(block.column("emb").filter(pa.array(cached)), dim)
        new = np.flatnonzero(~cached)
        if len(new):
            texts = block.column("text").take(pa.array(new)).to_pylist()
            emb[new] = self.encode(texts)
            if self.cache is not None:
                self.cache.put(block.column("text_hash").take(pa.array(new)).combine_chunks(),
                               emb_array(emb[new], dtype), run=self.run_id)
        return pa.table({"text_hash": block.column("text_hash"), "emb": emb_array(emb, dtype),
                         "refs": block.column("refs"), "cached": block.column("cached")})


class _Attach:
    """Joins embeddings back onto transitions by text hash. The run's distinct-text table is
    loaded once per actor into a sorted hash array + matrix (16-byte keys, no per-text Python
    objects); `candidate_emb` holds the untaken candidates' embeddings, a list per row."""

    def __init__(self, emb_dir: str, max_candidates: int, identity: str, dtype: str):
        import pyarrow.dataset as pads

        self.max_candidates = max_candidates
        fs, path = storage.filesystem(emb_dir)
        table = pads.dataset(path, filesystem=fs, format="parquet").to_table(columns=["text_hash", "emb"])
        keys = np.array(table.column("text_hash").to_pylist(), dtype="S32")
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.matrix = table.column("emb").combine_chunks().take(pa.array(order))
        self.schema_meta = {ENCODER_KEY: identity.encode(), b"harnessrl.embedding_dtype": dtype.encode()}

    def _rows(self, texts: list[str], memo: dict[str, int]) -> list[int]:
        missing = [t for t in dict.fromkeys(texts) if t not in memo]
        if missing:
            wanted = np.array([text_hash(t) for t in missing], dtype="S32")
            pos = np.searchsorted(self.keys, wanted)
            pos = np.minimum(pos, len(self.keys) - 1)
            bad = self.keys[pos] != wanted
            if bad.any():
                raise DataError(f"encode: {int(bad.sum())} text(s) have no embedding (first: {missing[int(np.argmax(bad))][:80]!r})")
            memo.update(zip(missing, pos.tolist()))
        return [memo[t] for t in texts]

    def __call__(self, batch: pa.Table) -> pa.Table:
        memo: dict[str, int] = {}
        for text_col, emb_col in schemas.EMBEDDING_COLUMNS.items():
            idx = self._rows(batch.column(text_col).to_pylist(), memo)
            batch = batch.append_column(emb_col, self.matrix.take(pa.array(idx, pa.int64())))
        offsets, flat = [0], []
        for action, cands in zip(batch.column("action_text").to_pylist(), batch.column("candidates").to_pylist()):
            flat.extend(untaken_candidates(action, cands, self.max_candidates))
            offsets.append(len(flat))
        values = self.matrix.take(pa.array(self._rows(flat, memo), pa.int64()))
        batch = batch.append_column("candidate_emb", pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values))
        if "candidate_features" in batch.column_names:
            # candidate_features follow the same order and keep the same prefix
            kept = [f[: offsets[i + 1] - offsets[i]] for i, f in enumerate(batch.column("candidate_features").to_pylist())]
            col = batch.schema.get_field_index("candidate_features")
            batch = batch.set_column(col, "candidate_features", pa.array(kept, batch.schema.field(col).type))
        return batch.replace_schema_metadata({**(batch.schema.metadata or {}), **self.schema_meta})


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


def encode(transitions_dir: str, out_dir: str, cfg: EncoderConfig) -> EncodeResult:
    import pyarrow.dataset as pads
    import ray

    start = time.time()
    with _PeakRss() as rss:
        identity = encoder_identity(cfg.model, cfg.max_seq_length)  # from the model's files: no weights loaded here
        cache = EmbeddingCache(cfg.cache, identity, cfg.dtype) if cfg.cache else None
        eager = cache is None or not cache.exists()  # a cache may answer everything: then load lazily
        if cache is not None:
            cache.open()
        rows = _count_rows(transitions_dir)
        if rows == 0:
            raise DataError(f"no transitions at {transitions_dir}: nothing to encode")
        resources = ray.cluster_resources()
        plan = plan_pool(cfg, resources, _node_cpus(),
                         max_blocks=math.ceil(rows * (3 + cfg.max_candidates) / cfg.block_texts))
        for note in plan.notes:
            log.warning("encode: %s", note)
        buckets = cache.buckets if cache is not None else BUCKETS
        log.info("encode: %d transitions; %d-%d %s encoder actor(s) x %g CPU%s, %d thread(s) each%s", rows,
                 plan.min_actors, plan.max_actors, plan.device, plan.cpus_per_actor,
                 f" + {plan.gpus_per_actor:g} GPU" if plan.gpus_per_actor else "", plan.threads,
                 f"; cache {cache.uri}" if cache else "")

        storage.reset_dir(out_dir)
        emb_dir = storage.join(out_dir, "_texts")
        transitions = ray.data.read_parquet(transitions_dir)
        texts = transitions.select_columns([*TEXT_COLUMNS, "candidates"]).map_batches(
            _texts, batch_format="pyarrow", batch_size=None, num_cpus=TASK_CPUS,
            fn_kwargs={"max_candidates": cfg.max_candidates, "buckets": buckets})
        resolved = texts.repartition(max(1, min(buckets, shuffle_partitions())), keys=["bucket"]).map_batches(
            _resolve, batch_format="pyarrow", batch_size=None, num_cpus=TASK_CPUS,
            fn_kwargs={"cache": cache, "block_texts": cfg.block_texts, "dim": identity.dim, "dtype": cfg.dtype})
        resolved.map_batches(
            _Encoder, batch_format="pyarrow", batch_size=None,
            fn_constructor_kwargs={"cfg": cfg, "plan": plan, "identity": identity.to_json(), "cache": cache,
                                   "run_id": uuid.uuid4().hex[:12], "eager": eager},
            **plan.map_kwargs(),
        ).write_parquet(emb_dir, compression="zstd")

        fs, path = storage.filesystem(emb_dir)
        stats = pads.dataset(path, filesystem=fs, format="parquet").to_table(columns=["refs", "cached"])
        n_distinct = stats.num_rows
        texts_total = int(pc.sum(stats.column("refs")).as_py() or 0)
        n_cached = int(pc.sum(stats.column("cached").cast(pa.int64())).as_py() or 0)

        attach_max = max(1, min(4, math.floor(cpu_budget(float(resources.get("CPU", 1))) / TASK_CPUS)))
        transitions.map_batches(
            _Attach, batch_format="pyarrow",
            fn_constructor_kwargs={"emb_dir": emb_dir, "max_candidates": cfg.max_candidates,
                                   "identity": identity.to_json(), "dtype": cfg.dtype},
            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=attach_max), num_cpus=TASK_CPUS,
        ).write_parquet(storage.join(out_dir, "data"), compression="zstd")

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
                          cache=cache.uri if cache else None, driver_peak_rss_mb=round(rss.peak / 2**20, 1))
    log.info("encode: %d texts, %d distinct (%d from the cache, %d encoded) in %.1f s (%.0f distinct texts/s "
             "end to end)", texts_total, n_distinct, n_cached, n_distinct - n_cached, result.seconds,
             n_distinct / max(result.seconds, 1e-9))
    return result
