"""The cross-encoder head (`train.head: cross`, harnessrl.algorithms.cross): the pipeline's encoder
fine-tuned on "state [SEP] action" pairs as the trunk of Q and V.

Workers hold texts rather than embeddings, and the trunk re-encodes every pair it learns from;
the exported critic carries the fine-tuned trunk with its tokeniser (`trunk/`). At run time it
reads (state, candidate) texts itself: the critic embeds states only for the OOD check. No
target copy (see algorithms/cross.py) and no tool head.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from harnessrl.heads.base import (DriverData, Exported, Head, Learners, Scorer, Validation, WorkerSetup, shard_size,
                                  successful_mask)
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


class CrossValidation(Validation):
    """Held-out TD error from texts through the trunk (dropout off while scoring), on a sample."""

    def __init__(self, rows: dict[str, Any], reward_scale: float, gamma: float, use_f: bool, seed: int):
        import torch

        n = len(rows["reward"])
        pick = np.sort(np.random.default_rng(seed).permutation(n)[:VALIDATION_ROWS])
        self.rows = {k: [rows[k][i] for i in pick] for k in ("state_text", "action_text", "next_state_text")}
        self.t = {"reward": torch.from_numpy(rows["reward"][pick] * reward_scale),
                  "done": torch.from_numpy(rows["done"][pick])}
        if use_f:
            self.t["features"] = torch.from_numpy(rows["features"][pick])
        self.gamma, self.n = gamma, len(pick)
        super().__init__()

    def score(self, learners: Learners) -> float:
        sc, r = learners.critic.scorer, self.rows
        sc.net.eval()
        try:
            q = sc.min_q(r["state_text"], r["action_text"], self.t.get("features"))
            target = self.t["reward"] + self.gamma * (1 - self.t["done"]) * sc.value(r["next_state_text"])
        finally:
            sc.net.train()
        return float((q - target).abs().mean())


class CrossHeadScorer(Scorer):
    def __init__(self, scorer):
        self.scorer = scorer  # harnessrl.algorithms.cross.CrossScorer: texts in, values out
        self.uses_features = bool(scorer.net.feat_mean.numel())

    def embed_texts(self, states, candidates) -> list[str]:
        return []

    def q(self, states, candidates, features, embed) -> np.ndarray:
        import torch

        f = torch.as_tensor(features, dtype=torch.float32) if features is not None else None
        return self.scorer.min_q([p.text for p, cands in zip(states, candidates) for _ in cands],
                                 [c for cands in candidates for c in cands], f).numpy()

    def values(self, states, actions, next_states, features, embed):
        import torch

        f = torch.as_tensor(np.asarray(features), dtype=torch.float32) if self.uses_features else None
        sc, states, next_states = self.scorer, [p.text for p in states], [p.text for p in next_states]
        return sc.min_q(states, actions, f).numpy(), sc.value(states).numpy(), sc.value(next_states).numpy()


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
    ok = successful_mask(rows["outcome_success"])
    return {"state_text": [t for t, m in zip(rows["state_text"], ok) if m],
            "action_text": [t for t, m in zip(rows["action_text"], ok) if m], "features": rows["features"][ok]}


class CrossHead(Head):
    kind = "cross"

    def loop_config(self, cfg, data: DriverData) -> dict[str, Any]:
        from harnessrl.algorithms.cross import CrossConfig

        c = cfg.cross
        network = CrossConfig(layers=c.layers, max_length=c.max_length, hidden_dim=cfg.hidden_dim, gamma=cfg.gamma,
                              expectile=cfg.expectile, lr=cfg.lr, trunk_lr=c.trunk_lr, alpha=cfg.alpha,
                              feature_dim=data.feature_dim, bf16=cfg.precision == "bfloat16")
        if data.stats is not None and len(data.stats.tools) > 1 and cfg.tool_head != "none":
            log.warning("train: the data calls several tools but the cross head trains no tool head "
                        "(train.head: frozen has one)")
        return {"network": network.to_dict(), "encoder_name": data.encoder_name, "batch_size": c.batch_size}

    def _network(self, config: dict[str, Any]):
        from harnessrl.algorithms.cross import CrossConfig, CrossIQLNetwork, trunk_from_encoder

        cfg = CrossConfig(**config["network"])
        trunk, tokenizer = trunk_from_encoder(config["encoder_name"], cfg.layers, cfg.max_length)
        return cfg, CrossIQLNetwork(cfg, trunk), tokenizer

    def worker(self, config, shard: Iterable, val: Iterable | None, world: int, device, wrap=None) -> WorkerSetup:
        import torch

        from harnessrl.algorithms.cross import CrossLearner

        wrap = wrap or (lambda net: net.to(device))
        rows = load_text_rows(shard)
        n = shard_size(rows)
        cfg, net, tokenizer = self._network(config)
        if cfg.feature_dim:
            net.set_feature_stats(*config["feature_stats"])
        learners = Learners(CrossLearner(cfg, wrap(net), tokenizer))
        learners.critic.net.train()
        use_f = cfg.feature_dim > 0
        reward = torch.from_numpy(rows["reward"] * config["reward_scale"]).to(device)
        done, feats = torch.from_numpy(rows["done"]).to(device), torch.from_numpy(rows["features"]).to(device)
        k = config["candidates_per_step"] if cfg.alpha > 0 and any(rows["cand"]) else 0
        per_worker = max(1, config["batch_size"] // world)

        def step(gen: torch.Generator) -> dict[str, float]:
            idx = torch.randint(n, (per_worker,), generator=gen).tolist()
            cand = cand_mask = cand_f = None
            if k:  # k untaken candidates per state, sampled; padding masked out
                cand, cand_mask = [], torch.zeros(len(idx), k, dtype=torch.bool)
                cand_f = torch.zeros(len(idx), k, feats.shape[1])
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

        validation = None
        if val is not None:
            validation = CrossValidation(load_text_rows(val), config["reward_scale"], cfg.gamma, use_f, config["seed"])
        return WorkerSetup(learners, step, validation)

    def export(self, checkpoint_dir, config, prefix, data: DriverData) -> Exported:
        import torch

        from harnessrl.algorithms.cross import CrossScorer
        from harnessrl.training_state import load_network_weights

        cfg, net, tokenizer = self._network(config)
        load_network_weights(checkpoint_dir, net, name=f"{prefix}state")
        scorer = CrossScorer(net.eval(), tokenizer, cfg.max_length)
        ok = sample_successful(data.calibration_rows, data.n_rows, THRESHOLD_ROWS, data.seed)
        f = torch.from_numpy(ok["features"]) if data.feature_dim else None
        q = scorer.min_q(ok["state_text"], ok["action_text"], f).numpy()
        log.info("train: cross head exported (%s weights); fallback threshold from %d rows", prefix or "last", len(q))
        return Exported(CrossHeadScorer(scorer), q, ood_states=data.training_states(),
                        ood_held_out=data.held_out_states())

    def save(self, directory, scorer: CrossHeadScorer) -> None:
        from harnessrl.algorithms.cross import save_trunk_files
        from harnessrl.model_files import WEIGHTS, save_weights

        save_trunk_files(directory, scorer.scorer.net.trunk, scorer.scorer.tokenizer)
        save_weights(scorer.scorer.net, f"{directory}/{WEIGHTS}")

    def load(self, directory, card, device=None) -> CrossHeadScorer:
        from safetensors.torch import load_file

        from harnessrl.algorithms.cross import CrossConfig, load_cross_network
        from harnessrl.model_files import WEIGHTS

        return CrossHeadScorer(load_cross_network(directory, CrossConfig(**card.head_config),
                                                  load_file(f"{directory}/{WEIGHTS}"), device))
