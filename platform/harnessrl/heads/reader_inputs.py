"""The reader head's batches: states as segments and candidates, turned into the index tensors the
reader network reads (harnessrl.algorithms.reader). Training and serving build them here alike.

A batch holds one flat token stream with every distinct text of the batch once (segments of the
states and next states, candidates), a separator after each; states and candidates index into it.
The frozen word embeddings are gathered once per distinct token id of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from harnessrl.algorithms.reader import MAX_AGE, ROLE_ID
from harnessrl.render import EMBEDDED_ROLES

Seg = tuple[str, int, str]  # (role, age, text): a harnessrl.render.Segment as the data stores it


class Tokens:
    """Token ids of texts (the encoder's tokenizer, no special tokens, cut at `max_tokens`), cached:
    segments recur across the states of an episode and across requests."""

    def __init__(self, tokenizer, max_tokens: int, cache_size: int = 200_000):
        self.tokenizer, self.max_tokens, self.cache_size = tokenizer, max_tokens, cache_size
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> list[np.ndarray]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            if len(self._cache) + len(missing) > self.cache_size:
                self._cache.clear()
            ids = self.tokenizer(missing, add_special_tokens=False, truncation=True,
                                 max_length=self.max_tokens)["input_ids"]
            unk = self.tokenizer.unk_token_id or 0
            self._cache.update((t, np.asarray(x or [unk], np.int64)) for t, x in zip(missing, ids))
        return [self._cache[t] for t in texts]


@dataclass
class Inputs:
    """What `assemble` needs besides the states: the tokens and embeddings of texts, the frozen
    word-embedding table (vocabulary x word_dim, float32) and the budgets."""

    tokens: Tokens
    word: np.ndarray
    embed: Callable[[Sequence[str]], np.ndarray] | None  # texts -> sentence embeddings (None: semantic path off)
    sem_dim: int
    state_tokens: int


def _state_tokens(segs: Sequence[Seg], start: dict[str, int], ids: dict[str, np.ndarray], limit: int):
    idx = [start[t] + np.arange(len(ids[t])) for _, _, t in segs]
    role = [np.full(len(ids[t]), ROLE_ID[r]) for r, _, t in segs]
    age = [np.full(len(ids[t]), min(a, MAX_AGE)) for _, a, t in segs]
    cat = lambda xs: np.concatenate(xs)[:limit] if xs else np.zeros(0, np.int64)  # noqa: E731
    return cat(idx), cat(role), cat(age)


def assemble(inp: Inputs, states: Sequence[Sequence[Seg]], candidates: Sequence[Sequence[str]],
             next_states: Sequence[Sequence[Seg]] | None = None) -> dict[str, np.ndarray]:
    """Index arrays of a batch (numpy; `as_tensors` makes them torch). Candidates are padded to the
    longest list (`k_mask`); next states (training) share the token stream."""
    groups = [states] + ([next_states] if next_states is not None else [])
    texts = list(dict.fromkeys([t for g in groups for st in g for _, _, t in st]
                               + [c for cands in candidates for c in cands]))
    ids = dict(zip(texts, inp.tokens(texts)))
    lens = np.array([len(ids[t]) for t in texts], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens + 1)])[:-1]
    start = {t: int(o) for t, o in zip(texts, offsets)}
    n = int(offsets[-1] + lens[-1] + 1) if texts else 1
    x_ids, x_pos, x_mask = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    for t, o, length in zip(texts, offsets, lens):
        x_ids[o:o + length], x_pos[o:o + length], x_mask[o:o + length] = ids[t], np.arange(length), True
    sep = n - 1  # a separator position: zero, masked
    uniq, inv = np.unique(x_ids, return_inverse=True)
    out: dict[str, np.ndarray] = {"word": inp.word[uniq].astype(np.float32), "x_inv": inv.astype(np.int64),
                                  "x_pos": x_pos, "x_mask": x_mask}
    B = len(states)
    emb = {}
    if inp.embed is not None:
        sem_texts = list(dict.fromkeys([t for g in groups for st in g for r, _, t in st if r in EMBEDDED_ROLES]
                                       + [c for cands in candidates for c in cands]))
        emb = dict(zip(sem_texts, inp.embed(sem_texts))) if sem_texts else {}
    for p, group in zip(("s", "n"), groups):
        parts = [_state_tokens(st, start, ids, inp.state_tokens) for st in group]
        T = max(1, max(len(q[0]) for q in parts))
        idx, role, age = np.full((B, T), sep, np.int64), np.zeros((B, T), np.int64), np.zeros((B, T), np.int64)
        mask = np.zeros((B, T), bool)
        for i, (a, r, g) in enumerate(parts):
            idx[i, : len(a)], role[i, : len(a)], age[i, : len(a)], mask[i, : len(a)] = a, r, g, True
        out.update({f"{p}_idx": idx, f"{p}_role": role, f"{p}_age": age, f"{p}_mask": mask,
                    f"{p}_ids": np.where(mask, x_ids[idx], -1)})
        if inp.embed is not None:
            sem = [[s for s in st if s[0] in EMBEDDED_ROLES] for st in group]
            S = max(1, max(len(x) for x in sem))
            seg_emb = np.zeros((B, S, inp.sem_dim), np.float32)
            seg_role, seg_age, seg_mask = np.zeros((B, S), np.int64), np.zeros((B, S), np.int64), np.zeros((B, S), bool)
            for i, segs in enumerate(sem):
                for j, (r, a, t) in enumerate(segs):
                    seg_emb[i, j], seg_role[i, j], seg_age[i, j], seg_mask[i, j] = emb[t], ROLE_ID[r], min(a, MAX_AGE), True
                if not segs:  # a state with nothing to embed: one masked-in zero slot keeps the softmax defined
                    seg_mask[i, 0] = True
            out.update({f"{p}_seg_emb": seg_emb, f"{p}_seg_role": seg_role, f"{p}_seg_age": seg_age,
                        f"{p}_seg_mask": seg_mask})
    K = max(1, max(len(c) for c in candidates))
    L = max(1, max((len(ids[c]) for cands in candidates for c in cands), default=1))
    c_idx, c_mask = np.full((B, K, L), sep, np.int64), np.zeros((B, K, L), bool)
    k_mask = np.zeros((B, K), bool)
    c_emb = np.zeros((B, K, inp.sem_dim), np.float32)
    for i, cands in enumerate(candidates):
        for k, c in enumerate(cands):
            length = len(ids[c])
            c_idx[i, k, :length], c_mask[i, k, :length], k_mask[i, k] = start[c] + np.arange(length), True, True
            if emb:
                c_emb[i, k] = emb[c]
    out.update({"c_idx": c_idx, "c_mask": c_mask, "k_mask": k_mask, "c_emb": c_emb,
                "c_ids": np.where(c_mask, x_ids[c_idx], -2)})
    return out


def as_tensors(batch: dict[str, np.ndarray], device=None) -> dict:
    import torch

    return {k: torch.from_numpy(v).to(device) if device is not None else torch.from_numpy(v) for k, v in batch.items()}
