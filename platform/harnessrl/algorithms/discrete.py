"""Discrete head for tool selection: Q(s, .) over the tool vocabulary (+ 'answer/finish').

Readable top to bottom: config, networks, losses (one line each), one update step.
The state s is a frozen embedding; the action is an index into a fixed tool vocabulary, so one
forward pass gives Q of every tool at once, shape (B, n_actions). Two critics, picked by
`method`:

  iql  V(s) is fit by expectile regression to min target-Q(s, a_taken), so it approaches the
       best *in-data* tool's value without ever reading Q of a tool the logs never took;
       Q(s, a_taken) is fit to r + gamma * (1 - done) * V(s').  (No library ships discrete IQL.)
  cql  Q(s, a_taken) is fit to r + gamma * (1 - done) * max_a' min(target-Q1, target-Q2)(s', a')
       (the clipped-double-Q max over the tools available at s'), plus
       alpha * (logsumexp_a Q(s, a) - Q(s, a_taken)), which pushes down the tools the logs
       did not take. No V.
  awr  no critic of its own: the actor alone, weighted by the advantage Q(s, a) - V(s) of the
       taken action that the IQL critic (harnessrl.algorithms.iql) computed on the same batch.
       This is IQL's own actor (Kostrikov et al. extract the policy exactly so); over the tool
       vocabulary it fits pi(tool | s) proportional to the data's tool frequencies reweighted by
       exp(beta * A). One value function serves `score` and `select_tool`, so they agree, and a
       step costs one MLP instead of five.

Actor: advantage-weighted regression over the vocabulary, log pi(a_taken | s) weighted by
exp(beta * (Q(s, a_taken) - V(s))) clipped at `awr_max_weight`, weights detached; Q is the
min of the target twins. For CQL, V(s) = sum_a pi(a | s) Q(s, a) (CRR's "mean" baseline).
For `awr` the advantage comes from the caller.
`probabilities` gives the select_tool distribution.

Masks: an optional (B, n_actions) bool per state, True where a tool was available at that
step. Unavailable tools are excluded from the CQL logsumexp, the target max and the policy
softmax (they get probability exactly 0); without a mask every tool is available. The taken
action always counts as available. IQL's V and Q losses read only taken actions, so there
the mask touches the actor alone.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from harnessrl.algorithms.iql import asymmetric_l2, autocast, fp32, make_adam, mlp, polyak_update, q_loss, q_target

METHODS = ("iql", "cql", "awr")


@dataclass
class DiscreteConfig:
    state_dim: int = 384
    n_actions: int = 16  # the tool vocabulary, 'answer/finish' included
    hidden_dim: int = 256
    gamma: float = 0.95
    expectile: float = 0.7  # IQL only
    polyak: float = 0.005
    lr: float = 3e-4  # one Adam over critic and actor (their losses touch disjoint parameters)
    method: str = "iql"  # "iql" | "cql" | "awr"
    cql_alpha: float = 1.0  # CQL only: weight of the logsumexp penalty
    awr_beta: float = 3.0  # inverse temperature of the AWR weights
    awr_max_weight: float = 100.0  # AWR weights clipped here
    bf16: bool = False  # forward passes under bfloat16 autocast (see IQLConfig.bf16)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")

    def to_dict(self) -> dict:
        return asdict(self)


# ---- networks -------------------------------------------------------------------------------
class TwinDiscreteQ(nn.Module):
    def __init__(self, cfg: DiscreteConfig):
        super().__init__()
        self.q1 = mlp(cfg.state_dim, cfg.hidden_dim, cfg.n_actions)
        self.q2 = mlp(cfg.state_dim, cfg.hidden_dim, cfg.n_actions)

    def forward(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q1(s), self.q2(s)

    def min_q(self, s: torch.Tensor) -> torch.Tensor:
        return torch.minimum(*self(s))


class DiscreteNetwork(nn.Module):
    """Twin Q (not for awr), V (iql only) and policy logits in one module: one DDP wrapper, one
    backward pass."""

    def __init__(self, cfg: DiscreteConfig):
        super().__init__()
        self.q = TwinDiscreteQ(cfg) if cfg.method != "awr" else None
        self.v = mlp(cfg.state_dim, cfg.hidden_dim) if cfg.method == "iql" else None
        self.pi = mlp(cfg.state_dim, cfg.hidden_dim, cfg.n_actions)

    def value(self, s: torch.Tensor) -> torch.Tensor:
        return self.v(s).squeeze(-1)

    def forward(self, s, s_next):
        """Q1, Q2 of every tool (B, n_actions) (None for awr), V(s) and V(s') (None but for
        iql), policy logits."""
        q1, q2 = self.q(s) if self.q is not None else (None, None)
        v = v_next = None
        if self.v is not None:
            v = self.value(s)
            with torch.no_grad():  # V(s') only enters the TD target, which is held fixed
                v_next = self.value(s_next)
        return q1, q2, v, v_next, self.pi(s)


# ---- losses -------------------------------------------------------------------------------
def taken(x: torch.Tensor, a_idx: torch.Tensor) -> torch.Tensor:
    """x[b, a_idx[b]]: the entry of the taken action, shape (B,)."""
    return x.gather(1, a_idx.long().unsqueeze(1)).squeeze(1)


def masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x.masked_fill(~mask, float("-inf"))


def masked_max(q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """max over available actions; 0 where none is available (e.g. a terminal s')."""
    return masked(q, mask).amax(1) if mask is None else torch.where(mask.any(1), masked(q, mask).amax(1), 0.0)


def expectile_value_loss(target_q: torch.Tensor, a_idx: torch.Tensor, v: torch.Tensor, tau: float) -> torch.Tensor:
    return asymmetric_l2(taken(target_q, a_idx) - v, tau)


def cql_target(r, done, target_q_next, gamma: float, next_mask=None) -> torch.Tensor:
    return q_target(r, done, masked_max(target_q_next, next_mask), gamma)


def cql_penalty(q: torch.Tensor, a_idx: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    return (torch.logsumexp(masked(q, mask), dim=1) - taken(q, a_idx)).mean()


def expected_q(q: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """sum_a pi(a | s) Q(s, a): the CQL head's V(s) for the AWR advantage."""
    return (F.softmax(masked(logits, mask), dim=1) * q).sum(1)


def awr_weights(adv: torch.Tensor, beta: float, max_weight: float) -> torch.Tensor:
    return torch.exp(beta * adv).clamp(max=max_weight)


def awr_loss(logits, a_idx, weights, mask=None) -> torch.Tensor:
    return -(weights.detach() * taken(F.log_softmax(masked(logits, mask), dim=1), a_idx)).mean()


def policy_entropy(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    return torch.special.entr(F.softmax(masked(logits, mask), dim=1)).sum(1)


class DiscreteLearner:
    """Owns the network (optionally DDP-wrapped), the target twin Q and the optimiser."""

    def __init__(self, cfg: DiscreteConfig, net: nn.Module | None = None, device: str | torch.device = "cpu"):
        self.cfg = cfg
        self.net = net if net is not None else DiscreteNetwork(cfg).to(device)
        # awr has no Q: an empty target keeps checkpoints uniform.
        self.target_q = copy.deepcopy(self.core.q if self.core.q is not None else nn.Module()).requires_grad_(False)
        self.opt = make_adam(self.net.parameters(), cfg.lr)

    @property
    def core(self) -> DiscreteNetwork:
        """The bare network (unwrapped from DDP)."""
        return getattr(self.net, "module", self.net)

    def update(self, s, a_idx, r, s_next, done, mask=None, next_mask=None, adv=None) -> dict[str, float]:
        """One gradient step on a batch: s, s_next (B, state_dim), a_idx (B,) tool indices, r and
        done (B,) floats, mask / next_mask (B, n_actions) bool tools available at s / s'.
        `adv` (B,), the critic's advantage of the taken action, is read by method awr alone."""
        cfg = self.cfg
        a_idx = a_idx.long()
        if mask is not None:
            mask = mask | F.one_hot(a_idx, cfg.n_actions).bool()
        if cfg.method == "awr":
            return self._update_actor(s, a_idx, adv, mask)
        with autocast(cfg.bf16, s.device):
            q1, q2, v, v_next, logits = self.net(s, s_next)
            with torch.no_grad():
                tq_all = self.target_q.min_q(s)
                tq_next = self.target_q.min_q(s_next) if cfg.method == "cql" else None
        q1, q2, v, v_next, logits, tq_all, tq_next = fp32(q1, q2, v, v_next, logits, tq_all, tq_next)
        with torch.no_grad():
            tq = taken(tq_all, a_idx)
            if cfg.method == "iql":
                y = q_target(r, done, v_next.detach(), cfg.gamma)
                baseline = v.detach()
            else:
                y = cql_target(r, done, tq_next, cfg.gamma, next_mask)
                baseline = expected_q(tq_all, logits.detach(), mask)
            adv = tq - baseline
            w = awr_weights(adv, cfg.awr_beta, cfg.awr_max_weight)
        q1_a = taken(q1, a_idx)
        loss_q = q_loss(q1_a, taken(q2, a_idx), y)
        loss_pi = awr_loss(logits, a_idx, w, mask)
        metrics = {}
        if cfg.method == "iql":
            loss_v = expectile_value_loss(tq_all, a_idx, v, cfg.expectile)
            loss = loss_q + loss_v + loss_pi
            metrics.update(v_loss=loss_v.item(), v_mean=v.mean().item())
        else:
            penalty = cql_penalty(q1, a_idx, mask) + cql_penalty(q2, a_idx, mask)
            loss = loss_q + cfg.cql_alpha * penalty + loss_pi
            metrics.update(cql_penalty=penalty.item())
        self._step(loss)
        polyak_update(self.target_q, self.core.q, cfg.polyak)
        return {
            "q_loss": loss_q.item(),
            "td_error": (y - q1_a.detach()).abs().mean().item(),
            "q_mean": q1_a.mean().item(),
            **self._actor_metrics(loss_pi, logits, mask, adv, w),
            **metrics,
        }

    def _update_actor(self, s, a_idx, adv, mask) -> dict[str, float]:
        if adv is None:
            raise ValueError("method 'awr' needs the critic's advantage of the taken action (adv=)")
        with autocast(self.cfg.bf16, s.device):
            logits = self.net(s, s)[-1]  # through forward(), so a DDP wrapper syncs the gradients
        logits, adv = logits.float(), adv.detach().float()
        w = awr_weights(adv, self.cfg.awr_beta, self.cfg.awr_max_weight)
        loss_pi = awr_loss(logits, a_idx, w, mask)
        self._step(loss_pi)
        return self._actor_metrics(loss_pi, logits, mask, adv, w)

    def _step(self, loss: torch.Tensor) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def _actor_metrics(self, loss_pi, logits, mask, adv, w) -> dict[str, float]:
        return {
            "actor_loss": loss_pi.item(),
            "policy_entropy": policy_entropy(logits.detach(), mask).mean().item(),
            "adv_mean": adv.mean().item(),
            "awr_weight_mean": w.mean().item(),
            "awr_clip_frac": (w >= self.cfg.awr_max_weight).float().mean().item(),
        }

    @torch.no_grad()
    def q_values(self, s: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """min(Q1, Q2)(s, .) of every tool, (B, n_actions); -inf where the mask says unavailable."""
        if self.core.q is None:
            raise ValueError("method 'awr' has no Q over tools; the critic's Q is over actions")
        return masked(self.core.q.min_q(s), mask)

    @torch.no_grad()
    def probabilities(self, s: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The AWR policy pi(. | s) over the tools, (B, n_actions); exactly 0 where unavailable."""
        return F.softmax(masked(self.core.pi(s), mask), dim=1)
