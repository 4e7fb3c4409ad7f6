"""The cross-encoder head's part of the train job (`train.head: cross`, harnessrl.algorithms.cross).

The Ray Train run is the frozen head's (jobs/train.py: DDP workers, a shard each, rank 0
checkpoints and logs, held-out validation, early stopping). What differs is here: workers hold
texts rather than embeddings, the trunk re-encodes every pair it learns from, and the exported
critic carries the fine-tuned trunk with its tokeniser.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import pyarrow as pa

from harnessrl.jobs.train import _Learners, _Validation, on_device
from harnessrl.transitions import untaken_candidates

log = logging.getLogger(__name__)
TEXT_COLUMNS = ("state_text", "action_text", "next_state_text", "reward", "done", "features", "candidates",
                "candidate_features", "outcome_success")
VALIDATION_ROWS = 512  # held-out rows scored per validation: three trunk passes each
THRESHOLD_ROWS = 4096  # rows of successful episodes scored for the fallback threshold


def load_text_rows(batches) -> dict[str, Any]:
    """Transition rows as lists (texts, the untaken candidates aligned with their features) and
    arrays (reward, done, features)."""
    cols: dict[str, list] = {k: [] for k in TEXT_COLUMNS}
    for b in batches:
        for k in TEXT_COLUMNS:
            cols[k].extend(b.column(k).to_pylist() if k in b.column_names else [None] * b.num_rows)
    n = len(cols["reward"])
    out: dict[str, Any] = {k: cols[k] for k in ("state_text", "action_text", "next_state_text")}
    out["reward"] = np.asarray(cols["reward"], np.float32)
    out["done"] = np.asarray(cols["done"], np.float32)
    out["outcome_success"] = np.array([bool(x) for x in cols["outcome_success"]], bool)
    feats = [f or [] for f in cols["features"]]
    out["features"] = np.asarray(feats, np.float32).reshape(n, -1) if n else np.zeros((0, 0), np.float32)
    out["cand"], out["cand_f"] = [], []
    for action, cands, cand_f in zip(cols["action_text"], cols["candidates"], cols["candidate_features"]):
        untaken = untaken_candidates(action, cands, len(cand_f) if cand_f is not None else None)
        out["cand"].append(untaken)
        out["cand_f"].append(cand_f[: len(untaken)] if cand_f else [])
    return out


class CrossLearners(_Learners):
    """The critic alone: the cross head trains no tool head."""

    def __init__(self, config: dict[str, Any], world: int, device: str = "cpu"):
        from harnessrl.algorithms.cross import CrossConfig, CrossIQLNetwork, CrossLearner, trunk_from_encoder

        self.cfg = CrossConfig(**config["cross"])
        trunk, tokenizer = trunk_from_encoder(config["encoder_name"], self.cfg.layers, self.cfg.max_length)
        net = CrossIQLNetwork(self.cfg, trunk)
        if self.cfg.feature_dim:
            net.set_feature_stats(*config["feature_stats"])
        self.critic = CrossLearner(self.cfg, on_device(net, world, device), tokenizer)
        self.tool_cfg = self.tools = None


class CrossValidation(_Validation):
    """Held-out TD error as in _Validation, from texts through the trunk (dropout off while scoring)."""

    def __init__(self, rows: dict[str, Any], reward_scale: float, gamma: float, use_f: bool, seed: int):
        import torch

        n = len(rows["reward"])
        pick = np.sort(np.random.default_rng(seed).permutation(n)[:VALIDATION_ROWS])
        self.rows = {k: [rows[k][i] for i in pick] for k in ("state_text", "action_text", "next_state_text")}
        self.t = {"reward": torch.from_numpy(rows["reward"][pick] * reward_scale), "done": torch.from_numpy(rows["done"][pick])}
        if use_f:
            self.t["features"] = torch.from_numpy(rows["features"][pick])
        self.gamma, self.n = gamma, len(pick)
        self.reset_best()

    def score(self, learners: _Learners) -> float:
        sc, r = learners.critic.scorer, self.rows
        sc.net.eval()
        try:
            q = sc.min_q(r["state_text"], r["action_text"], self.t.get("features"))
            target = self.t["reward"] + self.gamma * (1 - self.t["done"]) * sc.value(r["next_state_text"])
        finally:
            sc.net.train()
        return float((q - target).abs().mean())


def cross_setup(config: dict[str, Any], rank: int, world: int, device):
    """(learners, step function, validation or None), as jobs.train._frozen_setup for the frozen head."""
    import ray.train
    import torch

    rows = load_text_rows(ray.train.get_dataset_shard("train").iter_batches(batch_size=4096, batch_format="pyarrow"))
    n = len(rows["reward"])
    if n == 0:
        raise RuntimeError(f"worker {rank} got an empty shard")
    learners = CrossLearners(config, world, device)
    learners.critic.net.train()
    use_f = learners.cfg.feature_dim > 0
    reward = torch.from_numpy(rows["reward"] * config["reward_scale"]).to(device)
    done, feats = torch.from_numpy(rows["done"]).to(device), torch.from_numpy(rows["features"]).to(device)
    k = config["candidates_per_step"] if learners.cfg.alpha > 0 and any(rows["cand"]) else 0
    per_worker = max(1, config["batch_size"] // world)

    def step(gen: torch.Generator) -> dict[str, float]:
        idx = torch.randint(n, (per_worker,), generator=gen).tolist()
        cand = cand_mask = cand_f = None
        if k:  # k untaken candidates per state, sampled; padding masked out
            cand, cand_mask, cand_f = [], torch.zeros(len(idx), k, dtype=torch.bool), torch.zeros(len(idx), k, feats.shape[1])
            for j, i in enumerate(idx):
                picks = torch.randperm(len(rows["cand"][i]), generator=gen)[:k].tolist()
                cand.append([rows["cand"][i][p] for p in picks] + [""] * (k - len(picks)))
                cand_mask[j, : len(picks)] = True
                if use_f and picks:
                    cand_f[j, : len(picks)] = torch.tensor([rows["cand_f"][i][p] for p in picks])
            cand_mask, cand_f = cand_mask.to(device), cand_f.to(device)
        return learners.critic.update([rows["state_text"][i] for i in idx], [rows["action_text"][i] for i in idx],
                                      reward[idx], [rows["next_state_text"][i] for i in idx], done[idx],
                                      feats[idx] if use_f else None, cand, cand_mask, cand_f if use_f else None)

    val = None
    if config.get("validation"):
        val_rows = load_text_rows(ray.train.get_dataset_shard("val").iter_batches(batch_size=4096,
                                                                                   batch_format="pyarrow"))
        val = CrossValidation(val_rows, config["reward_scale"], learners.cfg.gamma, use_f, config["seed"])
    return learners, step, val


def loop_config(cfg, encoder_name: str, feature_dim: int) -> dict[str, Any]:
    """The cross head's entries of the train loop's config."""
    from harnessrl.algorithms.cross import CrossConfig

    c = cfg.cross
    head = CrossConfig(layers=c.layers, max_length=c.max_length, hidden_dim=cfg.hidden_dim, gamma=cfg.gamma,
                       expectile=cfg.expectile, lr=cfg.lr, trunk_lr=c.trunk_lr, alpha=cfg.alpha,
                       feature_dim=feature_dim, bf16=cfg.precision == "bfloat16")
    return {"head": "cross", "cross": head.to_dict(), "encoder_name": encoder_name, "batch_size": c.batch_size}


def sample_successful(ds, n_rows: int, limit: int, seed: int) -> dict[str, Any]:
    """The rows of successful episodes (of all episodes when none succeeded) among about `limit`
    rows sampled, for the fallback threshold: scoring every row through the trunk would cost a
    training pass."""
    rng = np.random.default_rng(seed)
    keep = min(1.0, limit / max(n_rows, 1))
    parts = []
    columns = ["state_text", "action_text", "next_state_text", "reward", "done", "features", "outcome_success"]
    for b in ds.select_columns(columns).iter_batches(batch_size=8192, batch_format="pyarrow"):
        parts.append(b.filter(pa.array(rng.random(b.num_rows) < keep)) if keep < 1 else b)
    rows = load_text_rows(parts)
    ok = rows["outcome_success"]
    if not ok.any():
        ok = np.ones(len(ok), bool)
    return {"state_text": [t for t, m in zip(rows["state_text"], ok) if m],
            "action_text": [t for t, m in zip(rows["action_text"], ok) if m], "features": rows["features"][ok]}


def export(checkpoint_dir: str, cross: dict[str, Any], encoder_name: str, best: str, feature_dim: int,
           successful: dict[str, Any], scale: float, quantile: float):
    """(scorer with the chosen weights, fallback threshold in reward units) from a finished run."""
    import torch

    from harnessrl.algorithms.cross import CrossConfig, CrossIQLNetwork, CrossScorer, trunk_from_encoder
    from harnessrl.training_state import load_network_weights

    cfg = CrossConfig(**cross)
    trunk, tokenizer = trunk_from_encoder(encoder_name, cfg.layers, cfg.max_length)
    net = CrossIQLNetwork(cfg, trunk)
    load_network_weights(checkpoint_dir, net, name=f"{best}state")
    scorer = CrossScorer(net.eval(), tokenizer, cfg.max_length)
    f = torch.from_numpy(successful["features"]) if feature_dim else None
    q = scorer.min_q(successful["state_text"], successful["action_text"], f).numpy()
    threshold = float(np.quantile(q / scale, quantile)) if len(q) else float("nan")
    log.info("train: cross head exported from %s (%s weights); fallback threshold from %d rows", os.path.basename(
        checkpoint_dir), best or "last", len(q))
    return scorer, threshold
