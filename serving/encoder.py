"""The encoder deployment (`serve.encoder`): the sentence encoder as a Ray Serve deployment of its
own, between the ingress and the critic (DESIGN §9).

Critic replicas send it the texts their own LRU misses, one call per critic batch; concurrent
calls are gathered by `@serve.batch`, each distinct text is encoded once, and embeddings are
kept in an LRU (harnessrl.embedding_lru) keyed by a hash of the text (harnessrl.encoders.text_hash),
so a state or candidate seen by any critic replica is not encoded again. On a GPU (`num_gpus >
0`) the weights are float16 unless `precision: float32` (harnessrl.precision.half_weights). The encoder it loads must be the one the served model
was trained with: `build_app` checks the configuration against the model before anything starts,
and this replica checks what it loaded against that identity (`EncoderIdentity.check_same`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from typing import Any

import numpy as np
from ray import serve

from harnessrl.embedding_lru import EmbeddingLRU

log = logging.getLogger(__name__)


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=128)
class EncoderService:
    def __init__(self, name: str, max_seq_length: int | None, identity: str, config: dict[str, Any],
                 env: dict[str, str] | None = None):
        import os

        os.environ.update(env or {})
        import torch

        from harnessrl.config import ServeEncoderConfig
        from harnessrl.encoders import EncoderIdentity, load_encoder
        from harnessrl.precision import half_weights

        self.cfg = cfg = ServeEncoderConfig.model_validate(config)
        torch.set_num_threads(max(1, math.floor(cfg.num_cpus)))
        self.device = "cuda" if cfg.num_gpus > 0 and torch.cuda.is_available() else "cpu"
        expected = EncoderIdentity.from_json(identity)
        # the precision of the identity, as the model was trained
        self.model, loaded = load_encoder(name, self.device, max_seq_length, expected.precision)
        expected.check_same(loaded, "the encoder deployment (serve.encoder)")
        # float16 weights on a GPU, unless the model's vectors were made in bfloat16 (autocast then)
        half = half_weights(cfg.precision, self.device == "cuda", loaded.precision)
        if half:
            self.model.half()
        self.identity = loaded
        self.precision = "float16" if half else loaded.precision
        self.lru = EmbeddingLRU(cfg.cache_size)  # by text hash
        self._lock = threading.Lock()
        self.batches = self.calls = 0
        self._encode.set_max_batch_size(cfg.max_batch_size)
        self._encode.set_batch_wait_timeout_s(cfg.batch_wait_timeout_s)
        from ray.serve import metrics as rm

        self._ray = {k: rm.Counter(f"harnessrl_encoder_cache_{k}", f"encoder deployment: texts {what}")
                     for k, what in (("hits", "served from its LRU"), ("misses", "it had to encode"))}
        log.info("encoder %s on %s (%s)", loaded.model_name, self.device, self.precision)

    def identity_json(self) -> str:
        return self.identity.to_json()

    def stats(self) -> dict[str, Any]:
        return {**self.lru.stats(), "batches": self.batches, "calls": self.calls, "device": self.device,
                "precision": self.precision}

    async def encode(self, texts: list[str]) -> np.ndarray:
        """Embeddings (float32, one row per text, in order) of `texts`."""
        return await self._encode(list(texts))

    def _run(self, calls: list[list[str]]) -> list[np.ndarray]:
        from harnessrl.encoders import text_hash

        keys = [[text_hash(t) for t in texts] for texts in calls]
        found = self.lru.get_many([h for hashes in keys for h in hashes])
        todo = {h: t for texts, hashes in zip(calls, keys) for t, h in zip(texts, hashes) if h not in found}
        if todo:  # outside any lock: another batch may look up meanwhile
            fresh = self.model.encode(list(todo.values()), convert_to_numpy=True, show_progress_bar=False,
                                      batch_size=64)
            fresh = dict(zip(todo, np.asarray(fresh, dtype=np.float32)))
            self.lru.put_many(fresh)
            found.update(fresh)
        n = sum(len(hashes) for hashes in keys)
        with self._lock:
            self.batches += 1
            self.calls += len(calls)
        if n - len(todo):
            self._ray["hits"].inc(n - len(todo))
        if todo:
            self._ray["misses"].inc(len(todo))
        dim = self.identity.dim
        return [np.stack([found[h] for h in hashes]) if hashes else np.zeros((0, dim), np.float32) for hashes in keys]

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)
    async def _encode(self, calls: list[list[str]]) -> list[np.ndarray]:
        # off the event loop: encoding is CPU- or GPU-bound, and the next batch gathers meanwhile
        return await asyncio.to_thread(self._run, calls)


def options(cfg) -> dict[str, Any]:
    """Ray Serve deployment options of a ServeEncoderConfig."""
    return {"num_replicas": cfg.replicas, "max_ongoing_requests": cfg.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus},
            "logging_config": {"enable_access_log": False}}
