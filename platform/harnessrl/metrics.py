"""Offline evaluation metrics (DESIGN §7): pure numpy, one function per figure.

Every function takes plain arrays or lists and returns a float or a flat dict of floats, so
the same code serves tests on constructed data, the evaluation job and MLflow logging.
Empty input gives NaN rather than an exception: a held-out split without, say, multi-attempt
tasks is a fact to report, not an error. Offline top-1 rate never stands in for the
closed-loop success rate: it does not predict it.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

NAN = float("nan")


def _floats(x: Any) -> np.ndarray:
    """A 1-D float array; rejects NaN/inf because ranks and means of them mean nothing."""
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(a)):
        raise ValueError("values must be finite")
    return a


def _share(flags: np.ndarray) -> float:
    """Mean of a boolean array, NaN when empty."""
    return float(np.mean(flags)) if flags.size else NAN


# ---- split ------------------------------------------------------------------------------------
def _group_key(group: Hashable, seed: int) -> str:
    return hashlib.sha256(f"{seed}\x00{group}".encode()).hexdigest()


def split_by_group(group_ids: Sequence[Hashable], heldout_fraction: float,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Masks (train, heldout) over rows such that no group lands in both (no task leaks).

    Groups are ordered by a seeded hash, so the split depends only on the set of groups and the
    seed, not on row order. round(fraction * n_groups) groups are held out, at least one and at
    most all but one when 0 < fraction < 1 and there are two groups or more.
    """
    if not 0.0 <= heldout_fraction <= 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1], got {heldout_fraction}")
    ids = list(group_ids)
    groups = sorted(set(ids), key=lambda g: _group_key(g, seed))
    n_held = round(heldout_fraction * len(groups))
    if 0.0 < heldout_fraction < 1.0 and len(groups) >= 2:
        n_held = min(max(n_held, 1), len(groups) - 1)
    held = set(groups[:n_held])
    heldout = np.array([g in held for g in ids], dtype=bool)
    return ~heldout, heldout


# ---- critic fit -------------------------------------------------------------------------------
def td_error(q: Sequence[float], r: Sequence[float], done: Sequence[bool], v_next: Sequence[float],
             gamma: float) -> dict[str, float]:
    """How far Q(s, a) is from r + gamma * (1 - done) * V(s'); bias > 0 means overestimation.

    `done` is termination only: a truncated step keeps bootstrapping (DESIGN §3).
    """
    q, r, v_next = _floats(q), _floats(r), _floats(v_next)
    d = np.asarray(done, dtype=bool).reshape(-1)
    if not len(q) == len(r) == len(d) == len(v_next):
        raise ValueError("q, r, done and v_next must have the same length")
    if not q.size:
        return {"td_mae": NAN, "td_rmse": NAN, "td_bias": NAN}
    delta = q - (r + gamma * (~d) * v_next)
    return {"td_mae": float(np.mean(np.abs(delta))), "td_rmse": float(np.sqrt(np.mean(delta ** 2))),
            "td_bias": float(np.mean(delta))}


def reward_bound(r_max: float, gamma: float) -> float:
    """r_max / (1 - gamma): no discounted return, hence no correct value, exceeds it in size."""
    if not 0.0 <= gamma < 1.0:
        raise ValueError(f"gamma must be in [0, 1), got {gamma}")
    return abs(float(r_max)) / (1.0 - gamma)


def value_scale(values: Sequence[float], r_max: float, gamma: float) -> dict[str, float]:
    """Size of V (or Q) against the reward bound: a ratio near or above 1 signals blow-up."""
    v = np.abs(_floats(values))
    bound = reward_bound(r_max, gamma)
    v_max = float(v.max()) if v.size else NAN
    return {"v_mean_abs": float(v.mean()) if v.size else NAN, "v_max_abs": v_max, "reward_bound": bound,
            "v_bound_ratio": v_max / bound if bound > 0 else NAN}


def average_ranks(x: Sequence[float]) -> np.ndarray:
    """Ranks 1..n, tied values sharing the mean of the ranks they span (as scipy's rankdata)."""
    a = _floats(x)
    order = np.argsort(a, kind="mergesort")
    ordered = a[order]
    starts_run = np.r_[True, ordered[1:] != ordered[:-1]]
    starts = np.flatnonzero(starts_run)
    ends = np.r_[starts[1:], a.size]
    ranks = np.empty(a.size)
    ranks[order] = ((starts + ends + 1) / 2.0)[np.cumsum(starts_run) - 1]
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Rank correlation (Pearson on average ranks); NaN when fewer than 2 points or a side is constant."""
    rx, ry = average_ranks(x), average_ranks(y)
    if rx.size != ry.size:
        raise ValueError("x and y must have the same length")
    if rx.size < 2:
        return NAN
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denom = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(dx @ dy) / denom if denom > 0 else NAN


# ---- decisions --------------------------------------------------------------------------------
def _best_hit(scores: np.ndarray, hits: np.ndarray) -> float:
    """Mean of `hits` over the tied-best scores: a tie is credited as a fair coin among them."""
    return float(hits[scores == scores.max()].mean())


def selection_lift(task_ids: Sequence[Hashable], episode_scores: Sequence[float],
                   successes: Sequence[bool]) -> dict[str, float]:
    """Success of the attempt the critic prefers vs the mean attempt, over tasks with >= 2 attempts.

    `episode_scores` is the critic's score per attempt (e.g. Q of its first action); the seeds'
    "first-pass rate" story: picking attempts by score should beat picking them at random.
    """
    scores, ok = _floats(episode_scores), _floats(np.asarray(successes, dtype=float))
    ids = list(task_ids)
    if not len(ids) == scores.size == ok.size:
        raise ValueError("task_ids, episode_scores and successes must have the same length")
    rows: dict[Hashable, list[int]] = defaultdict(list)
    for i, t in enumerate(ids):
        rows[t].append(i)
    chosen, mean = [], []
    for idx in rows.values():
        if len(idx) >= 2:
            chosen.append(_best_hit(scores[idx], ok[idx]))
            mean.append(float(ok[idx].mean()))
    if not chosen:
        return {"selection_lift": NAN, "n_tasks": 0, "selected_success": NAN, "mean_success": NAN}
    sel, avg = float(np.mean(chosen)), float(np.mean(mean))
    return {"selection_lift": sel - avg, "n_tasks": len(chosen), "selected_success": sel, "mean_success": avg}


def top1_rate(scores_per_step: Sequence[Sequence[float]], expert_index: Sequence[int | None]) -> dict[str, float]:
    """How often the expert action scores highest among a step's candidates, vs a random scorer.

    Steps whose expert is unknown (None or negative) are skipped; ties are credited 1/n_tied,
    so a constant scorer earns exactly the random rate.
    """
    hits, chance = [], []
    for scores, expert in zip(scores_per_step, expert_index, strict=True):
        s = _floats(scores)
        if expert is None or expert < 0 or s.size == 0:
            continue
        if expert >= s.size:
            raise ValueError(f"expert index {expert} out of range for {s.size} candidates")
        hits.append(_best_hit(s, np.arange(s.size) == expert))
        chance.append(1.0 / s.size)
    return {"top1": _share(np.array(hits)), "random_top1": _share(np.array(chance)), "n_steps": len(hits)}


def invalid_tool_rate(pred_tool_ids: Sequence[int], valid_mask: np.ndarray) -> float:
    """Share of predicted tools not available at their step (or outside the vocabulary)."""
    pred = np.asarray(pred_tool_ids, dtype=np.int64).reshape(-1)
    mask = np.asarray(valid_mask, dtype=bool)
    if mask.ndim != 2 or mask.shape[0] != pred.size:
        raise ValueError("valid_mask must be (n_steps, vocab) with one row per prediction")
    inside = (pred >= 0) & (pred < mask.shape[1])
    valid = np.zeros(pred.size, dtype=bool)
    valid[inside] = mask[np.flatnonzero(inside), pred[inside]]
    return _share(~valid)


def _entropy(p: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats along the last axis, with 0 log 0 = 0."""
    logs = np.log(np.where(p > 0, p, 1.0))
    return -(p * logs).sum(-1)


def policy_entropy(probs: np.ndarray) -> dict[str, float]:
    """Mean per-state entropy of the tool policy and the entropy of its overall tool mix.

    Both are also given normalised by log(vocab) (1 = uniform, 0 = one tool): per-state entropy
    near 0 is a confident policy; the marginal near 0 means it calls one tool everywhere.
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError("probs must be (n_states, vocab)")
    if not p.shape[0]:
        return {"entropy": NAN, "entropy_norm": NAN, "marginal_entropy": NAN, "marginal_entropy_norm": NAN}
    if np.any(p < 0) or not np.allclose(p.sum(1), 1.0, atol=1e-6):
        raise ValueError("each row of probs must be a probability distribution")
    full = math.log(p.shape[1]) if p.shape[1] > 1 else NAN
    per_state, marginal = float(_entropy(p).mean()), float(_entropy(p.mean(0)))
    return {"entropy": per_state, "entropy_norm": per_state / full, "marginal_entropy": marginal,
            "marginal_entropy_norm": marginal / full}


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """Decision latency percentiles in milliseconds: the tail, not the mean, is what agents wait on."""
    ms = _floats(seconds) * 1000.0
    if not ms.size:
        return {"p50_ms": NAN, "p95_ms": NAN, "p99_ms": NAN, "mean_ms": NAN, "n": 0}
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return {"p50_ms": float(p50), "p95_ms": float(p95), "p99_ms": float(p99), "mean_ms": float(ms.mean()),
            "n": int(ms.size)}


def nearest_cosine_distance(queries: np.ndarray, reference: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """1 - max cosine similarity of each query embedding to the reference set (e.g. training states)."""
    def unit(m: np.ndarray) -> np.ndarray:
        m = np.asarray(m, dtype=np.float32)
        return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)

    q, ref = unit(queries), unit(reference)
    if not ref.shape[0]:
        raise ValueError("reference set is empty")
    best = [np.max(q[i:i + chunk] @ ref.T, axis=1) for i in range(0, q.shape[0], chunk)]
    return 1.0 - (np.concatenate(best) if best else np.zeros(0, np.float32)).astype(np.float64)


def ood_rate(distances: Sequence[float], threshold: float) -> float:
    """Share of states farther than `threshold` from the training data (out of distribution)."""
    return _share(_floats(distances) > threshold)


def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval (95% by default) for a success rate k/n: unlike the normal
    approximation it stays inside [0, 1] and is honest for the small n of closed-loop runs."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    # exact at the ends (floating point leaves 1 - 1e-16 otherwise)
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def has_loop(actions: Sequence[str], max_period: int = 3, min_repeats: int = 3) -> bool:
    """True when some cycle of 1..max_period actions repeats min_repeats times back to back."""
    acts = list(actions)
    for period in range(1, max_period + 1):
        span = period * min_repeats
        for start in range(len(acts) - span + 1):
            window = acts[start:start + span]
            if all(window[i] == window[i % period] for i in range(span)):
                return True
    return False


def loop_rate(episodes_actions: Iterable[Sequence[str]], max_period: int = 3, min_repeats: int = 3) -> float:
    """Share of closed-loop episodes that fell into an action loop (see has_loop)."""
    return _share(np.array([has_loop(a, max_period, min_repeats) for a in episodes_actions], dtype=bool))


# ---- presentation -----------------------------------------------------------------------------
def flatten(metrics: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """{"td": {"mae": 1}} -> {"td/mae": 1}: the flat keys MLflow and tables want."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            out.update({f"{key}{sep}{k}": v for k, v in flatten(value, sep).items()})
        else:
            out[str(key)] = value
    return out


def format_value(value: Any) -> str:
    """Numbers to 4 significant digits, NaN as n/a (nothing to measure), everything else as str."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return "n/a" if math.isnan(value) else f"{float(value):.4g}"
    return str(value)


def format_table(metrics: Mapping[str, Any], title: str | None = None) -> str:
    """An aligned two-column text table of (flattened) metrics, for the console."""
    rows = [(k, format_value(v)) for k, v in flatten(metrics).items()]
    width = max([len("metric"), *(len(k) for k, _ in rows)])
    vwidth = max([len("value"), *(len(v) for _, v in rows)])
    lines = [title] if title else []
    lines += [f"{'metric':<{width}}  {'value':>{vwidth}}", f"{'-' * width}  {'-' * vwidth}"]
    lines += [f"{k:<{width}}  {v:>{vwidth}}" for k, v in rows]
    return "\n".join(lines)
