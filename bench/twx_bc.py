"""Behaviour cloning baselines for bench/twx.py (issue 4), on the inputs the critic reads.

Frozen head: an MLP over [s, a, s*a, |s-a|] of the frozen MiniLM embeddings (the encode stage's
`state_emb`, `action_emb`, `candidate_emb` columns), trained with softmax cross-entropy of the
taken action against the step's logged candidates (the taken one plus up to
`encoder.max_candidates` untaken ones, as the encode stage kept them). It scores in process:
no service. At play time it renders the state with the pipeline's renderer and encodes texts
with the same encoder (`load_bc_encoder`: the encoded dataset's own, checked against it).

Reader head: its own network (harnessrl.algorithms.reader) over the state's segments, trained with
the same listwise loss (`harnessrl.behaviour_prior.train_listwise`, which also trains the reader critic's
prior; bench/cross_probe.py's reader scorers too).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np


def load_rows(encoded_dir: str) -> dict[str, Any]:
    """The encoded transitions as arrays: state (N, D), action (N, D), candidates (N, K, D) with a mask,
    and episode ids."""
    from harnessrl.encoded_data import load_arrays, read_table

    table = read_table(encoded_dir)  # either layout, the vectors in the rows
    arrays = load_arrays([table])
    s, a = arrays["state_emb"], arrays["action_emb"]
    n, dim = table.num_rows, s.shape[1]
    c, mask = arrays.get("cand"), arrays.get("cand_mask")
    if c is None or c.shape[1] == 0:
        c, mask = np.zeros((n, 1, dim), np.float32), np.zeros((n, 1), bool)
    return {"episode_id": table.column("episode_id").to_pylist(), "s": s, "a": a, "c": c, "mask": mask, "dim": dim}


def load_bc_encoder(encoded_dir: str):
    """The encoder that made the encoded dataset's embeddings, loaded and checked against them:
    BC learns on those vectors and scores live states with this encoder's."""
    from harnessrl.encoded_data import check_identity, read_identity
    from harnessrl.encoders import load_encoder

    made_by = read_identity(encoded_dir)
    model, loaded = load_encoder(made_by.model_name, None, made_by.max_seq_length, made_by.precision)
    check_identity(encoded_dir, loaded, f"behaviour cloning on {encoded_dir}")
    return model


def bc_net(dim: int, hidden: int):
    """The MLP over pair_features([s, a, s*a, |s-a|]) that scores one (state, action) pair."""
    import torch.nn as nn

    return nn.Sequential(nn.Linear(4 * dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


class BCScorer:
    """A trained BC net plus the text pipeline to score live states."""

    def __init__(self, net, encode: Callable[[list[str]], np.ndarray], render: Callable[[dict], str]):
        self.net, self._encode, self._render = net, encode, render
        self._cache: dict[str, np.ndarray] = {}

    def _emb(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            for t, e in zip(missing, self._encode(missing)):
                self._cache[t] = np.asarray(e, np.float32)
        if len(self._cache) > 50_000:  # bounded memory on long runs
            self._cache.clear()
            return self._emb(texts)
        return np.stack([self._cache[t] for t in texts])

    def scores(self, state: dict, candidates: list[str]) -> list[float]:
        import torch

        from harnessrl.algorithms.iql import pair_features

        text = self._render(state)
        emb = torch.from_numpy(self._emb([text, *candidates]))
        s = emb[:1].expand(len(candidates), -1)
        with torch.no_grad():
            return self.net(pair_features(s, emb[1:])).squeeze(-1).tolist()


def train_bc(rows: dict[str, Any], keep: np.ndarray, steps: int, seed: int = 0, hidden: int = 128,
             batch_size: int = 128, lr: float = 1e-3, max_seconds: float = 300.0):
    """Train on the rows where `keep`; bounded by `steps` and `max_seconds`. Returns (net, info)."""
    import torch

    from harnessrl.algorithms.iql import pair_features

    torch.manual_seed(seed)
    idx = np.flatnonzero(keep)
    if idx.size == 0:
        raise ValueError("no rows to train behaviour cloning on")
    s, a = torch.from_numpy(rows["s"][idx]), torch.from_numpy(rows["a"][idx])
    c, m = torch.from_numpy(rows["c"][idx]), torch.from_numpy(rows["mask"][idx])
    net = bc_net(rows["dim"], hidden)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    t0, losses, done = time.time(), [], 0
    for step in range(steps):
        if time.time() - t0 > max_seconds:
            break
        b = torch.randint(0, idx.size, (min(batch_size, idx.size),), generator=gen)
        sb, ab, cb, mb = s[b], a[b], c[b], m[b]
        acts = torch.cat([ab[:, None], cb], dim=1)  # (B, 1+K, D): the taken action first
        logits = net(pair_features(sb[:, None].expand_as(acts), acts)).squeeze(-1)
        valid = torch.cat([torch.ones_like(mb[:, :1]), mb], dim=1)
        logits = logits.masked_fill(~valid, -1e9)
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(b), dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        done = step + 1
    net.eval()
    return net, {"rows": int(idx.size), "steps": done, "seconds": round(time.time() - t0, 1),
                 "final_loss": float(np.mean(losses[-50:])) if losses else None}


# ---- BC on the reader head's inputs (train.head: reader) ---------------------------------------
def load_segment_rows(transitions_dir: str, max_candidates: int = 16) -> list[dict[str, Any]]:
    """Transition rows as the reader reads them: segments, and the taken action first among up to
    `max_candidates` untaken candidates (the frozen BC's candidate set); `expert_action`: the expert's
    action the row's info records (harnessrl.evaluation.expert_action) when it is one of the step's
    candidates, else None."""
    import pyarrow.dataset as pads

    from harnessrl.evaluation import expert_action
    from harnessrl.transitions import untaken_candidates

    table = pads.dataset(transitions_dir, format="parquet").to_table(
        columns=["episode_id", "state_segments", "action_text", "candidates", "info"])
    out = []
    for r in table.to_pylist():
        label = expert_action(r)
        out.append({"episode_id": r["episode_id"], "segments": [(s["role"], s["age"], s["text"]) for s in r["state_segments"]],
                    "candidates": [r["action_text"], *untaken_candidates(r["action_text"], r["candidates"], max_candidates)],
                    "gold": 0, "expert_action": label if label in (r["action_text"], *(r["candidates"] or ())) else None})
    return out


def expert_examples(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`bc-expert`'s examples: the rows that record the expert's action, labelled with it (appended to
    the candidates when the cut left it out)."""
    out = []
    for r in rows:
        label = r["expert_action"]
        if label is not None:
            cands = r["candidates"] if label in r["candidates"] else [*r["candidates"], label]
            out.append({**r, "candidates": cands, "gold": cands.index(label)})
    return out


class ReaderBCScorer:
    """A reader BC network and the renderer of the critic's settings, scoring live states."""

    def __init__(self, net, inputs, renderer):
        self.net, self.inputs, self.renderer = net, inputs, renderer

    def scores(self, state: dict, candidates: list[str]) -> list[float]:
        import torch

        from harnessrl.behaviour_prior import candidate_logits

        segs = [(s.role, s.age, s.text) for s in self.renderer.parse(state).segments]
        with torch.no_grad():
            return candidate_logits(self.net, self.inputs, [segs], [candidates])[0].tolist()
