"""The behaviour policy over a step's candidates, cloned from the logs: the reader critic's prior.

Why: IQL does not act by the argmax of Q. Its policy is pi(a | s) proportional to
pi_beta(a | s) exp(beta A(s, a)): the behaviour policy reweighted by the advantage, whose argmax is
that of log pi_beta + beta Q. Ranking by Q alone reads Q on candidates the logs seldom took from such
a state, where its values are near ties; on TextWorldExpress the blend won 39 games the critic alone
lost against 11 the other way (bench/README, "critic+bc").

The prior is the reader network (harnessrl.algorithms.reader) with the critic's paths and no history
features, trained listwise: softmax cross-entropy of the taken action against the step's logged
candidates (steps that logged none teach it nothing). The service ranks by
score + prior_weight * log pi_beta(a | s) when a request's candidates carry no logprob of the agent's.
"""

from __future__ import annotations

import collections
import random
import time
from typing import Any, Sequence

import numpy as np

PRIOR_WEIGHTS = "prior.safetensors"  # beside the critic's weights, when trained
PRIOR_CONFIG = "prior.json"  # its ReaderConfig


def examples(rows: dict[str, Any], max_candidates: int = 16) -> list[dict[str, Any]]:
    """Listwise examples of reader rows (harnessrl.heads.reader.load_rows: `s`, `action`, `cand`): the
    segments and the taken action first among up to `max_candidates` untaken candidates; rows without
    an untaken candidate are left out."""
    out = []
    for segs, action, cands in zip(rows["s"], rows["action"], rows["cand"]):
        others = [c for c in dict.fromkeys(cands) if c != action][:max_candidates]
        if others:
            out.append({"segments": segs, "candidates": [action, *others], "gold": 0})
    return out


def candidate_logits(net, inputs, segments, candidates, device="cpu"):
    """(B, K) logits of each state's candidates under a reader network (padding: -1e9)."""
    import torch

    from harnessrl.heads.reader_inputs import as_tensors, assemble

    b = as_tensors(assemble(inputs, segments, candidates), device)
    x = net.stream(b)
    return torch.minimum(*net.q(net.state(x, b, "s"), x, b)).masked_fill(~b["k_mask"], -1e9)


def log_probabilities(net, inputs, segments: Sequence, candidates: Sequence[Sequence[str]], device="cpu"
                      ) -> list[list[float]]:
    """log pi(candidate | state) per state, over that state's candidates."""
    import torch

    with torch.no_grad():
        lp = torch.log_softmax(candidate_logits(net, inputs, segments, candidates, device), dim=1).cpu()
    return [lp[i, : len(c)].tolist() for i, c in enumerate(candidates)]


def train_listwise(chosen: list[dict[str, Any]], embed, encoder: str, paths: dict[str, bool], steps: int,
                   batch: int = 32, seed: int = 0, lr: float = 1e-3, device: str = "cpu",
                   log_every: int | None = None, max_seconds: float = 600.0):
    """A reader network (the paths switched on in `paths`) trained with softmax cross-entropy of each
    example's `gold` against its `candidates`. Returns (network in eval mode, inputs for scoring,
    progress)."""
    import torch

    from harnessrl.algorithms.reader import ReaderConfig, ReaderNetwork
    from harnessrl.heads.reader import _inputs, role_stats

    torch.manual_seed(seed)
    rng = random.Random(seed)
    cfg = ReaderConfig(sem_dim=embed([chosen[0]["candidates"][0]]).shape[1], **paths)
    inputs = _inputs(cfg, encoder, embed)
    net = ReaderNetwork(cfg).to(device)
    net.set_stats(*role_stats([{"s": [e["segments"] for e in chosen], "n": [], "action": [],
                                "cand": [e["candidates"] for e in chosen]}], embed, cfg.sem_dim))
    opt = torch.optim.Adam(net.parameters(), lr)
    start, window, done = time.time(), collections.deque(maxlen=50), 0
    for done in range(1, steps + 1):
        part = rng.sample(chosen, min(batch, len(chosen)))
        logits = candidate_logits(net, inputs, [e["segments"] for e in part], [e["candidates"] for e in part], device)
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor([e["gold"] for e in part], device=device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        window.append(float(loss.detach()))
        if log_every and done % log_every == 0:
            print(f"  reader step {done}/{steps}: loss {np.mean(window):.3f}, {time.time() - start:.0f} s", flush=True)
        if time.time() - start > max_seconds:
            break
    net.eval()
    return net, inputs, {"rows": len(chosen), "steps": done, "seconds": round(time.time() - start, 1),
                         "final_loss": round(float(np.mean(window)), 4) if window else None}
