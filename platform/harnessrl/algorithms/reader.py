"""The reader network (`train.head: reader`, harnessrl.heads.reader): Q(s, a) and V(s) over a state
given as segments (harnessrl.render.state_segments), not as one pooled vector.

Why: one pooled sentence vector per state blurs the number, recipe line or item that decides a
choice (the states of a 4x4 grid rendered in words have pairwise MiniLM cosines of 0.993-0.9997).
Each segment (task, observation, last action, earlier results, actions taken) becomes one vector
from up to two paths, plus its role and age:

- semantic: the segment's frozen sentence embedding, standardised per role by statistics of the
  training data (what differs among observations, not what differs between an observation and a
  task), projected;
- tokens: the encoder's frozen word embeddings of the segment's tokens, projected, a position
  embedding, residual kernel-3 convolutions ("row 2", "27g of marble"), max- and mean-pooled.

The state is read in slots (the task, the observation, the last action: the first segment of each
role) plus a memory read (a learned query attending over every segment); each candidate, embedded
by the same paths, attends over the segments (late interaction). Exact-match signals (`match`):
per role, the share of the candidate's tokens found in that role's segments. Q is a twin MLP over
[state, candidate, what it attended to, products, match, history features], plus a twin state-only
MLP (`dueling`: Q = A(s, a) + B(s), so the small differences between actions are not drowned by
the spread of values between states); V an MLP over the state. Losses are harnessrl.algorithms.iql's.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from harnessrl.algorithms.iql import autocast, fp32, iql_objective, make_adam, mlp, polyak_update, standardised
from harnessrl.render import SEGMENT_ROLES

ROLES = (*SEGMENT_ROLES, "candidate")
ROLE_ID = {r: i for i, r in enumerate(ROLES)}
MAX_AGE = 16
SLOTS = ("task", "observation", "last")  # roles read as slots of their own (the first segment of each)
VERSION = 3  # of the network's layout (3: the `detail` role); a critic of another version is retrained, not loaded


@dataclass
class ReaderConfig:
    version: int = VERSION
    sem_dim: int = 384  # the encoder's embedding size
    word_dim: int = 384  # the encoder's word-embedding size
    dim: int = 128  # width of the segment vectors
    conv_layers: int = 2
    segment_tokens: int = 64  # tokens kept per segment by the token path and the match signals
    hidden_dim: int = 256
    semantic: bool = True
    tokens: bool = False
    match: bool = True
    dueling: bool = True
    gamma: float = 0.95
    expectile: float = 0.9
    polyak: float = 0.005
    lr: float = 3e-4
    alpha: float = 0.0  # candidate-set penalty weight, as in IQLConfig
    value_target: str = "taken"  # V(s) fit to Q of the taken action ("taken", IQL), the best candidate's
    # ("candidates") or the best of the candidates taken from the same observation ("supported")
    feature_dim: int = 0
    bf16: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


class TokenPath(nn.Module):
    """A text's tokens (frozen word embeddings, given per distinct token id of the batch) -> one
    vector: projection, position embedding, residual kernel-3 convolutions, max- and mean-pooling."""

    def __init__(self, cfg: ReaderConfig):
        super().__init__()
        d = cfg.dim
        self.proj = nn.Linear(cfg.word_dim, d)
        self.pos = nn.Embedding(cfg.segment_tokens, d)
        self.convs = nn.ModuleList(nn.Conv1d(d, d, 3, padding=1) for _ in range(cfg.conv_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(cfg.conv_layers))
        self.out = nn.Linear(2 * d, d)

    def forward(self, word: torch.Tensor, inv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """word (W, word_dim); inv, mask (U, L): each text's token ids as rows of `word` -> (U, dim)."""
        m = mask.unsqueeze(-1).to(word.dtype)
        x = (self.proj(word)[inv] + self.pos.weight[: inv.shape[1]]) * m
        for conv, norm in zip(self.convs, self.norms):
            x = x + F.gelu(conv(norm(x).transpose(1, 2)).transpose(1, 2)) * m
        top = x.masked_fill(~mask.unsqueeze(-1), -1e4).amax(1)
        mean = x.sum(1) / m.sum(1).clamp(min=1.0)
        return self.out(torch.cat([top, mean], -1))


class ReaderNetwork(nn.Module):
    def __init__(self, cfg: ReaderConfig):
        super().__init__()
        if cfg.version != VERSION:
            raise ValueError(f"reader network version {cfg.version}; this release reads version {VERSION}")
        if not (cfg.semantic or cfg.tokens):
            raise ValueError("the reader needs at least one of its paths: semantic or tokens")
        self.cfg = cfg
        d = cfg.dim
        if cfg.semantic:
            self.sem = nn.Linear(cfg.sem_dim, d)
        if cfg.tokens:
            self.tokens = TokenPath(cfg)
        self.role = nn.Embedding(len(ROLES), d)
        self.age = nn.Embedding(MAX_AGE + 1, d)
        self.norm = nn.LayerNorm(d)
        self.memory_query = nn.Parameter(torch.randn(d) / math.sqrt(d))
        self.key, self.value = nn.Linear(d, d), nn.Linear(d, d)
        # per role: the training data's mean and scale of the segments' sentence embeddings
        self.register_buffer("sem_mean", torch.zeros(len(ROLES), cfg.sem_dim))
        self.register_buffer("sem_std", torch.ones(len(ROLES), cfg.sem_dim))
        self.register_buffer("feat_mean", torch.zeros(cfg.feature_dim))
        self.register_buffer("feat_std", torch.ones(cfg.feature_dim))
        state_dim = (len(SLOTS) + 1) * d
        q_in = state_dim + 4 * d + (len(SEGMENT_ROLES) if cfg.match else 0) + cfg.feature_dim
        self.q1, self.q2 = mlp(q_in, cfg.hidden_dim), mlp(q_in, cfg.hidden_dim)
        if cfg.dueling:
            self.b1, self.b2 = mlp(state_dim, cfg.hidden_dim), mlp(state_dim, cfg.hidden_dim)
        self.v_head = mlp(state_dim, cfg.hidden_dim)

    def set_stats(self, sem_mean, sem_std, feat_mean=None, feat_std=None) -> None:
        """Per-role (len(ROLES), sem_dim) statistics of the segments' embeddings; feature statistics."""
        self.sem_mean.copy_(torch.as_tensor(sem_mean, dtype=torch.float32))
        self.sem_std.copy_(torch.as_tensor(sem_std, dtype=torch.float32).clamp(min=1e-6))
        if feat_mean is not None and self.feat_mean.numel():
            self.feat_mean.copy_(torch.as_tensor(feat_mean, dtype=torch.float32))
            self.feat_std.copy_(standardised(feat_std))

    # ---- texts and states -----------------------------------------------------------------------
    def stream(self, b: dict) -> torch.Tensor | None:
        """The token path's vector of every distinct text of the batch (None when it is off)."""
        return self.tokens(b["word"], b["t_inv"], b["t_mask"]) if self.cfg.tokens else None

    def _vectors(self, b: dict, x: torch.Tensor | None, u: torch.Tensor, role: torch.Tensor, age: torch.Tensor):
        """Vectors of texts `u` (indices of the batch's distinct texts) read in `role` at `age`."""
        out = self.role(role) + self.age(age)
        if self.cfg.semantic:
            out = out + self.sem((b["emb"][u] - self.sem_mean[role]) / self.sem_std[role])
        if x is not None:
            out = out + x[u]
        return self.norm(out)

    def state(self, x: torch.Tensor | None, b: dict, p: str = "s") -> dict:
        """A state's segment vectors and its summary (slots + memory read) from batch keys prefixed
        `p` ("s": the state, "n": the next state)."""
        role, mask = b[f"{p}_role"], b[f"{p}_mask"]
        seg = self._vectors(b, x, b[f"{p}_u"], role, b[f"{p}_age"])
        slots = []
        for r in SLOTS:
            hit = (role == ROLE_ID[r]) & mask
            first = (hit & hit.cumsum(1).eq(1)).to(seg.dtype)
            slots.append(torch.einsum("bs,bsd->bd", first, seg))
        att = (seg @ self.memory_query / math.sqrt(self.cfg.dim)).masked_fill(~mask, float("-inf")).softmax(-1)
        memory = torch.einsum("bs,bsd->bd", att, seg)
        return {"seg": seg, "mask": mask, "obs": slots[1], "summary": torch.cat([*slots, memory], -1)}

    def v(self, st: dict) -> torch.Tensor:
        return self.v_head(st["summary"]).squeeze(-1)

    # ---- the candidates -------------------------------------------------------------------------
    def q(self, st: dict, x: torch.Tensor | None, b: dict, f: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
        """Twin Q (B, K) of every candidate of every state."""
        u = b["c_u"]
        B, K = u.shape
        c = self._vectors(b, x, u, torch.full_like(u, ROLE_ID["candidate"]), torch.zeros_like(u))
        att = torch.einsum("bkd,bsd->bks", c, self.key(st["seg"])) / math.sqrt(self.cfg.dim)
        att = att.masked_fill(~st["mask"][:, None, :], float("-inf")).softmax(-1)
        ctx = torch.einsum("bks,bsd->bkd", att, self.value(st["seg"]))
        summary = st["summary"]
        parts = [summary[:, None, :].expand(B, K, -1), c, ctx, c * ctx, c * st["obs"][:, None, :]]
        if self.cfg.match:
            parts.append(b["match"].to(c.dtype))
        if self.feat_mean.numel():
            parts.append((f - self.feat_mean) / self.feat_std)
        h = torch.cat(parts, -1)
        q1, q2 = self.q1(h).squeeze(-1), self.q2(h).squeeze(-1)
        if self.cfg.dueling:
            q1, q2 = q1 + self.b1(summary), q2 + self.b2(summary)
        return q1, q2

    def forward(self, b: dict, f: torch.Tensor | None = None):
        """(q1, q2) (B, K) of the candidates (the taken action first), V(s) and V(s') (no gradient)."""
        x = self.stream(b)
        st = self.state(x, b, "s")
        q1, q2 = self.q(st, x, b, f)
        with torch.no_grad():
            v_next = self.v(self.state(x, b, "n"))
        return q1, q2, self.v(st), v_next


class ReaderLearner:
    """The network (optionally DDP-wrapped), its target copy (Polyak) and the optimiser."""

    def __init__(self, cfg: ReaderConfig, net: nn.Module):
        self.cfg, self.net = cfg, net
        self.target_q = copy.deepcopy(self.core).requires_grad_(False)
        self.opt = make_adam(self.net.parameters(), cfg.lr)
        self.advantage: torch.Tensor | None = None

    @property
    def core(self) -> ReaderNetwork:
        return getattr(self.net, "module", self.net)

    def update(self, b: dict, r: torch.Tensor, done: torch.Tensor, f: torch.Tensor | None) -> dict[str, float]:
        """One gradient step; `b["k_mask"]` (B, K) marks the candidates present, the taken one first, and
        `b["p_mask"]` (B, K - 1), when given, the untaken ones the candidate penalty applies to."""
        cfg = self.cfg
        with autocast(cfg.bf16, r.device):
            q1_all, q2_all, v, v_next = self.net(b, f)
            with torch.no_grad():
                t = self.target_q
                x = t.stream(b)
                tq_all = torch.minimum(*t.q(t.state(x, b, "s"), x, b, f))
                # "candidates": the best of those present; "supported": of those taken from here (`v_mask`)
                tq = tq_all[:, 0] if cfg.value_target == "taken" else \
                    tq_all.masked_fill(~b.get("v_mask", b["k_mask"]), float("-inf")).amax(1)
        q1_all, q2_all, v, v_next, tq = fp32(q1_all, q2_all, v, v_next, tq)
        use_cand = cfg.alpha > 0 and q1_all.shape[1] > 1
        qc = (q1_all[:, 1:], q2_all[:, 1:]) if use_cand else None
        # `p_mask`: the candidates the penalty applies to (default: every untaken one present)
        loss, metrics = iql_objective(cfg, r, done, q1_all[:, 0], q2_all[:, 0], v, v_next, tq, qc,
                                      b.get("p_mask", b["k_mask"][:, 1:]) if use_cand else None)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        polyak_update(self.target_q, self.core, cfg.polyak)
        self.advantage = (tq_all[:, 0].float() - v).detach()  # of the taken action, for the tool head
        return metrics
