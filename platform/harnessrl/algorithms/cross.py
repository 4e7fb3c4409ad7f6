"""Cross-encoder IQL critic: the sentence encoder itself, fine-tuned on "state [SEP] action" pairs,
is the trunk of Q and V (`train.head: cross`).

Why: the frozen-embedding head compares two pooled vectors, and pooled vectors lose which object
goes where or which verb the recipe asks for (bench/cross_probe.py). Here every layer attends
across the state and the candidate together. Q(s, a) is a twin MLP on the mean-pooled pair
(plus the history features); V(s) an MLP on the mean-pooled state alone, through the same trunk.

Same losses as harnessrl.algorithms.iql. One difference: there is no target copy of Q. A second
trunk would double memory and the forward cost, which is what a cross-encoder spends its time
on; V regresses to the current min Q, detached (IQL with polyak 1).
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from harnessrl.algorithms.iql import autocast, fp32, iql_objective, make_adam, mlp, run_device, standardised

TRUNK_DIR = "trunk"  # in a critic folder: the trunk's config.json and tokenizer files (weights are in the critic's)


@dataclass
class CrossConfig:
    layers: int = 6  # first transformer layers of the encoder kept (MiniLM has 6)
    max_length: int = 256  # tokens per pair; the longer text is cut first (usually the state, whose end goes)
    hidden_dim: int = 256
    gamma: float = 0.95
    expectile: float = 0.7
    lr: float = 1e-3  # heads
    trunk_lr: float = 3e-5
    alpha: float = 0.0  # candidate-set penalty weight, as in IQLConfig
    feature_dim: int = 0
    bf16: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def shape_trunk(trunk, layers: int | None = None):
    """Keep the first `layers` transformer layers (a small trunk for CPUs; the config says so) and
    drop the pooler: Q and V mean-pool the tokens, and a pooler without gradients stalls DDP."""
    if layers is not None and layers < trunk.config.num_hidden_layers:
        trunk.encoder.layer = trunk.encoder.layer[:layers]
        trunk.config.num_hidden_layers = layers
    if getattr(trunk, "pooler", None) is not None:
        trunk.pooler = None
    return trunk


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


class CrossIQLNetwork(nn.Module):
    """Trunk + twin Q heads + V head; takes tokenised batches (see CrossScorer for texts)."""

    def __init__(self, cfg: CrossConfig, trunk: nn.Module):
        super().__init__()
        self.trunk = trunk
        dim = trunk.config.hidden_size
        self.q1 = mlp(dim + cfg.feature_dim, cfg.hidden_dim)
        self.q2 = mlp(dim + cfg.feature_dim, cfg.hidden_dim)
        self.v_head = mlp(dim, cfg.hidden_dim)
        self.register_buffer("feat_mean", torch.zeros(cfg.feature_dim))
        self.register_buffer("feat_std", torch.ones(cfg.feature_dim))

    def set_feature_stats(self, mean, std) -> None:
        self.feat_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.feat_std.copy_(standardised(std))

    def pooled(self, tokens: dict[str, torch.Tensor]) -> torch.Tensor:
        return mean_pool(self.trunk(**tokens).last_hidden_state, tokens["attention_mask"])

    def q(self, pairs: dict[str, torch.Tensor], f: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.pooled(pairs)
        if self.feat_mean.numel():
            x = torch.cat([x, (f.to(x.dtype) - self.feat_mean) / self.feat_std], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def v(self, states: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.v_head(self.pooled(states)).squeeze(-1)

    def forward(self, pairs, states, next_states, f=None, cand_pairs=None, cand_f=None):
        """Q of the taken pairs, V(s), V(s') (no gradient) and Q of the flattened candidate pairs."""
        q1, q2 = self.q(pairs, f)
        qc = self.q(cand_pairs, cand_f) if cand_pairs is not None else None
        with torch.no_grad():
            v_next = self.v(next_states)
        return q1, q2, self.v(states), v_next, qc


class CrossScorer:
    """Texts in, values out: the tokeniser beside the network, chunked for inference.

    The service scores from several threads at once. Older fast tokenisers fail when called
    concurrently ("Already borrowed": each call resets truncation and padding; huggingface/tokenizers
    #537); transformers 5.24 with tokenizers 0.23 did not in 4,000 calls from 16 threads. Calls to
    the tokeniser are serialised all the same (microseconds); the forward passes are not."""

    CHUNK = 64

    def __init__(self, net: CrossIQLNetwork, tokenizer, max_length: int):
        self.net, self.tokenizer, self.max_length = net, tokenizer, max_length
        self._tokenizer_lock = threading.Lock()

    @property
    def device(self) -> torch.device:
        return next(self.net.parameters()).device

    def pairs(self, states: list[str], actions: list[str]) -> dict[str, torch.Tensor]:
        with self._tokenizer_lock:
            # longest_first: a state cut from its end (its current observation comes first), and an
            # action longer than the budget (a tool call with a large argument) cut too, not refused
            x = self.tokenizer(states, actions, truncation="longest_first", max_length=self.max_length,
                               padding=True, return_tensors="pt")
        return {k: v.to(self.device) for k, v in x.items()}

    def singles(self, texts: list[str]) -> dict[str, torch.Tensor]:
        with self._tokenizer_lock:
            x = self.tokenizer(texts, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt")
        return {k: v.to(self.device) for k, v in x.items()}

    @torch.no_grad()
    def min_q(self, states: list[str], actions: list[str], f: torch.Tensor | None = None) -> torch.Tensor:
        out = [torch.minimum(*self.net.q(self.pairs(states[i:i + self.CHUNK], actions[i:i + self.CHUNK]),
                                         None if f is None else f[i:i + self.CHUNK].to(self.device)))
               for i in range(0, len(states), self.CHUNK)]
        return torch.cat(out).float().cpu() if out else torch.zeros(0)

    @torch.no_grad()
    def value(self, states: list[str]) -> torch.Tensor:
        out = [self.net.v(self.singles(states[i:i + self.CHUNK])) for i in range(0, len(states), self.CHUNK)]
        return torch.cat(out).float().cpu() if out else torch.zeros(0)


def trunk_from_encoder(encoder_name: str, layers: int, max_length: int):
    """(trunk, tokenizer) initialised from a sentence-transformers model (the pipeline's encoder)."""
    from harnessrl.encoders import load_encoder

    st, _ = load_encoder(encoder_name, "cpu", max_length)
    return shape_trunk(st[0].auto_model, layers), st.tokenizer


def save_trunk_files(directory: str | Path, trunk, tokenizer) -> None:
    """The trunk's architecture (config.json) and the tokeniser (JSON and vocab text), not its weights."""
    path = Path(directory) / TRUNK_DIR
    trunk.config.save_pretrained(path)
    tokenizer.save_pretrained(path)


def load_cross_network(directory: str | Path, cfg: CrossConfig, weights: dict[str, torch.Tensor],
                       device: str | None = None) -> CrossScorer:
    """A saved cross critic: the architecture from its config, the weights from safetensors, on
    `device` (default: a GPU when one is visible, as sentence-transformers places the encoder)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from harnessrl.encoders import apply_offline_env

    apply_offline_env()
    path = Path(directory) / TRUNK_DIR
    net = CrossIQLNetwork(cfg, shape_trunk(AutoModel.from_config(AutoConfig.from_pretrained(path))))
    net.load_state_dict(weights)
    net.to(run_device(device))
    return CrossScorer(net.eval(), AutoTokenizer.from_pretrained(path), cfg.max_length)


class CrossLearner:
    """One optimiser over trunk (small learning rate) and heads; `update` takes texts."""

    def __init__(self, cfg: CrossConfig, net: nn.Module, tokenizer):
        self.cfg = cfg
        self.net = net
        self.scorer = CrossScorer(self.core, tokenizer, cfg.max_length)
        self.target_q = None  # see the module docstring
        heads = [p for n, p in self.core.named_parameters() if not n.startswith("trunk.")]
        self.opt = make_adam([{"params": list(self.core.trunk.parameters()), "lr": cfg.trunk_lr},
                              {"params": heads, "lr": cfg.lr}], cfg.lr)
        self.advantage: torch.Tensor | None = None

    @property
    def core(self) -> CrossIQLNetwork:
        return getattr(self.net, "module", self.net)

    def update(self, states: list[str], actions: list[str], r, next_states: list[str], done, f=None,
               cand: list[list[str]] | None = None, cand_mask=None, cand_f=None) -> dict[str, float]:
        """One gradient step. `cand` holds k untaken candidates per state (padded to the same k),
        `cand_mask` (B, k) which exist, `cand_f` (B, k, d_f) their features."""
        cfg, sc = self.cfg, self.scorer
        use_cand = cand is not None and cfg.alpha > 0 and len(cand[0]) > 0
        cand_pairs = flat_f = None
        if use_cand:
            k = len(cand[0])
            cand_pairs = sc.pairs([s for s in states for _ in range(k)], [c for row in cand for c in row])
            flat_f = cand_f.reshape(-1, cand_f.shape[-1]) if cand_f is not None else None
        with autocast(cfg.bf16, sc.device):
            q1, q2, v, v_next, qc = self.net(sc.pairs(states, actions), sc.singles(states), sc.singles(next_states),
                                             f, cand_pairs, flat_f)
        q1, q2, v, v_next = fp32(q1, q2, v, v_next)
        tq = torch.minimum(q1, q2).detach()
        qc = tuple(x.float().reshape(len(states), -1) for x in qc) if use_cand else None
        loss, metrics = iql_objective(cfg, r, done, q1, q2, v, v_next, tq, qc, cand_mask)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.advantage = (tq - v).detach()
        return metrics
