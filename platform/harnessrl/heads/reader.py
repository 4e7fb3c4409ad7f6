"""The reader head (`train.head: reader`, harnessrl.algorithms.reader): Q and V over the state's
segments (harnessrl.render.state_segments), each read through its frozen sentence embedding
(standardised per role) and optionally its tokens (the encoder's frozen word embeddings, a small
trainable convolution), the candidates attending over the segments, with exact-match signals.
Where the data calls two or more tools, the tool head (harnessrl.algorithms.discrete) trains beside
it on the embedding of the state's observation, weighted by the reader's advantage.

A worker streams its shard's rows (segments, candidates, features) through a local shuffle buffer
(`train.replay: stream`; `memory` holds them) and reads the sentence embeddings of the texts they
name by content hash in the encode stage's distinct-text table (`_texts`): references, not copies.
The tokenizer and the frozen word-embedding table come from the encoder's own files, at training
and at serving alike; only the trained weights are saved.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Iterable, Sequence

import numpy as np

from harnessrl.encoded_data import HELD_OUT_STATES, SAMPLE_STATES, sampled
from harnessrl.errors import DataError
from harnessrl.heads.base import (DriverData, Exported, Head, Learners, Scorer, Validation, WorkerSetup,
                                  exported_tool_head, shard_size, successful_mask, tool_head_config)
from harnessrl.heads.reader_inputs import Inputs, Seg, Tokens, as_tensors, assemble, without_history
from harnessrl.render import EMBEDDED_ROLES
from harnessrl.transitions import untaken_candidates

log = logging.getLogger(__name__)
ROW_COLUMNS = ("state_segments", "next_state_segments", "action_text", "candidates", "features", "candidate_features",
               "reward", "done", "outcome_success", "tool")
STATE_ROLES = ("observation", "text")  # the segment that stands for the state (OOD check, tool head)
VALIDATION_ROWS = 1024  # held-out rows scored per validation
THRESHOLD_ROWS = 4096  # rows of successful episodes scored for the fallback threshold
CHUNK = 64  # states per forward pass when scoring
STD_FLOOR = 1e-2  # a role's per-dimension scale is at least this share of the scale over every segment


def word_embeddings(encoder_name: str) -> np.ndarray:
    """The encoder's frozen word-embedding table (vocabulary x dim), read from its safetensors file
    (no model is loaded; the encoder identity's weight hash covers the file)."""
    from pathlib import Path

    from safetensors import safe_open

    from harnessrl.encoders import resolve_model_path

    folder = Path(resolve_model_path(encoder_name))
    for path in sorted(folder.rglob("*.safetensors")):
        with safe_open(str(path), "np") as fh:
            for key in fh.keys():
                if key.endswith("word_embeddings.weight"):
                    return fh.get_tensor(key).astype(np.float32)
    raise DataError(f"encoder {encoder_name!r}: no word-embedding table (*word_embeddings.weight) in the "
                    f"safetensors files of {folder}: the reader head needs one")


def take(rows: dict[str, Any], idx: Sequence[int]) -> dict[str, Any]:
    """The rows `idx` of a `load_rows` output."""
    return {k: v[idx] if isinstance(v, np.ndarray) else [v[i] for i in idx] for k, v in rows.items()}


def _segs(value) -> list[Seg]:
    return [(s["role"], int(s["age"]), s["text"]) for s in value or ()]


def state_text(segs: Sequence[Seg], default: str = "") -> str:
    """The current observation: the one text that stands for a state of this head."""
    return next((t for r, _, t in segs if r in STATE_ROLES), default)


def load_rows(batches) -> dict[str, Any]:
    """Transition rows as lists: segments, the taken action, the untaken candidates aligned with
    their features; arrays of reward, done, features, outcome."""
    cols: dict[str, list] = {k: [] for k in ROW_COLUMNS}
    for b in batches:
        if "state_segments" not in b.column_names:
            raise DataError("the transitions have no state_segments (made before the reader head existed): rerun the "
                            "transitions stage (harnessrl run --force)")
        for k in ROW_COLUMNS:
            cols[k].extend(b.column(k).to_pylist() if k in b.column_names else [None] * b.num_rows)
    n = len(cols["reward"])
    out: dict[str, Any] = {"s": [_segs(x) for x in cols["state_segments"]],
                           "n": [_segs(x) for x in cols["next_state_segments"]], "action": cols["action_text"],
                           "tool": cols["tool"]}
    out["reward"] = np.asarray(cols["reward"], np.float32)
    out["done"] = np.asarray(cols["done"], np.float32)
    out["outcome_success"] = np.array([bool(x) for x in cols["outcome_success"]], bool)
    out["features"] = np.asarray([f or [] for f in cols["features"]], np.float32).reshape(n, -1) if n else \
        np.zeros((0, 0), np.float32)
    out["cand"], out["cand_f"] = [], []
    for action, cands, cand_f in zip(cols["action_text"], cols["candidates"], cols["candidate_features"]):
        # the encoded data keeps the features of a prefix of the untaken candidates: those are the ones used
        untaken = untaken_candidates(action, cands, len(cand_f) if cand_f is not None else None)
        out["cand"].append(untaken)
        out["cand_f"].append(list(cand_f or [])[: len(untaken)])
    return out


def _text_table(texts_dir: str):
    """(hash -> row, matrix float32) of the encode stage's distinct-text table."""
    from harnessrl import storage
    from harnessrl.embedding_cache import emb_matrix

    table = storage.read_parquet(texts_dir, ["text_hash", "emb"])
    matrix = emb_matrix(table.column("emb"), len(table.column("emb")[0]) if table.num_rows else 1)
    return {h: i for i, h in enumerate(table.column("text_hash").to_pylist())}, matrix.astype(np.float32)


def table_embed(texts_dir: str, missing=None):
    """texts -> (n, dim) sentence embeddings from the encoded dataset's `_texts` table; a text it
    lacks is an error, or embedded by `missing` (texts -> (m, dim)) when given."""
    from harnessrl.encoders import text_hash

    index, matrix = _text_table(texts_dir)

    def embed(texts: Sequence[str]) -> np.ndarray:
        rows = [index.get(text_hash(t), -1) for t in texts]
        lacking = [i for i, r in enumerate(rows) if r < 0]
        if lacking and missing is None:
            raise DataError(f"the encoded data has no embedding for {texts[lacking[0]][:80]!r}: the reader head needs "
                            "the state segments embedded (encoder.segments: true, the default with train.head: "
                            "reader); rerun the encode stage")
        out = matrix[np.maximum(rows, 0)] if rows else matrix[:0]
        if lacking:
            out[lacking] = missing([texts[i] for i in lacking])
        return out

    return embed


def role_stats(parts: Iterable[dict[str, Any]], embed, sem_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Per role, the mean and scale of the distinct texts' sentence embeddings (the candidate role:
    actions and candidates): what differs among observations, not between an observation and a task.
    `parts`: `load_rows` outputs, read one at a time (each distinct text is embedded once; what is
    held is the set of texts seen, not the rows)."""
    from harnessrl.algorithms.reader import ROLE_ID, ROLES

    seen: dict[str, set[str]] = {}
    sums: dict[str, np.ndarray] = {}  # role ("" for every role) -> [count, sum..., sum of squares...]

    def add(role: str, texts: set[str]) -> None:
        known = seen.setdefault(role, set())
        new = sorted(texts - known)
        known.update(new)
        if new:
            v = embed(new).astype(np.float64)
            acc = sums.setdefault(role, np.zeros(1 + 2 * sem_dim))
            acc += np.concatenate([[len(new)], v.sum(0), (v * v).sum(0)])

    for rows in parts:
        by_role: dict[str, set[str]] = {}
        for segs in (*rows["s"], *rows["n"]):
            for r, _, t in segs:
                if r in EMBEDDED_ROLES:
                    by_role.setdefault(r, set()).add(t)
        by_role["candidate"] = set(rows["action"]) | {c for cands in rows["cand"] for c in cands}
        for role, texts in by_role.items():
            add(role, texts)
        add("", set().union(*by_role.values()))

    def moments(role: str) -> tuple[np.ndarray, np.ndarray]:
        acc = sums[role]
        mean = acc[1:1 + sem_dim] / acc[0]
        return mean, np.sqrt(np.maximum(acc[1 + sem_dim:] / acc[0] - mean * mean, 0.0))

    g_mean, g_std = moments("") if "" in sums else (np.zeros(sem_dim), np.zeros(sem_dim))
    g_std = np.maximum(g_std, 1e-6)
    mean, std = np.tile(g_mean, (len(ROLES), 1)), np.tile(g_std, (len(ROLES), 1))
    for role in sums:
        if role and len(seen[role]) >= 2:
            m, sd = moments(role)
            mean[ROLE_ID[role]], std[ROLE_ID[role]] = m, np.maximum(sd, STD_FLOOR * g_std)
    return mean.astype(np.float32), std.astype(np.float32)


def _inputs(cfg, encoder_name: str, embed) -> Inputs:
    from harnessrl.tokens import load_tokenizer

    word = word_embeddings(encoder_name) if cfg.tokens else np.zeros((0, cfg.word_dim), np.float32)
    return Inputs(Tokens(load_tokenizer(encoder_name), cfg.segment_tokens), word, embed if cfg.semantic else None,
                  cfg.sem_dim, token_path=cfg.tokens, match=cfg.match)


def penalty_mask(candidates: Sequence[Sequence[str]], k: int, seen: set, where: Sequence[str] | None = None
                 ) -> np.ndarray:
    """(B, k - 1): which untaken candidates (each list's entries after the first, the taken action)
    the candidate penalty applies to: those present and not in `seen` (actions taken elsewhere in the
    data, whose values the TD loss learns where they were taken); with `where` (each state's text),
    `seen` holds `taken_here` keys: a candidate taken elsewhere but never from this state is penalised."""
    out = np.zeros((len(candidates), max(0, k - 1)), bool)
    for i, cands in enumerate(candidates):
        for j, c in enumerate(cands[1:]):
            out[i, j] = (c if where is None else taken_here(where[i], c)) not in seen
    return out


def _taken_at(batch, here: bool) -> Iterable[tuple[str, str]]:
    """A transitions batch's (action, where it was taken): the state's text with `here`, else the
    action again (the state's segments are decoded only when asked for)."""
    actions = batch.column("action_text").to_pylist()
    if not here:
        return zip(actions, actions)
    return zip(actions, (state_text(_segs(s)) for s in batch.column("state_segments").to_pylist()))


def taken_here(state: str, action: str) -> int:
    """The key of (state text, action) in a set of those taken: a hash, not the texts (one per row)."""
    return hash((state, action))


def _features(per_state: Sequence[Sequence[Sequence[float]]], k: int, dim: int) -> np.ndarray:
    out = np.zeros((len(per_state), k, dim), np.float32)
    for i, rows in enumerate(per_state):
        if len(rows):
            out[i, : len(rows)] = np.asarray(rows, np.float32)
    return out


class ReaderValidation(Validation):
    def __init__(self, rows: dict[str, Any], inputs: Inputs, reward_scale: float, gamma: float, use_f: bool):
        self.pick = np.arange(min(len(rows["reward"]), VALIDATION_ROWS))  # rows: already a keyed sample
        self.rows, self.inputs, self.scale, self.gamma, self.use_f = rows, inputs, reward_scale, gamma, use_f
        super().__init__()

    def score(self, learners: Learners) -> float:
        import torch

        net, rows, total = learners.critic.core, self.rows, 0.0
        dev = next(net.parameters()).device
        net.eval()
        try:
            with torch.no_grad():
                for i in range(0, len(self.pick), CHUNK):
                    idx = self.pick[i:i + CHUNK]
                    b = as_tensors(assemble(self.inputs, [rows["s"][j] for j in idx], [[rows["action"][j]] for j in idx],
                                            [rows["n"][j] for j in idx]), dev)
                    f = torch.from_numpy(rows["features"][idx][:, None, :]).to(dev) if self.use_f else None
                    q1, q2, _, v_next = net(b, f)
                    r = torch.from_numpy(rows["reward"][idx] * self.scale).to(dev)
                    done = torch.from_numpy(rows["done"][idx]).to(dev)
                    target = r + self.gamma * (1 - done) * v_next
                    total += float((torch.minimum(q1, q2)[:, 0] - target).abs().sum())
        finally:
            net.train()
        return total / max(1, len(self.pick))


class ReaderScorer(Scorer):
    """Scores on the device its network is on (`ReaderHead.load`'s: a GPU when one is visible)."""

    def __init__(self, net, inputs: Inputs, prior=None):
        self.net, self.inputs = net.eval(), inputs
        self.device = next(net.parameters()).device
        self.uses_features = bool(net.feat_mean.numel())
        self.prior = prior  # (network, inputs) of the behaviour prior (harnessrl.behaviour_prior), or None

    @property
    def has_prior(self) -> bool:
        return self.prior is not None

    def prior_logprobs(self, states, candidates, embed) -> list[list[float]]:
        """log pi_beta(candidate | state) under the behaviour prior, per state over its candidates."""
        from harnessrl.behaviour_prior import log_probabilities

        net, inputs = self.prior
        inputs = replace(inputs, embed=embed if net.cfg.semantic else None)
        segs = [[(s.role, s.age, s.text) for s in p.segments] for p in states]
        out = []
        for i in range(0, len(segs), CHUNK):
            out += log_probabilities(net, inputs, segs[i:i + CHUNK], candidates[i:i + CHUNK], self.device)
        return out

    def state_text(self, state) -> str:
        """The current observation (no rendered state is embedded for this head)."""
        return state_text([(s.role, s.age, s.text) for s in state.segments], state.text)

    def embed_texts(self, states, candidates) -> list[str]:
        if not self.net.cfg.semantic:
            return []
        return list(dict.fromkeys([s.text for p in states for s in p.segments if s.role in EMBEDDED_ROLES]
                                  + [c for cands in candidates for c in cands]))

    def _q(self, segs: Sequence[Sequence[Seg]], candidates: Sequence[Sequence[str]], features, embed) -> np.ndarray:
        import torch

        inputs = replace(self.inputs, embed=embed if self.net.cfg.semantic else None)
        out, pos = [], 0
        with torch.no_grad():
            for i in range(0, len(segs), CHUNK):
                part, cands = segs[i:i + CHUNK], candidates[i:i + CHUNK]
                b = as_tensors(assemble(inputs, part, cands), self.device)
                f = None
                if self.uses_features:
                    n = sum(len(c) for c in cands)
                    flat = np.asarray(features[pos:pos + n], np.float32)
                    per, k = [], 0
                    for c in cands:
                        per.append(flat[k:k + len(c)])
                        k += len(c)
                    f = torch.from_numpy(_features(per, b["k_mask"].shape[1], flat.shape[1])).to(self.device)
                    pos += n
                x = self.net.stream(b)
                q = torch.minimum(*self.net.q(self.net.state(x, b, "s"), x, b, f)).cpu()
                out += [q[j, : len(c)].numpy() for j, c in enumerate(cands)]
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def q(self, states, candidates, features, embed) -> np.ndarray:
        return self._q([[(s.role, s.age, s.text) for s in p.segments] for p in states], candidates, features, embed)

    def values(self, states, actions, next_states, features, embed):
        import torch

        q = self._q([[(s.role, s.age, s.text) for s in p.segments] for p in states], [[a] for a in actions],
                    features, embed)
        inputs = replace(self.inputs, embed=embed if self.net.cfg.semantic else None)
        vs = []
        with torch.no_grad():
            for group in (states, next_states):
                segs = [[(s.role, s.age, s.text) for s in p.segments] for p in group]
                out = []
                for i in range(0, len(segs), CHUNK):
                    b = as_tensors(assemble(inputs, segs[i:i + CHUNK], [[""] for _ in segs[i:i + CHUNK]]), self.device)
                    x = self.net.stream(b)
                    out.append(self.net.v(self.net.state(x, b, "s")).cpu().numpy())
                vs.append(np.concatenate(out) if out else np.zeros(0, np.float32))
        return q, vs[0], vs[1]


def network_config(cfg, dim: int, encoder_name: str, feature_dim: int):
    """The ReaderConfig of a TrainConfig `cfg`, for sentence vectors of `dim` and `feature_dim`
    history features (the token path's word size read from the encoder's table)."""
    from harnessrl.algorithms.reader import ReaderConfig

    r = cfg.reader
    return ReaderConfig(sem_dim=dim, word_dim=int(word_embeddings(encoder_name).shape[1]) if r.tokens else dim,
                        dim=r.dim, conv_layers=r.conv_layers, segment_tokens=r.segment_tokens,
                        hidden_dim=cfg.hidden_dim, semantic=r.semantic, tokens=r.tokens, match=r.match,
                        dueling=r.dueling, value_target=r.value_target, gamma=cfg.gamma, expectile=cfg.expectile,
                        polyak=cfg.polyak, lr=r.lr, alpha=cfg.alpha, feature_dim=feature_dim,
                        bf16=cfg.precision == "bfloat16")


class ReaderHead(Head):
    kind = "reader"

    def loop_config(self, cfg, data: DriverData) -> dict[str, Any]:
        from harnessrl import storage

        r = cfg.reader
        dim = data.stats.dim
        network = network_config(cfg, dim, data.encoder_name, data.feature_dim)
        texts_dir = storage.join(data.encoded_dir, "_texts")
        stats = None
        if r.semantic:
            parts = (load_rows([b]) for b in data.ds.select_columns(list(ROW_COLUMNS)).iter_batches(
                batch_size=8192, batch_format="pyarrow"))  # streamed: the driver never holds the corpus
            mean, std = role_stats(parts, table_embed(texts_dir), dim)
            stats = {"mean": mean.tolist(), "std": std.tolist()}
        # the tool head reads the embedding of the state's observation (Critic.state_text)
        tool_head, vocab = tool_head_config(cfg, data.stats.tools, dim, data.stats.defined_tools)
        return {"network": network.to_dict(), "encoder_name": data.encoder_name, "texts_dir": texts_dir,
                "role_stats": stats, "batch_size": r.batch_size, "history_dropout": r.history_dropout,
                "penalty_on": r.penalty_on, "tool_head": tool_head, "tool_vocab": vocab,
                "prior_steps": r.prior_steps, "prior_rows": r.prior_rows}

    def _network(self, config: dict[str, Any]):
        from harnessrl.algorithms.reader import ReaderConfig, ReaderNetwork

        cfg = ReaderConfig(**config["network"])
        net = ReaderNetwork(cfg)
        stats = config.get("role_stats") or {"mean": net.sem_mean, "std": net.sem_std}
        net.set_stats(stats["mean"], stats["std"], *(config.get("feature_stats") or (None, None)))
        return cfg, net

    def worker(self, config, shard: Iterable, val: Iterable | None, world: int, device, wrap=None) -> WorkerSetup:
        import torch

        from harnessrl.algorithms.reader import ReaderLearner

        wrap = wrap or (lambda net: net.to(device))
        cfg, net = self._network(config)
        learners = Learners.with_tool_head(ReaderLearner(cfg, wrap(net)), config, wrap)
        lookup = table_embed(config["texts_dir"]) if cfg.semantic or learners.tools is not None else None
        embed = lookup if cfg.semantic else None
        inputs = _inputs(cfg, config["encoder_name"], embed)
        use_f = cfg.feature_dim > 0
        k_extra = config["candidates_per_step"] if cfg.alpha > 0 or cfg.value_target != "taken" else 0
        per_worker = max(1, config["batch_size"] // world)
        drop_share = config.get("history_dropout", 0.0)
        # the penalty's candidates: never taken anywhere in this worker's data ("unseen"), never taken from
        # this state's observation ("unseen_here"), or all untaken ones; value_target "supported" maximises
        # over the candidates taken from the observation: the pairs taken here are keyed by place
        penalty_on = config.get("penalty_on", "untaken") if cfg.alpha > 0 else "untaken"
        by_action = penalty_on == "unseen"
        here = penalty_on == "unseen_here" or cfg.value_target == "supported"
        # minibatches: the shard streamed through a shuffle buffer (train.replay: stream), or held and sampled
        if config.get("replay") == "memory":
            held = load_rows(shard)
            n = shard_size(held)
            taken = zip(held["action"], map(state_text, held["s"]) if here else held["action"])  # read once

            def draw(gen: torch.Generator) -> dict[str, Any]:
                return take(held, torch.randint(n, (per_worker,), generator=gen).tolist())
        else:
            tables = shard.tables(per_worker, config["seed"], config.get("shuffle_buffer", 0))
            taken = (pair for b in (shard if by_action or here else ()) for pair in _taken_at(b, here))

            def draw(gen: torch.Generator) -> dict[str, Any]:
                return load_rows([next(tables)])
        seen, seen_here = set(), set()
        for a, where in taken if by_action or here else ():
            if by_action:
                seen.add(a)
            if here:
                seen_here.add(taken_here(where, a))

        def step(gen: torch.Generator) -> dict[str, float]:
            rows = draw(gen)
            idx = range(len(rows["reward"]))
            drop = (torch.rand(len(idx), generator=gen) < drop_share).tolist()
            dim_f = rows["features"].shape[1] if use_f else 0
            cands, feats = [], []
            for i in idx:
                picks = torch.randperm(len(rows["cand"][i]), generator=gen)[:k_extra].tolist() if k_extra else []
                cands.append([rows["action"][i]] + [rows["cand"][i][p] for p in picks])
                if use_f:
                    cf = rows["cand_f"][i]
                    feats.append([rows["features"][i]] + [cf[p] if p < len(cf) else [0.0] * dim_f for p in picks])
            states = [without_history(rows["s"][i]) if d else rows["s"][i] for i, d in zip(idx, drop)]
            batch = assemble(inputs, states, cands, [rows["n"][i] for i in idx])
            if k_extra:
                k = batch["k_mask"].shape[1]
                # untaken candidates never taken from the state's observation: computed once for both uses
                unseen_here = penalty_mask(cands, k, seen_here, [state_text(s) for s in states]) if here else None
                if cfg.alpha > 0:  # the learner reads p_mask only with a penalty
                    batch["p_mask"] = unseen_here if penalty_on == "unseen_here" else penalty_mask(cands, k, seen)
                if cfg.value_target == "supported":  # the taken action, and candidates taken from here
                    batch["v_mask"] = batch["k_mask"] & ~np.pad(unseen_here, ((0, 0), (1, 0)))
            b = as_tensors(batch, device)
            f = None
            if use_f:  # a state without its history has all-zero history features
                f = torch.from_numpy(_features(feats, b["k_mask"].shape[1], dim_f) * ~np.array(drop)[:, None, None])
                f = f.to(device)
            r = torch.from_numpy(rows["reward"] * config["reward_scale"]).to(device)
            done = torch.from_numpy(rows["done"]).to(device)
            metrics = learners.critic.update(b, r, done, f)
            if learners.tools is not None:
                s, s2 = (torch.from_numpy(lookup([state_text(rows[key][i]) for i in idx])).to(device)
                         for key in ("s", "n"))
                metrics.update(learners.update_tools(config["tool_vocab"], s, [rows["tool"][i] for i in idx], r, s2,
                                                     done))
            return metrics

        validation = None
        if val is not None:
            # a keyed sample of the held-out rows, the same on every rank
            share = VALIDATION_ROWS / max(config.get("val_rows") or 1, 1)
            validation = ReaderValidation(load_rows(sampled(b, share, config["seed"]) for b in val), inputs,
                                          config["reward_scale"], cfg.gamma, use_f)
        return WorkerSetup(learners, step, validation)

    def export(self, checkpoint_dir, config, prefix, data: DriverData) -> Exported:
        from harnessrl.training_state import load_network_weights

        cfg, net = self._network(config)
        load_network_weights(checkpoint_dir, net, name=f"{prefix}state")
        tools = exported_tool_head(checkpoint_dir, config, prefix)
        embed = table_embed(config["texts_dir"]) if cfg.semantic else None
        scorer = ReaderScorer(net, _inputs(cfg, config["encoder_name"], embed),
                              self._train_prior(cfg, config, data) if config.get("prior_steps") else None)
        held_rows = data.calibration_n
        rows = load_rows(data.sample(data.calibration_rows, held_rows, THRESHOLD_ROWS, list(ROW_COLUMNS)))
        ok = np.flatnonzero(successful_mask(rows["outcome_success"]))
        q = scorer._q([rows["s"][i] for i in ok], [[rows["action"][i]] for i in ok],
                      rows["features"][ok] if scorer.uses_features else None, embed)
        log.info("train: reader head exported (%s weights); fallback threshold from %d rows", prefix or "last", len(q))
        lookup = embed or table_embed(config["texts_dir"])

        def observations(ds, n_rows: int, limit: int) -> np.ndarray | None:
            """The distinct observations of a keyed sample of the rows, embedded: bounded, whatever the corpus."""
            found = set()
            for b in data.sample(ds, n_rows, limit, ["state_segments"]):
                found.update(state_text(_segs(row)) for row in b.column("state_segments").to_pylist())
            return lookup(sorted(found)) if found else None

        return Exported(scorer, q, tools, ood_states=observations(*data.training, SAMPLE_STATES),
                        ood_held_out=observations(data.calibration, held_rows, HELD_OUT_STATES)
                        if data.calibration is not None else None)

    def _train_prior(self, cfg, config: dict[str, Any], data: DriverData):
        """The behaviour prior, cloned on the driver from a keyed sample of the training rows (None when no
        step logged an untaken candidate)."""
        from harnessrl.behaviour_prior import examples, train_listwise

        rows = load_rows(data.sample(*data.training, config["prior_rows"], list(ROW_COLUMNS)))
        chosen = examples(rows)
        if not chosen:
            log.warning("train: no training step logged an untaken candidate: no behaviour prior")
            return None
        paths = {"semantic": cfg.semantic, "tokens": cfg.tokens, "match": cfg.match}
        net, inputs, progress = train_listwise(chosen, table_embed(config["texts_dir"]), config["encoder_name"], paths,
                                               config["prior_steps"], seed=config["seed"])
        log.info("train: behaviour prior from %d steps with candidates: %s", len(chosen), progress)
        return net, inputs

    def save(self, directory, scorer: ReaderScorer) -> None:
        import json

        from harnessrl.behaviour_prior import PRIOR_CONFIG, PRIOR_WEIGHTS
        from harnessrl.model_files import WEIGHTS, save_weights

        save_weights(scorer.net, f"{directory}/{WEIGHTS}")
        if getattr(scorer, "prior", None) is not None:
            save_weights(scorer.prior[0], f"{directory}/{PRIOR_WEIGHTS}")
            with open(f"{directory}/{PRIOR_CONFIG}", "w") as f:
                json.dump(scorer.prior[0].cfg.to_dict(), f, indent=1)

    def load(self, directory, card, device=None) -> ReaderScorer:
        from harnessrl.algorithms.reader import VERSION, ReaderConfig
        from harnessrl.errors import ModelError
        from harnessrl.model_files import WEIGHTS

        if card.head_config.get("version") != VERSION:
            raise ModelError(f"critic {directory}: a reader network of version {card.head_config.get('version', 1)}; "
                             f"this release reads version {VERSION}: train it again")
        cfg = ReaderConfig(**card.head_config)
        net = _loaded(cfg, f"{directory}/{WEIGHTS}", device)
        return ReaderScorer(net, _inputs(cfg, card.identity.model_name, None),
                            load_prior(directory, card.identity.model_name, device))


def _loaded(cfg, weights: str, device=None):
    """A reader network of `cfg` with the weights of a safetensors file, on `device` (default: a GPU when
    one is visible)."""
    from harnessrl.algorithms.iql import run_device
    from harnessrl.algorithms.reader import ReaderNetwork
    from harnessrl.model_files import load_weights

    net = ReaderNetwork(cfg)
    load_weights(net, weights)
    return net.to(run_device(device))


def load_prior(directory, encoder_name: str, device=None):
    """The behaviour prior saved beside a critic's weights ((network, inputs)), or None when it has none."""
    import json
    from pathlib import Path

    from harnessrl.algorithms.reader import ReaderConfig
    from harnessrl.behaviour_prior import PRIOR_CONFIG, PRIOR_WEIGHTS

    if not (Path(directory) / PRIOR_WEIGHTS).is_file():
        return None
    cfg = ReaderConfig(**json.loads((Path(directory) / PRIOR_CONFIG).read_text()))
    return _loaded(cfg, f"{directory}/{PRIOR_WEIGHTS}", device), _inputs(cfg, encoder_name, None)
