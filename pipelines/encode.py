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
     index (object store, zero-copy) -> `data/part-NNNNN.parquet` (+ state_ref, action_ref,
     next_state_ref, candidate_ref: row numbers of that index, `encoder.vectors: references`; or
     the vectors themselves, state_emb ... candidate_emb, with `copies`), written as they go

Both passes read the transitions files themselves, in batches, and the attach writes its
own files: memory follows a batch per task in flight, not the corpus (Ray's Parquet reader
bundled files into tasks whose worker heap grew with the corpus, and its writer holds every
block of a task until it writes).

No shuffle: memory follows the distinct texts, not the rows, and a small machine does not
pay for an all-to-all exchange. Each distinct text is encoded at most once per run. The
encoder identity is derived from the model's files on the driver, checked by every actor
against the model it loaded, written beside the data and into the Parquet schema, and checked
by whatever consumes the embeddings (harnessrl.encoded_data: `write_meta`, `check_identity`).

The stage's parts, one module each: `encode_pool` (where the actors run), `encode_claims`
(the claim table), `encode_scan` (first pass), `encode_actor` (the encoder actor and its
length batches), `encode_attach` (second pass), `encode_progress` (the progress line); this
module runs them and writes the result.
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

from harnessrl import encoded_data, schemas, storage
from harnessrl.config import EncoderConfig
from harnessrl.embedding_cache import BUCKETS, EmbeddingCache
from harnessrl.encoders import ENCODER_KEY, cpu_has_native_bf16, encoder_identity
from harnessrl.errors import DataError, ModelError
from harnessrl.pipelines.encode_actor import _Encoder
from harnessrl.encoded_data import parquet_files, text_index
from harnessrl.pipelines.encode_attach import DRIVER_ATTACH_ROWS, attach_all
from harnessrl.pipelines.encode_claims import _Registry, registry_shards
from harnessrl.pipelines.encode_pool import TASK_CPUS, _nodes, bf16_hint, plan_pool
from harnessrl.pipelines.encode_progress import PROGRESS_SECONDS, _Progress, _ProgressLog
from harnessrl.pipelines.encode_scan import SCAN_MEMORY, _input_files, _scan_files
from harnessrl.ray_runtime import object_store_budget

log = logging.getLogger(__name__)


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


def _finish_bucket(bucket: int, cached: list[str], cache: EmbeddingCache, texts_dir: str, run_id: str) -> tuple[int, int]:
    """After the encoder pool: copy the bucket's cached vectors into `_texts`, and add the
    bucket's new vectors to the cache (one file per bucket per run). Returns (copied, added)."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    fs, path = storage.filesystem(texts_dir)
    files = [f for f in parquet_files(fs, path) if not f.rsplit("/", 1)[-1].startswith("cached-")]
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
                               "segments": bool(cfg.segments), "state_texts": cfg.state_texts is not False,
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

        keys, matrix = text_index(emb_dir, cfg.dtype, identity.dim)
        if len(keys) != n_distinct:
            raise DataError(f"encode: {n_distinct} distinct texts but {len(keys)} vectors under {emb_dir}")
        schema_meta = {ENCODER_KEY: identity.to_json().encode(), b"harnessrl.embedding_dtype": cfg.dtype.encode()}
        data_dir = storage.join(out_dir, "data")
        written = attach_all(files, transitions_dir, data_dir, (keys, matrix), cfg.max_candidates, schema_meta,
                             in_driver=rows <= DRIVER_ATTACH_ROWS, state_texts=cfg.state_texts is not False,
                             references=cfg.vectors == "references")
        if written != rows:
            raise DataError(f"encode: {rows} transitions but {written} written to {data_dir}")
        phases["attach"] = time.time() - start - phases["texts"]

        meta = {"encoder": json.loads(identity.to_json()), "encoder_digest": identity.digest(), "rows": rows,
                "texts_total": texts_total, "texts_distinct": n_distinct, "texts_cached": n_cached,
                "texts_encoded": n_distinct - n_cached, "dtype": cfg.dtype, "cache": cache.uri if cache else None,
                "vectors": cfg.vectors, "schema_version": schemas.SCHEMA_VERSION}
        encoded_data.write_meta(out_dir, meta)
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
