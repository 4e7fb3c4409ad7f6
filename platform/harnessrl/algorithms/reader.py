"""The reader network (`train.head: reader`, harnessrl.heads.reader): Q(s, a) and V(s) over a state
given as segments (harnessrl.render.state_segments), not as one pooled vector.

Why: one pooled sentence vector per state blurs the number, recipe line or item that decides a
choice (the states of a 4x4 grid rendered in words have pairwise MiniLM cosines of 0.993-0.9997).
Three paths, each switchable (`ReaderConfig`):

- semantic: every segment's frozen sentence embedding, standardised per role by statistics of the
  training data (what differs among observations, not what differs between an observation and a
  task), with role and age embeddings; the candidate's embedding attends over them.
- tokens: the encoder's frozen word embeddings of every segment's tokens (projected), a position
  embedding and residual kernel-3 convolutions (local context: "row 2", "27g of marble"); the
  candidate's tokens attend over the state's tokens (late interaction).
- match: per state role, how well the candidate's tokens are found there: the mean over its tokens
  of the best cosine to that role's tokens, and of an exact token match.

Q is a twin MLP over [the paths' outputs, history features]; V an MLP over the state alone (a
learned query attending over its tokens and segments). Losses are harnessrl.algorithms.iql's.
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


@dataclass
class ReaderConfig:
    sem_dim: int = 384  # the encoder's embedding size
    word_dim: int = 384  # the encoder's word-embedding size
    dim: int = 128  # width of the token path and of the attention
    conv_layers: int = 1
    heads: int = 4
    segment_tokens: int = 128  # tokens kept per segment
    state_tokens: int = 640  # tokens kept per state (the segments in order: task, observation, ...)
    hidden_dim: int = 256
    semantic: bool = True
    tokens: bool = True
    match: bool = True
    gamma: float = 0.95
    expectile: float = 0.7
    polyak: float = 0.005
    lr: float = 3e-4
    alpha: float = 0.0  # candidate-set penalty weight, as in IQLConfig
    feature_dim: int = 0
    bf16: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


class TokenEncoder(nn.Module):
    """Frozen word embeddings (given per distinct token id of the batch), projected, plus a
    position-in-segment embedding, then residual conv blocks over one flat stream of the batch's
    distinct segments (separators between them are zeroed after every layer: nothing crosses)."""

    def __init__(self, cfg: ReaderConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.word_dim, cfg.dim)
        self.pos = nn.Embedding(cfg.segment_tokens, cfg.dim)
        self.convs = nn.ModuleList(nn.Conv1d(cfg.dim, cfg.dim, 3, padding=1) for _ in range(cfg.conv_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(cfg.dim) for _ in range(cfg.conv_layers))
        self.norm = nn.LayerNorm(cfg.dim)

    def forward(self, word: torch.Tensor, inv: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """word (U, word_dim): embeddings of the distinct token ids; inv, pos, mask (N,) -> (N, dim)."""
        m = mask.unsqueeze(-1).to(torch.float32)
        x = (self.proj(word)[inv] + self.pos(pos)) * m
        for conv, norm in zip(self.convs, self.norms):
            x = x + F.gelu(conv(norm(x).t().unsqueeze(0)).squeeze(0).t()) * m
        return self.norm(x) * m


class CrossAttention(nn.Module):
    """The candidate's tokens attend over the state's tokens. Keys and values are projected once per
    token of the batch's stream (plus the projections of the role and age embeddings), then gathered
    per state: the states of a batch share most of their segments."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, c: torch.Tensor, x: torch.Tensor, st: dict, role: torch.Tensor, age: torch.Tensor
                ) -> torch.Tensor:
        """c (B, K, L, d) candidate tokens; x (N, d) the stream; st: the state's indices; role, age:
        the role and age embedding tables."""
        B, K, L, d = c.shape

        def project(lin: nn.Linear) -> torch.Tensor:
            out = lin(x)[st["idx"]] + F.linear(role, lin.weight)[st["role"]] + F.linear(age, lin.weight)[st["age"]]
            return out.view(B, -1, self.h, self.dh)

        q = self.q(self.ln1(c)).view(B, K, L, self.h, self.dh)
        k, v = project(self.k), project(self.v)
        att = torch.einsum("bklhe,bthe->bkhlt", q, k) / math.sqrt(self.dh)
        att = att.masked_fill(~st["mask"][:, None, None, None, :], float("-inf")).softmax(-1)
        c = c + self.o(torch.einsum("bkhlt,bthe->bklhe", att, v).reshape(B, K, L, d))
        return c + self.ff(self.ln2(c))


def _mean(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    m = mask.to(x.dtype).unsqueeze(-1)
    return (x * m).sum(dim) / m.sum(dim).clamp(min=1.0)


class ReaderNetwork(nn.Module):
    def __init__(self, cfg: ReaderConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        n_match = 2 * len(SEGMENT_ROLES) if cfg.match else 0
        if not (cfg.semantic or cfg.tokens or cfg.match):
            raise ValueError("the reader needs at least one of its paths: semantic, tokens or match")
        if cfg.tokens or cfg.match:
            self.tokens = TokenEncoder(cfg)
            self.role = nn.Embedding(len(ROLES), d)
            self.age = nn.Embedding(MAX_AGE + 1, d)
        if cfg.tokens:
            self.cross = CrossAttention(d, cfg.heads)
            self.v_query = nn.Parameter(torch.randn(d) / math.sqrt(d))
        if cfg.semantic:
            self.sem_proj = nn.Linear(cfg.sem_dim, d)
            self.sem_role = nn.Embedding(len(ROLES), d)
            self.sem_age = nn.Embedding(MAX_AGE + 1, d)
            self.v_sem_query = nn.Parameter(torch.randn(d) / math.sqrt(d))
        # per role: the training data's mean and scale of the segments' sentence embeddings
        self.register_buffer("sem_mean", torch.zeros(len(ROLES), cfg.sem_dim))
        self.register_buffer("sem_std", torch.ones(len(ROLES), cfg.sem_dim))
        self.register_buffer("feat_mean", torch.zeros(cfg.feature_dim))
        self.register_buffer("feat_std", torch.ones(cfg.feature_dim))
        q_in = (2 * d if cfg.tokens else 0) + (3 * d if cfg.semantic else 0) + n_match + cfg.feature_dim
        self.q1, self.q2 = mlp(q_in, cfg.hidden_dim), mlp(q_in, cfg.hidden_dim)
        self.v_head = mlp((d if cfg.tokens else 0) + (d if cfg.semantic else 0) or d, cfg.hidden_dim)

    def set_stats(self, sem_mean, sem_std, feat_mean=None, feat_std=None) -> None:
        """Per-role (len(ROLES), sem_dim) statistics of the segments' embeddings; feature statistics."""
        self.sem_mean.copy_(torch.as_tensor(sem_mean, dtype=torch.float32))
        self.sem_std.copy_(torch.as_tensor(sem_std, dtype=torch.float32).clamp(min=1e-6))
        if feat_mean is not None and self.feat_mean.numel():
            self.feat_mean.copy_(torch.as_tensor(feat_mean, dtype=torch.float32))
            self.feat_std.copy_(standardised(feat_std))

    # ---- the state ------------------------------------------------------------------------------
    def stream(self, b: dict) -> torch.Tensor | None:
        """The batch's token stream through the token encoder (None when no path reads tokens)."""
        if not (self.cfg.tokens or self.cfg.match):
            return None
        return self.tokens(b["word"], b["x_inv"], b["x_pos"], b["x_mask"])

    def state(self, x: torch.Tensor | None, b: dict, p: str = "s") -> dict:
        """A state's parts from batch keys prefixed `p` ("s": the state, "n": the next state): its
        token indices into the stream (the vectors are gathered where a path needs them) and its
        segments' standardised sentence embeddings."""
        out: dict = {}
        if x is not None:
            out.update(idx=b[f"{p}_idx"], role=b[f"{p}_role"], age=b[f"{p}_age"], mask=b[f"{p}_mask"],
                       ids=b[f"{p}_ids"])
        if self.cfg.semantic:
            role = b[f"{p}_seg_role"]
            e = (b[f"{p}_seg_emb"] - self.sem_mean[role]) / self.sem_std[role]
            out["sem"] = self.sem_proj(e) + self.sem_role(role) + self.sem_age(b[f"{p}_seg_age"])
            out["sem_mask"] = b[f"{p}_seg_mask"]
        return out

    def tokens_of(self, x: torch.Tensor, st: dict) -> torch.Tensor:
        """The state's token vectors (B, T, d): stream vectors plus role and age embeddings."""
        return x[st["idx"]] + self.role(st["role"]) + self.age(st["age"])

    def v(self, st: dict, x: torch.Tensor | None = None) -> torch.Tensor:
        parts = []
        d = math.sqrt(self.cfg.dim)
        if self.cfg.tokens:
            logits = ((x @ self.v_query)[st["idx"]] + (self.role.weight @ self.v_query)[st["role"]]
                      + (self.age.weight @ self.v_query)[st["age"]]) / d
            att = logits.masked_fill(~st["mask"], float("-inf")).softmax(-1)
            parts.append(torch.einsum("bt,btd->bd", att, self.tokens_of(x, st)))
        if self.cfg.semantic:
            att = (st["sem"] @ self.v_sem_query / d).masked_fill(~st["sem_mask"], float("-inf")).softmax(-1)
            parts.append(torch.einsum("bs,bsd->bd", att, st["sem"]))
        if not parts:  # match only: V reads the mean token of the state
            parts.append(_mean(self.tokens_of(x, st), st["mask"], 1))
        return self.v_head(torch.cat(parts, -1)).squeeze(-1)

    # ---- the candidates -------------------------------------------------------------------------
    def q(self, st: dict, x: torch.Tensor | None, b: dict, f: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
        """Twin Q (B, K) of every candidate of every state."""
        parts = []
        c = None
        if x is not None:
            c = x[b["c_idx"]] + self.role.weight[ROLE_ID["candidate"]]
        if self.cfg.tokens:
            cx = self.cross(c, x, st, self.role.weight, self.age.weight)
            parts += [_mean(c, b["c_mask"], 2), _mean(cx, b["c_mask"], 2)]
        if self.cfg.semantic:
            role = ROLE_ID["candidate"]
            ce = self.sem_proj((b["c_emb"] - self.sem_mean[role]) / self.sem_std[role])
            att = torch.einsum("bkd,bsd->bks", ce, st["sem"]) / math.sqrt(self.cfg.dim)
            att = att.masked_fill(~st["sem_mask"][:, None, :], float("-inf")).softmax(-1)
            ctx = torch.einsum("bks,bsd->bkd", att, st["sem"])
            parts += [ce, ctx, ce * ctx]
        if self.cfg.match:
            parts.append(self.match(c, b, st, self.tokens_of(x, st)))
        if self.feat_mean.numel():
            parts.append((f - self.feat_mean) / self.feat_std)
        h = torch.cat(parts, -1)
        return self.q1(h).squeeze(-1), self.q2(h).squeeze(-1)

    def match(self, c: torch.Tensor, b: dict, st: dict, tok: torch.Tensor) -> torch.Tensor:
        """Per state role: mean over the candidate's tokens of their best cosine to that role's
        tokens, and of an exact token-id match there (one scatter over roles)."""
        sim = torch.einsum("bkld,btd->bklt", F.normalize(c, dim=-1), F.normalize(tok, dim=-1))
        same = (b["c_ids"][..., None] == st["ids"][:, None, None, :]).to(sim.dtype)
        n_roles = len(ROLES)
        role = st["role"].masked_fill(~st["mask"], n_roles)[:, None, None, :].expand_as(sim)
        both = torch.stack([sim, same], -1)
        init = torch.full((*sim.shape[:3], n_roles + 1, 2), -1.0, dtype=sim.dtype, device=sim.device)
        best = init.scatter_reduce(3, role.unsqueeze(-1).expand_as(both), both, reduce="amax", include_self=True)
        best = best[:, :, :, : len(SEGMENT_ROLES)].clamp(min=0.0)  # a role the state lacks: 0
        return _mean(best.flatten(-2), b["c_mask"], 2)

    def forward(self, b: dict, f: torch.Tensor | None = None):
        """(q1, q2) (B, K) of the candidates (the taken action first), V(s) and V(s') (no gradient)."""
        x = self.stream(b)
        st = self.state(x, b, "s")
        q1, q2 = self.q(st, x, b, f)
        with torch.no_grad():
            v_next = self.v(self.state(x, b, "n"), x)
        return q1, q2, self.v(st, x), v_next


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
        """One gradient step; `b["k_mask"]` (B, K) marks the candidates present, the taken one first."""
        cfg = self.cfg
        with autocast(cfg.bf16, r.device):
            q1_all, q2_all, v, v_next = self.net(b, f)
            with torch.no_grad():
                t = self.target_q
                x = t.stream(b)
                tq = torch.minimum(*t.q(t.state(x, b, "s"), x, b, f))[:, 0]
        q1_all, q2_all, v, v_next, tq = fp32(q1_all, q2_all, v, v_next, tq)
        use_cand = cfg.alpha > 0 and q1_all.shape[1] > 1
        qc = (q1_all[:, 1:], q2_all[:, 1:]) if use_cand else None
        loss, metrics = iql_objective(cfg, r, done, q1_all[:, 0], q2_all[:, 0], v, v_next, tq, qc,
                                      b["k_mask"][:, 1:] if use_cand else None)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        polyak_update(self.target_q, self.core, cfg.polyak)
        self.advantage = (tq - v).detach()
        return metrics
