"""The frozen head (`train.head: frozen`, the default before issue 13): twin Q and V MLPs over the
encode stage's frozen sentence embeddings (harnessrl.algorithms.iql), and, when the data calls two
or more tools, the tool head beside it on the same batches (harnessrl.algorithms.discrete).

A worker streams its shard (`Shard.stream`: a local shuffle buffer of rows, epoch after epoch)
and gathers each minibatch's vectors from the distinct-text table the rows reference, so its
memory follows the buffer and the table, not the corpus (`train.replay: memory` holds the shard
instead). At run time the critic embeds the state text and every candidate (through its LRU)
and scores all pairs in one forward pass.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from harnessrl.errors import DataError
from harnessrl.heads.base import (DriverData, Exported, Head, Learners, Scorer, Validation, WorkerSetup,
                                  exported_tool_head, successful_mask, tool_head_config)

CHUNK = 8192  # rows per forward pass when scoring the whole dataset
VALIDATION_ROWS = 8192  # held-out rows each validation scores: a seeded sample of a larger held-out set


def validation_sample(val, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """The held-out rows a worker validates on, their vectors gathered once (`val`: its Shard). The
    sample is by row key, so every rank holds the same rows and agrees on the best step."""
    from harnessrl.encoded_data import load_arrays, sampled

    share = VALIDATION_ROWS / max(config.get("val_rows") or 1, 1)
    return load_arrays([sampled(b, share, config["seed"]) for b in val], candidates=False,
                       vectors=getattr(val, "vectors", None))


class FrozenValidation(Validation):
    CHUNK = 4096

    def __init__(self, data: dict[str, np.ndarray], reward_scale: float, gamma: float, use_f: bool):
        import torch

        keys = ("state_emb", "action_emb", "next_state_emb", "reward", "done") + (("features",) if use_f else ())
        self.t = {k: torch.from_numpy(data[k]) for k in keys}
        self.t["reward"] = self.t["reward"] * reward_scale
        self.gamma, self.n = gamma, len(data["reward"])
        super().__init__()

    def score(self, learners: Learners) -> float:
        import torch

        net, total = learners.critic.core, 0.0
        dev = next(net.parameters()).device
        with torch.no_grad():
            for i in range(0, self.n, self.CHUNK):
                t = {k: v[i:i + self.CHUNK].to(dev) for k, v in self.t.items()}
                q = net.q.min_q(t["state_emb"], t["action_emb"], t.get("features"))
                target = t["reward"] + self.gamma * (1 - t["done"]) * net.v(t["next_state_emb"])
                total += float((q.float() - target.float()).abs().sum())
        return total / self.n


class FrozenScorer(Scorer):
    def __init__(self, net):
        self.net = net.eval()
        self.uses_features = bool(net.q.feat_mean.numel())

    def embed_texts(self, states, candidates) -> list[str]:
        return list(dict.fromkeys([*(p.text for p in states), *(c for cands in candidates for c in cands)]))

    def q(self, states, candidates, features, embed) -> np.ndarray:
        import torch

        texts = self.embed_texts(states, candidates)
        index = {t: i for i, t in enumerate(texts)}
        emb = torch.from_numpy(np.asarray(embed(texts), np.float32))
        s_idx = [index[p.text] for p, cands in zip(states, candidates) for _ in cands]
        a_idx = [index[c] for cands in candidates for c in cands]
        f = torch.as_tensor(features, dtype=torch.float32) if features is not None else None
        with torch.no_grad():
            return self.net.q.min_q(emb[s_idx], emb[a_idx], f).numpy()

    def values(self, states, actions, next_states, features, embed):
        import torch

        states, next_states = [p.text for p in states], [p.text for p in next_states]
        texts = list(dict.fromkeys([*states, *actions, *next_states]))
        index = {t: i for i, t in enumerate(texts)}
        emb = torch.from_numpy(np.asarray(embed(texts), np.float32))
        f = torch.as_tensor(np.asarray(features), dtype=torch.float32) if self.uses_features else None
        s, s2 = emb[[index[t] for t in states]], emb[[index[t] for t in next_states]]
        with torch.no_grad():
            q = self.net.q.min_q(s, emb[[index[t] for t in actions]], f)
            return q.numpy(), self.net.v(s).numpy(), self.net.v(s2).numpy()


class FrozenHead(Head):
    kind = "frozen"

    def loop_config(self, cfg, data: DriverData) -> dict[str, Any]:
        from harnessrl.algorithms.iql import IQLConfig

        if data.stats.states is None:
            raise DataError("the encoded data has no state embeddings (encoded with encoder.state_texts: false, for "
                            "train.head: reader): the frozen head needs them; rerun the encode stage")
        network = IQLConfig(state_dim=data.stats.dim, action_dim=data.stats.dim,
                            hidden_dim=cfg.hidden_dim, gamma=cfg.gamma, expectile=cfg.expectile, polyak=cfg.polyak,
                            lr=cfg.lr, alpha=cfg.alpha, feature_dim=data.feature_dim,
                            bf16=cfg.precision == "bfloat16")
        tool_head, vocab = tool_head_config(cfg, data.stats.tools, network.state_dim, data.stats.defined_tools)
        return {"network": network.to_dict(), "tool_head": tool_head, "tool_vocab": vocab}

    def worker(self, config, shard: Iterable, val: Iterable | None, world: int, device, wrap=None) -> WorkerSetup:
        import torch

        from harnessrl.algorithms.iql import IQLConfig, IQLLearner, IQLNetwork

        wrap = wrap or (lambda net: net.to(device))
        cfg = IQLConfig(**config["network"])
        net = IQLNetwork(cfg)
        if cfg.feature_dim:
            net.q.set_feature_stats(*config["feature_stats"])  # before DDP, which broadcasts buffers
        learners = Learners.with_tool_head(IQLLearner(cfg, wrap(net)), config, wrap)
        use_f, use_cand = cfg.feature_dim > 0, cfg.alpha > 0
        per_worker = max(1, config["batch_size"] // world)
        # the shard streams (a shuffle buffer of rows, their vectors gathered a batch at a time) or is held whole
        batches = (shard.sample(per_worker, config["seed"], candidates=use_cand) if config.get("replay") == "memory"
                   else shard.stream(per_worker, config["seed"], config.get("shuffle_buffer", 0), candidates=use_cand))

        def step(gen: torch.Generator) -> dict[str, float]:
            b = next(batches)
            t = {k: torch.from_numpy(b[k]).to(device) for k in ("state_emb", "action_emb", "next_state_emb", "reward",
                                                                "done")}
            s, s2, done, r = t["state_emb"], t["next_state_emb"], t["done"], t["reward"] * config["reward_scale"]
            f = torch.from_numpy(b["features"]).to(device) if use_f else None
            cand = cand_mask = cand_f = None
            if use_cand and "cand" in b and b["cand"].shape[1] > 0:
                # a few untaken candidates per state keep the penalty's cost bounded
                cols = torch.randperm(b["cand"].shape[1], generator=gen)[: config["candidates_per_step"]].numpy()
                cand = torch.from_numpy(b["cand"][:, cols]).to(device)
                cand_mask = torch.from_numpy(b["cand_mask"][:, cols]).to(device)
                cand_f = torch.from_numpy(b["cand_f"][:, cols]).to(device) if use_f else None
            metrics = learners.critic.update(s, t["action_emb"], r, s2, done, f, cand, cand_mask, cand_f)
            metrics.update(learners.update_tools(config["tool_vocab"], s, b["tool"].tolist(), r, s2, done))
            return metrics

        validation = None
        if val is not None:
            validation = FrozenValidation(validation_sample(val, config), config["reward_scale"], cfg.gamma, use_f)
        return WorkerSetup(learners, step, validation)

    def export(self, checkpoint_dir, config, prefix, data: DriverData) -> Exported:
        import torch

        from harnessrl.algorithms.iql import IQLConfig, IQLNetwork
        from harnessrl.training_state import load_network_weights

        net = IQLNetwork(IQLConfig(**config["network"]))
        load_network_weights(checkpoint_dir, net, name=f"{prefix}state")
        net.eval()
        tools = exported_tool_head(checkpoint_dir, config, prefix)
        q, ok = [], []  # Q(s, a) of every calibration row, a batch at a time; the rows of successful episodes kept
        with torch.no_grad():
            for arrays in data.calibration_arrays():
                s, a = torch.from_numpy(arrays["state_emb"]), torch.from_numpy(arrays["action_emb"])
                f = torch.from_numpy(arrays["features"]) if data.feature_dim else None
                q += [net.q.min_q(s[i:i + CHUNK], a[i:i + CHUNK], f[i:i + CHUNK] if f is not None else None)
                      for i in range(0, len(s), CHUNK)]
                ok.append(arrays["outcome_success"])
        q = torch.cat(q).numpy() if q else np.zeros(0, np.float32)
        mask = successful_mask(np.concatenate(ok)) if ok else np.zeros(0, bool)
        return Exported(FrozenScorer(net), q[mask], tools, ood_states=data.training_states(),
                        ood_held_out=data.held_out_states())

    def save(self, directory, scorer: FrozenScorer) -> None:
        from harnessrl.model_files import WEIGHTS, save_weights

        save_weights(scorer.net, f"{directory}/{WEIGHTS}")

    def load(self, directory, card, device=None) -> FrozenScorer:
        from harnessrl.algorithms.iql import IQLConfig, IQLNetwork
        from harnessrl.model_files import WEIGHTS, load_weights

        net = IQLNetwork(IQLConfig(**card.head_config))
        load_weights(net, f"{directory}/{WEIGHTS}")
        return FrozenScorer(net)
