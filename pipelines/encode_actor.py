"""The encode stage's encoder actor: one model load per actor, each block of texts sorted by
length and cut into batches of a fixed token budget, so short texts are not padded to long ones."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from harnessrl.config import EncoderConfig
from harnessrl.embedding_cache import emb_array
from harnessrl.encoders import EncoderIdentity, load_encoder
from harnessrl.pipelines.encode_pool import PoolPlan


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
