"""Implicit Q-Learning critic (Kostrikov et al., 2021) over frozen text embeddings.

Readable top to bottom: config, networks, losses (one line each), one update step.
Q(s, a) is a twin MLP over [s, a, s*a, |s-a|, features] ([s, a, features] when the state and
action embeddings differ in size); the history features (DESIGN §3) are standardised by
statistics fixed from the training data and stored with the weights. V(s) is fit to the target Q by expectile
regression, so it approximates the best in-support action value without ever querying Q
on actions the data never took; Q is fit to r + gamma * (1 - done) * V(s').

Candidate-set conservatism: at serving time the critic takes an argmax over candidates it
never saw taken, where plain IQL leaves Q unconstrained. When a step logged the alternatives
it had (`candidates`), a CQL-style term, logsumexp_k Q(s, c_k) - Q(s, a), weight `alpha`,
pushes Q of the untaken candidates below Q of the taken action.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class IQLConfig:
    state_dim: int = 384
    action_dim: int = 384
    hidden_dim: int = 256
    gamma: float = 0.95
    expectile: float = 0.7
    polyak: float = 0.005
    lr: float = 3e-4
    alpha: float = 0.0  # weight of the candidate-set penalty (0: plain IQL)
    feature_dim: int = 0  # history features per (state, action), see harnessrl.features
    bf16: bool = False  # forward passes under bfloat16 autocast: faster on AVX512-BF16 CPUs and GPUs, less exact

    def to_dict(self) -> dict:
        return asdict(self)


def mlp(in_dim: int, hidden: int, out_dim: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(in_dim, hidden), nn.LayerNorm(hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.ReLU(),
        nn.Linear(hidden, out_dim),
    )


def pair_features(s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """[s, a, s*a, |s-a|]: lets a small MLP compare state and action embeddings directly."""
    return torch.cat([s, a, s * a, (s - a).abs()], dim=-1)


def q_input_dim(cfg: IQLConfig) -> int:
    pair = 4 * cfg.state_dim if cfg.state_dim == cfg.action_dim else cfg.state_dim + cfg.action_dim
    return pair + cfg.feature_dim


def standardised(std) -> torch.Tensor:
    """The history features' scale: a feature constant in training (std ~ 0) is left unscaled."""
    std = torch.as_tensor(std, dtype=torch.float32)
    return torch.where(std < 1e-3, torch.ones_like(std), std)


class TwinQ(nn.Module):
    def __init__(self, cfg: IQLConfig):
        super().__init__()
        self.pairwise = cfg.state_dim == cfg.action_dim
        self.q1 = mlp(q_input_dim(cfg), cfg.hidden_dim)
        self.q2 = mlp(q_input_dim(cfg), cfg.hidden_dim)
        # Standardises the history features; set once from the training data (`set_feature_stats`).
        self.register_buffer("feat_mean", torch.zeros(cfg.feature_dim))
        self.register_buffer("feat_std", torch.ones(cfg.feature_dim))

    def set_feature_stats(self, mean, std) -> None:
        self.feat_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.feat_std.copy_(standardised(std))

    def forward(self, s: torch.Tensor, a: torch.Tensor, f: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = pair_features(s, a) if self.pairwise else torch.cat([s, a], dim=-1)
        if self.feat_mean.numel():
            x = torch.cat([x, (f - self.feat_mean) / self.feat_std], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def min_q(self, s: torch.Tensor, a: torch.Tensor, f: torch.Tensor | None = None) -> torch.Tensor:
        return torch.minimum(*self(s, a, f))


class ValueNet(nn.Module):
    def __init__(self, cfg: IQLConfig):
        super().__init__()
        self.v = mlp(cfg.state_dim, cfg.hidden_dim)

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        return self.v(s).squeeze(-1)


class IQLNetwork(nn.Module):
    """Q and V in one module so one DDP wrapper and one backward pass cover both."""

    def __init__(self, cfg: IQLConfig):
        super().__init__()
        self.q = TwinQ(cfg)
        self.v = ValueNet(cfg)

    def forward(self, s, a, s_next, f=None, cand=None, cand_f=None):
        """Q of the taken action, V(s), V(s') and, given candidates (B, K, d_a) with their
        features (B, K, d_f), Q of each candidate."""
        q1, q2 = self.q(s, a, f)
        qc = None
        if cand is not None:
            qc = self.q(s.unsqueeze(1).expand(-1, cand.shape[1], -1), cand, cand_f)
        with torch.no_grad():  # V(s') only enters the TD target, which is held fixed
            v_next = self.v(s_next)
        return q1, q2, self.v(s), v_next, qc


# ---- losses -------------------------------------------------------------------------------
def asymmetric_l2(u: torch.Tensor, tau: float) -> torch.Tensor:
    return (torch.abs(tau - (u < 0).float()) * u.pow(2)).mean()


def value_loss(target_q: torch.Tensor, v: torch.Tensor, tau: float) -> torch.Tensor:
    return asymmetric_l2(target_q - v, tau)


def q_target(r: torch.Tensor, done: torch.Tensor, v_next: torch.Tensor, gamma: float) -> torch.Tensor:
    return r + gamma * (1.0 - done) * v_next


def q_loss(q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(q1, target) + F.mse_loss(q2, target)


def candidate_penalty(q_cand: torch.Tensor, mask: torch.Tensor, q_taken: torch.Tensor) -> torch.Tensor:
    """CQL over the step's candidate set: logsumexp over {taken} + candidates of Q, minus Q(taken).

    `q_cand` (B, K) holds Q of untaken candidates, `mask` (B, K) which of them exist. Known
    bias: the gradient also lifts Q of the taken action above its TD target, and an
    expectile-near-1 V compounds the lift through bootstrapping (see test_iql_correctness).
    Detaching Q(taken) removes the lift but, on data where every candidate is taken at some
    other visit, drags all values far below the truth (measured: V error 0.45 vs 0.01 plain).
    """
    logits = torch.cat([q_taken.unsqueeze(1), q_cand.masked_fill(~mask, float("-inf"))], dim=1)
    return (torch.logsumexp(logits, dim=1) - q_taken).mean()


def iql_objective(cfg, r, done, q1, q2, v, v_next, tq, qc=None, cand_mask=None) -> tuple[torch.Tensor, dict[str, float]]:
    """One batch's loss (expectile V towards the target min Q, TD Q towards r + gamma V(s'), plus
    alpha x the candidate penalty when `qc`, the twin Q of the untaken candidates, is given) and
    what the step reports (the train job averages it per logging window). Float32 inputs."""
    y = q_target(r, done, v_next.detach(), cfg.gamma)
    loss_v = value_loss(tq, v, cfg.expectile)
    loss_q = q_loss(q1, q2, y)
    loss = loss_v + loss_q
    with torch.no_grad():
        adv = tq - v
        metrics = {
            "loss_q": loss_q.item(),
            "loss_v": loss_v.item(),
            "td_error": (y - q1).abs().mean().item(),
            "q_mean": q1.mean().item(),
            "q_abs_max": q1.abs().max().item(),
            "v_mean": v.mean().item(),
            "adv_mean": adv.mean().item(),
            "adv_std": adv.std().item() if adv.numel() > 1 else 0.0,
        }
    if qc is not None:
        penalty = candidate_penalty(qc[0], cand_mask, q1) + candidate_penalty(qc[1], cand_mask, q2)
        loss = loss + cfg.alpha * penalty
        with torch.no_grad():
            gap = (q1.unsqueeze(1) - qc[0]).masked_select(cand_mask)
            metrics["cand_penalty"] = penalty.item()
            metrics["cand_gap_mean"] = gap.mean().item() if gap.numel() else 0.0
    return loss, metrics


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, rate: float) -> None:
    """target <- (1 - rate) * target + rate * source, all tensors in one foreach call."""
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), rate)


def make_adam(params, lr: float) -> torch.optim.Optimizer:
    """Fused Adam where torch has it for these parameters: one kernel for all of them and no
    per-tensor step counters read back to the host (20% of a CPU step went to Adam before)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):  # e.g. a device or dtype without a fused kernel
        return torch.optim.Adam(params, lr=lr)


def run_device(device: str | None = None) -> str:
    """`device`, else a GPU when one is visible (as sentence-transformers places the encoder)."""
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def autocast(enabled: bool, device: torch.device):
    """bfloat16 autocast for the forward passes when enabled (losses are taken in float32)."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


def fp32(*xs):
    return tuple(None if x is None else x.float() for x in xs)


class IQLLearner:
    """Owns the network (optionally DDP-wrapped), the target Q and the optimiser."""

    def __init__(self, cfg: IQLConfig, net: nn.Module | None = None, device: str | torch.device = "cpu"):
        self.cfg = cfg
        self.net = net if net is not None else IQLNetwork(cfg).to(device)
        self.target_q = copy.deepcopy(self.core.q).requires_grad_(False)
        self.opt = make_adam(self.net.parameters(), cfg.lr)
        self.advantage: torch.Tensor | None = None  # of the last batch, for an AWR actor stepped beside

    @property
    def core(self) -> IQLNetwork:
        """The bare network (unwrapped from DDP)."""
        return getattr(self.net, "module", self.net)

    def update(self, s, a, r, s_next, done, f=None, cand=None, cand_mask=None, cand_f=None) -> dict[str, float]:
        """One gradient step. `f` (B, d_f) are the taken action's history features; `cand`
        (B, K, d_a), `cand_f` (B, K, d_f) and `cand_mask` (B, K) the untaken candidates, if any."""
        cfg = self.cfg
        use_cand = cand is not None and cfg.alpha > 0
        with autocast(cfg.bf16, s.device):
            q1, q2, v, v_next, qc = self.net(s, a, s_next, f, cand if use_cand else None, cand_f if use_cand else None)
            with torch.no_grad():
                tq = self.target_q.min_q(s, a, f)
        q1, q2, v, v_next, tq = fp32(q1, q2, v, v_next, tq)
        loss, metrics = iql_objective(cfg, r, done, q1, q2, v, v_next, tq, fp32(*qc) if qc is not None else None,
                                      cand_mask)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        polyak_update(self.target_q, self.core.q, cfg.polyak)
        self.advantage = (tq - v).detach()
        return metrics
