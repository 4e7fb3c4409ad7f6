"""The encode stage's claim table: which block encodes each distinct text (the first to present
it), and which texts the persistent cache answers instead (claimed for a copy, not a model call)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from harnessrl.embedding_cache import EmbeddingCache


def registry_shards(cpus: float, buckets: int) -> int:
    """Claim-table actors: one on a small cluster, one per 16 CPUs on a large one."""
    return max(1, min(buckets, int(cpus // 16)))


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
