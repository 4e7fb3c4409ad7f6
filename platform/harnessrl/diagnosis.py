"""Automatic diagnosis of a training run and its data (DESIGN §7): findings plus a report.

Each detector takes plain arrays or lists and returns a `Finding` (what was seen, in numbers,
and what to try) or None when it has nothing to say. `render_report` writes `report.md` and
PNG plots to a folder; logging that folder to MLflow is the caller's job. Thresholds are
keyword arguments with the defaults argued in each docstring.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Literal, Mapping, Sequence

import numpy as np

from harnessrl import metrics as M

Severity = Literal["info", "warn", "error"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warn": 1, "info": 2}
MAX_SCATTER_POINTS = 20_000


@dataclass(frozen=True)
class Finding:
    name: str
    severity: Severity
    evidence: str
    what_to_try: str
    measures: dict[str, float] = field(default_factory=dict)  # the numbers behind the evidence

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- helpers ----------------------------------------------------------------------------------
def _curve(points: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) from [(step, value), ...] or from bare values (steps 0..n-1)."""
    a = np.asarray(points, dtype=np.float64)
    if a.ndim == 2 and a.shape[1] == 2:
        return a[:, 0], a[:, 1]
    if a.ndim == 1:
        return np.arange(a.size, dtype=np.float64), a
    raise ValueError("a curve is a list of values or of (step, value) pairs")


def _tail_mean(y: np.ndarray, fraction: float = 0.1) -> float:
    """Mean of the last 10% of a curve (at least one point): the end level, less noisy than y[-1]."""
    return float(y[-max(1, math.ceil(fraction * y.size)):].mean())


def _fitted_change(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope times the span of x: how much the trend line moves over the curve."""
    if x.size < 2 or np.ptp(x) == 0:
        return 0.0
    return float(np.polyfit(x, y, 1)[0] * np.ptp(x))


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _disagreements(keys: Iterable[Hashable], outcomes: Iterable[Hashable]) -> tuple[list[tuple[Hashable, dict]], int]:
    """Keys seen with more than one distinct outcome (most visited first), and the row count."""
    seen: dict[Hashable, dict[Hashable, int]] = defaultdict(lambda: defaultdict(int))
    n = 0
    for key, outcome in zip(keys, outcomes, strict=True):
        seen[key][outcome] += 1
        n += 1
    bad = [(k, dict(outs)) for k, outs in seen.items() if len(outs) > 1]
    bad.sort(key=lambda kv: -sum(kv[1].values()))
    return bad, n


def _disagreement_finding(name: str, what: str, keys: Iterable[Hashable], outcomes: Iterable[Hashable],
                          warn_share: float, max_examples: int, what_to_try: str) -> Finding | None:
    """Shared body of the detectors that look for one input with several outcomes."""
    bad, n = _disagreements(keys, outcomes)
    if not bad:
        return None
    rows = sum(sum(outs.values()) for _, outs in bad)
    share = rows / n
    examples = "; ".join(f"{_short(k)} -> {sorted(map(repr, outs))}" for k, outs in bad[:max_examples])
    evidence = (f"{len(bad)} {what} with differing outcomes, covering {rows} of {n} rows ({share:.1%}); "
                f"e.g. {examples}")
    return Finding(name, "warn" if share >= warn_share else "info", evidence, what_to_try,
                   {"count": float(len(bad)), "rows": float(rows), "share": share})


# ---- detectors --------------------------------------------------------------------------------
def q_blowup(q_values: Sequence[float], reward_bound: float, tolerance: float = 1.0) -> Finding | None:
    """Q beyond r_max / (1 - gamma) (or not finite): no discounted return can be that large, so
    it is divergence, not learning. Threshold: max |Q| > tolerance * bound, tolerance 1."""
    q = np.asarray(q_values, dtype=np.float64).reshape(-1)
    if not q.size:
        return None
    finite = np.isfinite(q)
    beyond = ~finite | (np.abs(np.where(finite, q, 0.0)) > tolerance * reward_bound)
    if not beyond.any():
        return None
    q_max = float(np.abs(q[finite]).max()) if finite.any() else math.inf
    share = float(beyond.mean())
    evidence = (f"max |Q| = {q_max:.4g} against the reward bound r_max/(1-gamma) = {reward_bound:.4g} "
                f"(ratio {q_max / reward_bound if reward_bound > 0 else math.inf:.3g}); "
                f"{share:.1%} of Q values beyond it or not finite ({int((~finite).sum())} not finite)")
    return Finding("q_blowup", "error", evidence,
                   "lower gamma or the learning rate; slow the target network (smaller polyak); normalise or "
                   "clip rewards; raise the candidate-set penalty alpha so unseen actions stop being "
                   "over-valued; check that `done` marks terminal steps.",
                   {"q_max_abs": q_max, "reward_bound": float(reward_bound), "share_beyond": share})


def entropy_collapse(entropy_curve: Sequence[Any], vocab_size: int, min_norm: float = 0.1) -> Finding | None:
    """Tool-policy entropy fallen to under 10% of log(vocab) (about 96% of the mass on one tool
    out of ten) from a higher start: the policy stopped considering alternatives. Pass the
    entropy of the overall tool mix to catch "one tool everywhere"."""
    _, y = _curve(entropy_curve)
    if y.size < 2 or vocab_size < 2:
        return None
    full = math.log(vocab_size)
    start, end = float(y[0]) / full, _tail_mean(y) / full
    if not (end < min_norm and end < start):
        return None
    evidence = (f"policy entropy went from {start:.1%} to {end:.1%} of its maximum log({vocab_size}) "
                f"= {full:.3g} nats (collapse below {min_norm:.0%})")
    return Finding("entropy_collapse", "warn", evidence,
                   "lower the AWR beta or the weight clip so a few high-advantage steps do not dominate; "
                   "add an entropy bonus; check the tool vocabulary for one dominant class in the data; "
                   "take the checkpoint from before the collapse.",
                   {"entropy_norm_start": start, "entropy_norm_end": end})


def reward_hacking(reward_curve: Sequence[Any], success_curve: Sequence[Any], min_points: int = 5,
                   min_reward_trend: float = 0.6, max_success_gain: float = 0.02) -> Finding | None:
    """Composite reward rising while success does not: the shaping terms are being farmed.

    Rising: Spearman(step, reward) >= 0.6, a scale-free trend test (the composite reward has no
    natural unit) on at least 5 points. Not rising: the fitted success line gains at most
    2 points of success rate over the curve (success is a rate, so an absolute bound fits).
    """
    rx, ry = _curve(reward_curve)
    sx, sy = _curve(success_curve)
    if ry.size < min_points or sy.size < 2:
        return None
    trend = M.spearman(rx, ry)
    trend = 0.0 if math.isnan(trend) else trend
    gain = _fitted_change(sx, sy)
    if trend < min_reward_trend or gain > max_success_gain:
        return None
    evidence = (f"composite reward rises (rank trend {trend:.2f}, {ry[0]:.4g} -> {ry[-1]:.4g}) while the "
                f"fitted success rate changes by {gain:+.3f} over the same span")
    return Finding("reward_hacking", "warn", evidence,
                   "compare reward_components over training to see which term grew; cut the weights of "
                   "shaping terms relative to the terminal outcome or cap them per episode; penalise "
                   "repeated actions; retrain with an outcome-only recipe as a control.",
                   {"reward_trend": trend, "success_gain": gain})


def conflicting_transitions(state_texts: Sequence[str], action_texts: Sequence[str], outcomes: Sequence[Hashable],
                            warn_share: float = 0.05, max_examples: int = 3) -> Finding | None:
    """Same (state, action) text with different outcomes: contradictory targets for Q.

    `outcomes` is per transition and compared exactly (round floats first), e.g. (reward, done).
    Warn from 5% of transitions: a few stochastic steps are normal, a twentieth of the data
    pulling Q both ways is not. Below that the finding is info.
    """
    return _disagreement_finding(
        "conflicting_transitions", "(state, action) pairs", zip(state_texts, action_texts, strict=True), outcomes,
        warn_share, max_examples,
        "check whether the environment is stochastic; if not, the state text misses what decides the "
        "outcome (see aliased_states); deduplicate or average the conflicting targets; compare per-step "
        "outcomes (reward, done), not episode success, which differs across attempts by design.")


def aliased_states(state_texts: Sequence[str], next_outcomes: Sequence[Hashable],
                   action_texts: Sequence[str] | None = None, warn_share: float = 0.05,
                   max_examples: int = 3) -> Finding | None:
    """One rendered state text followed by different next observations: distinct underlying
    states rendered alike, so the rendering hides something.

    Pass `action_texts` unless `next_outcomes` is independent of the action taken (e.g. a hidden
    state id), or different choices will read as aliasing. Warn from 5% of rows, as above.
    """
    keys: Iterable[Hashable] = state_texts if action_texts is None else zip(state_texts, action_texts, strict=True)
    return _disagreement_finding(
        "aliased_states", "rendered states", keys, next_outcomes, warn_share, max_examples,
        "widen the render window or max_chars; pin the observations that decide outcomes (inventory, "
        "map, file listing); add history features (repeat counts, steps since new observation); "
        "render status text where the source has it.")


def action_loops(episodes_actions: Sequence[Sequence[str]], max_period: int = 3, min_repeats: int = 3,
                 warn_rate: float = 0.1) -> Finding | None:
    """Closed-loop episodes stuck in a cycle of 1-3 actions repeated 3 times running.

    Two repeats are ordinary (a retry, two doors north); a third identical cycle rarely is.
    Warn when 10% of episodes loop; below that, info.
    """
    n = len(episodes_actions)
    rate = M.loop_rate(episodes_actions, max_period, min_repeats)
    if not n or rate == 0:
        return None
    evidence = (f"{rate:.1%} of {n} episodes repeat a cycle of up to {max_period} actions "
                f"{min_repeats} times in a row")
    return Finding("action_loops", "warn" if rate >= warn_rate else "info", evidence,
                   "add repeat-count features so the critic sees the loop; penalise repeated actions in "
                   "the reward recipe; at serving time, drop a candidate that closes a cycle or fall back; "
                   "add logged loop episodes (with their failure) to the training data.",
                   {"loop_rate": rate, "episodes": float(n)})


def thin_coverage(counts: Mapping[Hashable, int] | Sequence[int], min_count: int = 5,
                  max_thin_share: float = 0.25, max_examples: int = 3) -> Finding | None:
    """Too many tasks (or states, tools) with fewer than 5 transitions, the usual minimum cell
    count: their values rest on a handful of samples. Warn above a quarter of them; info below."""
    items = list(counts.items()) if isinstance(counts, Mapping) else list(enumerate(counts))
    if not items:
        return Finding("thin_coverage", "error", "no data to cover: zero tasks",
                       "check the input paths, the ingest quarantine and the held-out split.", {"keys": 0.0})
    thin = sorted((kv for kv in items if kv[1] < min_count), key=lambda kv: kv[1])
    if not thin:
        return None
    share = len(thin) / len(items)
    examples = ", ".join(f"{_short(k, 40)}: {c}" for k, c in thin[:max_examples])
    evidence = f"{len(thin)} of {len(items)} keys ({share:.1%}) have fewer than {min_count} rows; thinnest: {examples}"
    return Finding("thin_coverage", "warn" if share > max_thin_share else "info", evidence,
                   "collect more episodes for these tasks (the flywheel's decision log counts); merge rare "
                   "tools into a class; raise the fallback threshold where coverage is thin; read their "
                   "metrics as noisy.",
                   {"thin_share": share, "thin": float(len(thin)), "keys": float(len(items))})


def _ood_finding(rate: float, evidence: str, measures: dict[str, float], warn_rate: float,
                 error_rate: float) -> Finding | None:
    if math.isnan(rate) or rate < warn_rate:
        return None
    return Finding("ood_rate", "error" if rate >= error_rate else "warn", evidence,
                   "if these are tasks or items the logs never had, collect logs of them (the decision "
                   "log counts) and retrain; else check that serving renders and encodes states as training "
                   "did (encoder identity, render window); fall back on out-of-distribution states.",
                   {"ood_rate": rate, **measures})


def ood_rate(distances: Sequence[float], threshold: float, warn_rate: float = 0.1,
             error_rate: float = 0.5) -> Finding | None:
    """Served states far from the training data: there the critic extrapolates. Warn from 10%;
    error from 50%, when most decisions rest on extrapolation."""
    rate = M.ood_rate(distances, threshold)
    evidence = f"{rate:.1%} of {len(distances)} states are farther than {threshold:.4g} from the training data"
    return _ood_finding(rate, evidence, {"threshold": float(threshold)}, warn_rate, error_rate)


def served_ood(flags: Sequence[bool], warn_rate: float = 0.1, error_rate: float = 0.5,
               what: str = "the service flagged {rate} of {n} decisions") -> Finding | None:
    """The same finding from `ood` flags: those the service returned (closed-loop play, the decision
    log), where the distances stay inside the service, or the critic's check of held-out states
    (`what` words the evidence)."""
    known = [bool(f) for f in flags if f is not None]
    rate = float(np.mean(known)) if known else float("nan")
    evidence = what.format(rate=f"{rate:.1%}", n=len(known)) + " out of distribution"
    return _ood_finding(rate, evidence, {"decisions": float(len(known))}, warn_rate, error_rate)


def fallback_sample(rows: int, quantile: float, points: float = 0.05) -> Finding | None:
    """The fallback threshold rests on so few steps of successful episodes (held-out ones where there
    are) that the share of new such steps it flags is known only to within more than `points` (95%
    binomial interval of a quantile set on `rows` steps): at the bundled corpus's size (115, +-5.5
    points) the logged actions' rate measured 0.11 and 0.17 on two held-out sets. No steps at all:
    no threshold, the flag never fires."""
    if rows <= 0:
        return Finding("fallback_sample", "error", "no steps to set the fallback threshold on: "
                       "the service will never flag fallback",
                       "log episodes that succeed (outcome.success) and keep task groups out of training "
                       "(train.validation_fraction)", {"rows": 0.0, "quantile": quantile})
    half = 1.96 * math.sqrt(quantile * (1 - quantile) / rows)
    if half <= points:
        return None
    need = math.ceil(quantile * (1 - quantile) * (1.96 / points) ** 2)
    evidence = (f"the fallback threshold is the {quantile:.0%} quantile of only {rows} steps of successful episodes: "
                f"on new steps of such episodes the flag will fire on {quantile:.0%} +- {half:.1%} (95%)")
    return Finding("fallback_sample", "warn", evidence,
                   f"about {need} such steps bring it within +-{points:.0%}: keep more task groups out of training "
                   "(train.validation_fraction) or log more successful episodes; read the flag's rate with "
                   "`harnessrl evaluate` on held-out logs before trusting it",
                   {"rows": float(rows), "quantile": quantile, "half_width": half, "rows_needed": float(need)})


def fallback_calibration(rate: float, quantile: float, steps: int, calibration_steps: int,
                         points: float = 0.05) -> Finding | None:
    """The fallback flag fires on steps of successful held-out episodes at a share `points` or more
    away from the quantile its threshold was set at, beyond the sampling error of both counts (three
    standard errors + one calibration step): the threshold does not mean what the config says."""
    if math.isnan(rate) or not steps or not calibration_steps:
        return None
    off = rate - quantile
    noise = 3 * math.sqrt(quantile * (1 - quantile) * (1 / steps + 1 / calibration_steps)) + 1 / calibration_steps
    if abs(off) < points or abs(off) <= noise:
        return None
    evidence = (f"the fallback flag fires on {rate:.1%} of {steps} steps of successful held-out episodes, "
                f"set at the {quantile:.0%} quantile of {calibration_steps} ({off:+.1%}; sampling error {noise:.1%})")
    fix = ("these tasks score lower than those the threshold was set on: keep task groups out of training "
           "(train.validation_fraction) so the threshold is set on unseen ones; check the OOD rate; lower "
           "train.fallback_quantile for fewer flags." if off > 0 else
           "these tasks score higher than those the threshold was set on: set the threshold on held-out task "
           "groups (train.validation_fraction); raise train.fallback_quantile for more flags.")
    return Finding("fallback_calibration", "warn", evidence, fix,
                   {"rate": rate, "quantile": quantile, "steps": float(steps), "noise": noise})


def fallback_separation(miss_flagged: float, miss_unflagged: float, flagged: int) -> Finding | None:
    """Flagged decisions miss the expert's action no more often than unflagged ones: an agent
    that heeds the flag falls back where the critic was as right as elsewhere."""
    if not flagged or math.isnan(miss_flagged) or math.isnan(miss_unflagged) or miss_flagged > miss_unflagged:
        return None
    evidence = (f"flagged decisions miss the expert's action {miss_flagged:.1%} of the time ({flagged} steps), "
                f"unflagged ones {miss_unflagged:.1%}: the flag does not pick out the wrong choices")
    return Finding("fallback_separation", "warn", evidence,
                   "check that the threshold was set on held-out task groups of this kind "
                   "(train.validation_fraction); read the critic's expert top-1 first: a critic that ranks no "
                   "better than chance has no flag worth heeding.",
                   {"miss_flagged": miss_flagged, "miss_unflagged": miss_unflagged, "flagged": float(flagged)})


def closed_loop_gap(successes: int, episodes: int, baseline_successes: int, baseline_episodes: int,
                    scorer: str = "critic", baseline: str = "behaviour mix") -> Finding | None:
    """The scorer succeeds less often than a baseline played on the same seeds. Error when the
    95% Wilson intervals do not overlap (a real gap), warn when only the point estimate is lower
    (could be noise at this n: play more seeds)."""
    if not episodes or not baseline_episodes:
        return None
    p, q = successes / episodes, baseline_successes / baseline_episodes
    if p >= q:
        return None
    hi = M.wilson_interval(successes, episodes)[1]
    base_lo = M.wilson_interval(baseline_successes, baseline_episodes)[0]
    separated = hi < base_lo
    evidence = (f"{scorer} succeeds in {successes}/{episodes} ({p:.0%}) against {baseline} {baseline_successes}/"
                f"{baseline_episodes} ({q:.0%}) on the same seeds; the 95% intervals "
                + ("do not overlap" if separated else "overlap"))
    return Finding("closed_loop_gap", "error" if separated else "warn", evidence,
                   "following the critic is worse than what the logs already do: check the action_loops "
                   "and aliased_states findings (the state text may hide what decides the outcome), add "
                   "history features, widen the render window or pin key observations; compare offline "
                   "top-1 with this figure (offline top-1 does not predict closed-loop success).",
                   {"success": p, "baseline_success": q, "gap": q - p, "separated": float(separated)})


def closed_loop_findings(episodes: Sequence[Mapping[str, Any]], scorer: str = "critic",
                         baselines: Sequence[str] = ("mix", "random")) -> list[Finding]:
    """Findings of closed-loop play: episodes are dicts with `scorer`, `success`, `actions` and,
    for a served scorer, `ood` (flags of its decisions). Loops and OOD are read from `scorer`'s
    episodes; its success is compared with each baseline that played."""
    own = [e for e in episodes if e["scorer"] == scorer]
    if not own:
        return []
    k = sum(bool(e["success"]) for e in own)
    found = [action_loops([e["actions"] for e in own]),
             served_ood([f for e in own for f in e.get("ood") or []])]
    for name in baselines:
        base = [e for e in episodes if e["scorer"] == name]
        found.append(closed_loop_gap(k, len(own), sum(bool(e["success"]) for e in base), len(base), scorer, name))
    return [f for f in found if f is not None]


# ---- report -----------------------------------------------------------------------------------
def _finite(x: Any) -> np.ndarray:
    a = np.asarray([] if x is None else x, dtype=np.float64).reshape(-1)
    return a[np.isfinite(a)]


def _figure(n_axes: int = 1):
    """A figure on the Agg canvas, without pyplot: no global state, no display needed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(3, n_axes)
    rows = math.ceil(n_axes / cols)
    fig = Figure(figsize=(4.5 * cols, 3.2 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n_axes)]


def _plot_curves(curves: Mapping[str, Sequence[Any]] | None, path: Path) -> bool:
    drawn = {name: _curve(points) for name, points in (curves or {}).items() if len(points)}
    if not drawn:
        return False
    fig, axes = _figure(len(drawn))
    for ax, (name, (x, y)) in zip(axes, drawn.items()):
        ax.plot(x, y)
        ax.set(title=name, xlabel="step")
    fig.savefig(path, dpi=100)
    return True


def _plot_hist(values: Any, path: Path, xlabel: str, zero_line: bool = False) -> bool:
    v = _finite(values)
    if not v.size:
        return False
    fig, (ax,) = _figure()
    ax.hist(v, bins=min(50, max(10, v.size // 20)))
    if zero_line:
        ax.axvline(0.0, color="k", linewidth=1)
    ax.set(xlabel=xlabel, ylabel="count")
    fig.savefig(path, dpi=100)
    return True


def _plot_value_vs_return(values: Any, returns: Any, path: Path) -> bool:
    v = np.asarray([] if values is None else values, dtype=np.float64).reshape(-1)
    g = np.asarray([] if returns is None else returns, dtype=np.float64).reshape(-1)
    if v.size != g.size:
        raise ValueError(f"value ({v.size}) and return_to_go ({g.size}) must pair up")
    keep = np.isfinite(v) & np.isfinite(g)
    v, g = v[keep], g[keep]
    if not v.size:
        return False
    if v.size > MAX_SCATTER_POINTS:
        pick = np.random.default_rng(0).choice(v.size, MAX_SCATTER_POINTS, replace=False)
        v, g = v[pick], g[pick]
    fig, (ax,) = _figure()
    ax.scatter(g, v, s=4, alpha=0.4)
    lo, hi = float(min(g.min(), v.min())), float(max(g.max(), v.max()))
    ax.plot([lo, hi], [lo, hi], color="k", linewidth=1)
    ax.set(xlabel="return-to-go", ylabel="V(s)")
    fig.savefig(path, dpi=100)
    return True


def _plots(curves: Mapping[str, Sequence[Any]] | None,
           arrays: Mapping[str, Any]) -> list[tuple[str, str, Callable[[Path], bool]]]:
    """(title, file name, draw) for every plot of the report; draw returns False on no data."""
    return [
        ("Learning curves", "learning_curves.png", lambda p: _plot_curves(curves, p)),
        ("Q distribution", "q_distribution.png", lambda p: _plot_hist(arrays.get("q"), p, "Q(s, a)")),
        ("Advantage histogram", "advantage_hist.png",
         lambda p: _plot_hist(arrays.get("advantage"), p, "Q(s, a) - V(s)", zero_line=True)),
        ("Value vs return-to-go", "value_vs_return.png",
         lambda p: _plot_value_vs_return(arrays.get("value"), arrays.get("return_to_go"), p)),
    ]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _findings_md(findings: Sequence[Finding]) -> list[str]:
    if not findings:
        return ["No findings: every detector stayed quiet.", ""]
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITY_ORDER}
    lines = [f"{len(findings)} findings: {counts['error']} error, {counts['warn']} warn, {counts['info']} info.", ""]
    for f in sorted(findings, key=lambda f: SEVERITY_ORDER[f.severity]):
        lines += [f"### [{f.severity.upper()}] {f.name}", "", f"- Evidence: {f.evidence}",
                  f"- What to try: {f.what_to_try}", ""]
    return lines


def _metrics_md(metrics: Mapping[str, Any]) -> list[str]:
    flat = M.flatten(metrics)
    if not flat:
        return ["_No metrics._", ""]
    rows = [f"| {_md_cell(k)} | {_md_cell(M.format_value(v))} |" for k, v in flat.items()]
    return ["| metric | value |", "|---|---:|", *rows, ""]


def render_report(findings: Sequence[Finding], metrics: Mapping[str, Any],
                  curves: Mapping[str, Sequence[Any]] | None, arrays: Mapping[str, Any] | None,
                  out_dir: str | Path, title: str = "harnessrl diagnosis") -> Path:
    """Write report.md and its PNG plots into out_dir; returns the report's path.

    curves: name -> [(step, value), ...] (learning curves). arrays: optional "q", "advantage",
    "value" and "return_to_go" (value and return_to_go paired row by row). A plot without data
    is not drawn (and a stale file of that name is removed); the report says so instead.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", "", "## Findings", "", *_findings_md(findings), "## Metrics", "", *_metrics_md(metrics),
             "## Plots", ""]
    for plot_title, name, draw in _plots(curves, arrays or {}):
        path = out / name
        path.unlink(missing_ok=True)
        body = f"![{plot_title}]({name})" if draw(path) else "_Not drawn: no data._"
        lines += [f"### {plot_title}", "", body, ""]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report
