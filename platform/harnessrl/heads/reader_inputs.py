"""The reader head's batches: states as segments and candidates, turned into the index tensors the
reader network reads (harnessrl.algorithms.reader). Training and serving build them here alike.

A batch holds every distinct text of the batch once (segments of the states and next states,
candidates): its sentence embedding (semantic path) and its token ids (token path, match signals);
states and candidates index into them. The frozen word embeddings are gathered once per distinct
token id of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from harnessrl.algorithms.reader import MAX_AGE, ROLE_ID
from harnessrl.render import EMBEDDED_ROLES, SEGMENT_ROLES

Seg = tuple[str, int, str]  # (role, age, text): a harnessrl.render.Segment as the data stores it
KEPT_ROLES = frozenset({"task", "observation", "detail", "status", "text"})  # what a state without its history keeps


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
    word-embedding table (vocabulary x word_dim, float32) and which paths read them."""

    tokens: Tokens
    word: np.ndarray
    embed: Callable[[Sequence[str]], np.ndarray] | None  # texts -> sentence embeddings (None: semantic path off)
    sem_dim: int
    token_path: bool = False
    match: bool = True


def without_history(state: Sequence[Seg]) -> list[Seg]:
    """The state as an agent that sent no history would give it: its task and observation only
    (the history features of such a state are all zero)."""
    return [s for s in state if s[0] in KEPT_ROLES]


def _match(states: Sequence[Sequence[Seg]], candidates: Sequence[Sequence[str]], ids: dict[str, np.ndarray],
           K: int) -> np.ndarray:
    """(B, K, roles): per state role, the share of the candidate's distinct tokens found there."""
    sets = {t: set(x.tolist()) for t, x in ids.items()}
    out = np.zeros((len(states), K, len(SEGMENT_ROLES)), np.float32)
    for i, (st, cands) in enumerate(zip(states, candidates)):
        by_role: dict[int, set[int]] = {}
        for role, _, text in st:
            by_role.setdefault(ROLE_ID[role], set()).update(sets[text])
        for k, c in enumerate(cands):
            mine = sets[c]
            for r, found in by_role.items():
                out[i, k, r] = len(mine & found) / max(1, len(mine))
    return out


def assemble(inp: Inputs, states: Sequence[Sequence[Seg]], candidates: Sequence[Sequence[str]],
             next_states: Sequence[Sequence[Seg]] | None = None) -> dict[str, np.ndarray]:
    """Index arrays of a batch (numpy; `as_tensors` makes them torch). Candidates are padded to the
    longest list (`k_mask`); next states (training) share the texts."""
    groups = [states] + ([next_states] if next_states is not None else [])
    cand_texts = [c for cands in candidates for c in cands]
    texts = list(dict.fromkeys([t for g in groups for st in g for _, _, t in st] + cand_texts))
    index = {t: i for i, t in enumerate(texts)}
    out: dict[str, np.ndarray] = {}
    ids = dict(zip(texts, inp.tokens(texts))) if (inp.token_path or inp.match) and texts else {}
    if inp.token_path:
        L = max(1, max((len(x) for x in ids.values()), default=1))
        t_ids, t_mask = np.zeros((max(1, len(texts)), L), np.int64), np.zeros((max(1, len(texts)), L), bool)
        for i, t in enumerate(texts):
            t_ids[i, : len(ids[t])], t_mask[i, : len(ids[t])] = ids[t], True
        uniq, inv = np.unique(t_ids, return_inverse=True)
        out.update(word=inp.word[uniq].astype(np.float32), t_inv=inv.reshape(t_ids.shape).astype(np.int64),
                   t_mask=t_mask)
    if inp.embed is not None:
        # the sentence embeddings of candidates and of segments in the embedded roles ("actions" is not)
        wanted = set(cand_texts) | {t for g in groups for st in g for r, _, t in st if r in EMBEDDED_ROLES}
        emb = np.zeros((max(1, len(texts)), inp.sem_dim), np.float32)
        rows = [i for i, t in enumerate(texts) if t in wanted]
        if rows:
            emb[rows] = inp.embed([texts[i] for i in rows])
        out["emb"] = emb
    B = len(states)
    for p, group in zip(("s", "n"), groups):
        S = max(1, max((len(st) for st in group), default=1))
        u, role, age = np.zeros((B, S), np.int64), np.zeros((B, S), np.int64), np.zeros((B, S), np.int64)
        mask = np.zeros((B, S), bool)
        for i, st in enumerate(group):
            for j, (r, a, t) in enumerate(st):
                u[i, j], role[i, j], age[i, j], mask[i, j] = index[t], ROLE_ID[r], min(a, MAX_AGE), True
            if not st:  # a state with no segment: one masked-in zero slot keeps the attention defined
                mask[i, 0] = True
        out.update({f"{p}_u": u, f"{p}_role": role, f"{p}_age": age, f"{p}_mask": mask})
    K = max(1, max((len(c) for c in candidates), default=1))
    c_u, k_mask = np.zeros((B, K), np.int64), np.zeros((B, K), bool)
    for i, cands in enumerate(candidates):
        for k, c in enumerate(cands):
            c_u[i, k], k_mask[i, k] = index[c], True
    out.update(c_u=c_u, k_mask=k_mask)
    if inp.match:
        out["match"] = _match(states, candidates, ids, K)
    return out


def as_tensors(batch: dict[str, np.ndarray], device=None) -> dict:
    import torch

    return {k: torch.from_numpy(v).to(device) if device is not None else torch.from_numpy(v) for k, v in batch.items()}
