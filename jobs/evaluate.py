"""Offline evaluation of a critic on held-out logs (DESIGN §7): metrics, MLflow, diagnosis report.

The held-out logs go through the same ingest and transitions code as training, rendered with
the model's own settings, so the critic sees exactly what it would see in serving. Offline
figures explain a model; they do not predict closed-loop success (bench/twx.py measures that).
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harnessrl import diagnosis, metrics, storage
from harnessrl.config import PRIOR_WEIGHT
from harnessrl.errors import DataError
from harnessrl.evaluation import row_state

log = logging.getLogger(__name__)
LATENCY_REQUESTS = 50  # single decide() calls timed one by one
CURVES = ("loss_q", "loss_v", "td_error", "val_td_error", "q_abs_max", "tool_policy_entropy")


@dataclass
class EvaluationResult:
    model: dict[str, Any]
    metrics: dict[str, float]
    findings: list[dict[str, Any]]
    report: str | None
    mlflow_run_id: str | None
    seconds: float
    sizes: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _critic_values(critic, rows: list[dict]) -> dict[str, np.ndarray]:
    """Q(s, a) of the logged actions, V(s), V(s') in reward units."""
    q, v, v2 = critic.values([row_state(r) for r in rows], [r["action_text"] for r in rows],
                             [row_state(r, "next_state") for r in rows], [r["features"] for r in rows])
    return {"q": q, "v": v, "v_next": v2}


def _candidate_rows(rows: list[dict]) -> list[dict]:
    from harnessrl.evaluation import candidate_features

    return [{**r, "cands": list(r["candidates"]), "cand_f": candidate_features(r, list(r["candidates"]))}
            for r in rows if r.get("candidates") and len(r["candidates"]) > 1]


def _decisions(critic, rows: list[dict], expert_field: str, prior_weight: float) -> dict[str, Any]:
    """Every step that logged candidates: its scores, the service's ranking (score + prior_weight *
    log pi_beta; None for every step when the critic has no behaviour prior or the weight is 0), and
    the expert's index where the step names the expert's action (at `expert_field`, see
    harnessrl.evaluation.expert_action)."""
    from harnessrl.evaluation import expert_action, ranked

    with_c = _candidate_rows(rows)
    scores, blended = ranked(critic, [{"state": row_state(r), "candidates": r["cands"], "features": r["cand_f"]}
                                      for r in with_c], prior_weight=prior_weight)
    experts = []
    for r in with_c:
        expert = expert_action(r, expert_field)
        experts.append(r["cands"].index(expert) if expert in r["cands"] else None)
    return {"rows": with_c, "scores": scores, "blended": blended, "experts": experts}


def _decision_figures(critic, dec: dict[str, Any], prior_weight: float) -> dict[str, float]:
    """The steps decided as the service decides them (`Critic.decide_scores` on the blended ranking
    when there is one): expert top-1 of the scores alone and of that ranking (`expert_top1_prior`),
    the fallback flag's rate, overall and on the steps of successful episodes
    (`fallback_rate_success_decisions`: what an agent sees where it succeeds), and how often the
    chosen candidate misses the expert's with the flag up and down (a flag worth heeding: far apart)."""
    blended = dec["blended"]
    out = {f"expert_{k}": v for k, v in metrics.top1_rate(dec["scores"], dec["experts"]).items()}
    out["prior_weight"] = prior_weight if blended is not None else 0.0
    if blended is not None:
        out["expert_top1_prior"] = metrics.top1_rate(blended, dec["experts"])["top1"]
    rankings = blended or [None] * len(dec["scores"])
    decisions = [critic.decide_scores(s, ranking=b) for s, b in zip(dec["scores"], rankings)]
    flags = np.array([d.fallback for d in decisions], bool)
    out["fallback_rate"] = float(flags.mean()) if flags.size else float("nan")
    ok = np.array([bool(r.get("outcome_success")) for r in dec["rows"]], bool)
    if critic.threshold is not None and ok.any():
        out["fallback_rate_success_decisions"] = float(flags[ok].mean())
        out["success_decisions"] = int(ok.sum())
    # what the flag is worth: how often the chosen candidate is not the expert's, flagged or not
    known = np.array([e is not None for e in dec["experts"]], bool)
    miss = np.array([d.best_index != e for d, e in zip(decisions, dec["experts"])], bool)  # read where known
    for name, where in (("expert_miss_fallback", known & flags), ("expert_miss_no_fallback", known & ~flags)):
        out[name] = float(miss[where].mean()) if where.any() else float("nan")
    out["expert_n_fallback"] = int((known & flags).sum())
    return out


def _tool_metrics(critic, rows: list[dict]) -> dict[str, float]:
    """Entropy of the tool head's policy and how often its choice is not among the step's tools."""
    import torch

    if critic.tool_head is None:
        return {}
    state_emb = critic.encode([critic.state_text(row_state(r)) for r in rows])  # cached by the OOD pass
    with torch.no_grad():
        probs = torch.softmax(critic.tool_head.pi(torch.from_numpy(state_emb).float()), dim=1).numpy()
    out = {f"tool_{k}": v for k, v in metrics.policy_entropy(probs).items()}
    vocab = {t: i for i, t in enumerate(critic.tool_vocab)}
    idx = [i for i, r in enumerate(rows) if r.get("candidates")]
    if idx:
        mask = np.zeros((len(idx), len(vocab)), bool)
        for j, i in enumerate(idx):
            for c in rows[i]["candidates"]:
                if critic.renderer.tool(c) in vocab:
                    mask[j, vocab[critic.renderer.tool(c)]] = True
        out["invalid_tool_rate"] = metrics.invalid_tool_rate(probs[idx].argmax(1), mask)
    return out


def calibration(critic, rows: list[dict], q: np.ndarray, ood: list[bool] | None) -> dict[str, float]:
    """Whether the critic's flags mean what they say on these held-out rows: the share of the steps of
    successful episodes whose logged action scores under the fallback threshold (it was set at the
    `fallback_quantile` of such steps: held-out tasks of the same kind should give about that share),
    and the share of states flagged out of distribution (calibrated at 1% of held-out states)."""
    out: dict[str, float] = {}
    ok = np.array([bool(r.get("outcome_success")) for r in rows])
    if critic.threshold is not None and ok.any():
        out["fallback_rate_success_steps"] = float(np.mean(q[ok] < critic.threshold))
        out["fallback_quantile"] = float(critic.card.fallback_quantile)
        out["success_steps"] = float(ok.sum())
    if ood:
        out["ood_rate"] = float(np.mean(ood))
    return out


def _latency(critic, cand_rows: list[dict]) -> dict[str, float]:
    seconds = []
    for r in cand_rows[:LATENCY_REQUESTS]:
        t0 = time.perf_counter()
        critic.decide(row_state(r), r["cands"])
        seconds.append(time.perf_counter() - t0)
    return {f"latency_{k}": v for k, v in metrics.latency_summary(seconds).items()}


def _episode_selection(rows: list[dict], q: np.ndarray) -> dict[str, float]:
    """Attempts of the same task scored by the mean Q of their logged actions."""
    by_ep: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_ep.setdefault(r["episode_id"], []).append(i)
    eps = [(rows[ix[0]]["task_id"], float(np.mean(q[ix])), bool(rows[ix[0]]["outcome_success"]))
           for ix in by_ep.values() if rows[ix[0]]["outcome_success"] is not None]
    if not eps:
        return {"selection_lift": float("nan"), "n_tasks": 0}
    tasks, scores, ok = zip(*eps)
    return metrics.selection_lift(tasks, scores, ok)


def training_curves(card) -> dict[str, list[tuple[int, float]]]:
    """Learning curves of the model's training run (its card's MLflow run), {} when out of reach."""
    run_id = card.lineage.get("mlflow_run_id")
    if not run_id:
        return {}
    from harnessrl import registry

    client = registry.client()
    curves = {}
    for key in CURVES:
        try:
            history = client.get_metric_history(run_id, f"train/{key}")
        except Exception:  # the training run lives in another tracking store
            return {}
        if history:
            curves[key] = [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)]
    return curves


def _findings(critic, rows, values, scale, curves) -> list:
    gamma = critic.card.gamma
    r_max = float(np.max(np.abs([r["reward"] for r in rows]))) if rows else 1.0
    states = [r["state_text"] for r in rows]
    actions = [r["action_text"] for r in rows]
    found = [
        diagnosis.q_blowup(values["q"], metrics.reward_bound(r_max, gamma)),
        # per-step outcome: what the step itself earned and whether it ended the episode
        diagnosis.conflicting_transitions(states, actions, [(round(r["reward"], 3), r["done"]) for r in rows]),
        diagnosis.aliased_states(states, [r["next_state_text"] for r in rows], actions),
        diagnosis.thin_coverage({t: n for t, n in scale.items()}),
    ]
    if "tool_policy_entropy" in curves and critic.tool_vocab:
        found.append(diagnosis.entropy_collapse(curves["tool_policy_entropy"], len(critic.tool_vocab)))
    return [f for f in found if f is not None]


def _flag_findings(critic, figures: dict[str, float], ood: list[bool] | None) -> list:
    """Whether the fallback and OOD flags mean what they say on these held-out rows (DESIGN §6.5)."""
    nan = float("nan")
    found = [diagnosis.served_ood(ood or [], what="the OOD check flagged {rate} of {n} held-out states"),
             diagnosis.fallback_calibration(figures.get("fallback_rate_success_decisions", nan),
                                            critic.card.fallback_quantile, int(figures.get("success_decisions", 0)),
                                            critic.card.fallback_rows or 0),
             # cards written before the count was kept say nothing of it
             diagnosis.fallback_sample(critic.card.fallback_rows, critic.card.fallback_quantile)
             if critic.card.fallback_rows is not None else None,
             diagnosis.fallback_separation(figures.get("expert_miss_fallback", nan),
                                           figures.get("expert_miss_no_fallback", nan),
                                           int(figures.get("expert_n_fallback", 0)))]
    return [f for f in found if f is not None]


def training_groups(card) -> set[str] | None:
    """Task groups (`group_id`) of the model's training transitions; None when the model does not
    name them or they are out of reach (moved, deleted, another machine)."""
    path = card.lineage.get("transitions")
    if not path:
        return None
    try:
        column = storage.read_parquet(path, ["group_id"]).column(0)
    except (OSError, ValueError) as exc:
        log.warning("evaluate: cannot read the training transitions at %s (%s): task overlap not checked", path, exc)
        return None
    return {g for g in column.to_pylist() if g is not None}


def _held_out(rows: list[dict], card, include_seen: bool) -> tuple[list[dict], dict[str, float]]:
    """Rows of task groups the model never trained on (DESIGN §7: no task in both splits)."""
    seen = training_groups(card)
    if seen is None:
        return rows, {"seen_groups_checked": 0.0}
    groups = {r["group_id"] for r in rows}
    overlap = groups & seen
    figures = {"seen_groups_checked": 1.0, "seen_groups": float(len(overlap)), "groups": float(len(groups))}
    if include_seen or not overlap:
        return rows, figures
    kept = [r for r in rows if r["group_id"] not in overlap]
    if not kept:
        raise DataError(f"all {len(groups)} task groups of the evaluation data were in the model's training data: "
                        "evaluate on other tasks, or pass --include-seen to score them anyway (optimistic figures)")
    log.info("evaluate: dropped %d of %d task groups seen in training (%d of %d steps)", len(overlap), len(groups),
             len(rows) - len(kept), len(rows))
    return kept, figures


def evaluate(model_uri: str, sources: list[str], fmt: str = "auto", out_dir: str | None = None,
             max_steps: int | None = None, log_to_mlflow: bool = True,
             experiment: str = "harnessrl-evaluate", include_seen: bool = False,
             expert_field: str | None = None, prior_weight: float = PRIOR_WEIGHT) -> EvaluationResult:
    """Score held-out logs with the critic at `model_uri`; returns metrics, findings and the report path.

    Task groups the model trained on are left out (their figures would be optimistic) unless
    `include_seen`; how many were is in the metrics (`seen_groups`). `expert_field`: the dotted
    path of the expert's action in a step (default `evaluation.EXPERT_FIELD`; expert top-1 is n/a
    where no step names one). `prior_weight`: the decisions are ranked as the service ranks at this
    weight (score + w * log pi_beta when the critic has a behaviour prior; 0: the scores alone)."""
    from harnessrl.critic import Critic
    from harnessrl.evaluation import EXPERT_FIELD
    from harnessrl.pipelines.ingest import ingest
    from harnessrl.pipelines.transitions import build_transitions
    from harnessrl.rewards import load_recipe

    started = time.time()
    critic = Critic.load(model_uri)
    out = out_dir or tempfile.mkdtemp(prefix="harnessrl-eval-")
    recipe = load_recipe(critic.card.lineage.get("reward_recipe") or "default")
    ing = ingest(sources, storage.join(out, "ingest"), fmt)
    if ing.episodes == 0:
        raise DataError(f"no valid episodes in {', '.join(sources)} ({ing.records_quarantined} quarantined)")
    build_transitions(storage.join(out, "ingest"), storage.join(out, "transitions"), recipe,
                      critic.card.render)
    rows = sorted(storage.read_parquet(storage.join(out, "transitions")).to_pylist(),
                  key=lambda r: (r["episode_id"], r["step_idx"]))
    rows, split = _held_out(rows, critic.card, include_seen)
    if max_steps:
        rows = rows[:max_steps]
    values = _critic_values(critic, rows)
    gamma = critic.card.gamma
    r = np.array([x["reward"] for x in rows])
    done = np.array([x["done"] for x in rows])
    figures: dict[str, float] = {"steps": len(rows), "episodes": len({x["episode_id"] for x in rows}), **split}
    figures.update(metrics.td_error(values["q"], r, done, values["v_next"], gamma))
    figures.update(metrics.value_scale(values["v"], float(np.max(np.abs(r))) if len(r) else 1.0, gamma))
    figures["spearman_v_rtg"] = metrics.spearman(values["v"], [x["return_to_go"] for x in rows])
    figures.update(_episode_selection(rows, values["q"]))
    expert_field = expert_field or EXPERT_FIELD
    dec = _decisions(critic, rows, expert_field, prior_weight)
    figures.update(_decision_figures(critic, dec, prior_weight))
    if not figures["expert_n_steps"]:
        log.warning("evaluate: no held-out step has an expert action at %s among its candidates: expert top-1 "
                    "not measured", expert_field)
    ood = critic.out_of_distribution([row_state(r) for r in rows]) if critic.ood_reference is not None else None
    figures.update(calibration(critic, rows, values["q"], ood))
    figures.update(_tool_metrics(critic, rows))
    figures.update(_latency(critic, dec["rows"]))
    per_task: dict[str, int] = {}
    for x in rows:
        per_task[x["task_id"]] = per_task.get(x["task_id"], 0) + 1
    curves = training_curves(critic.card)
    findings = _findings(critic, rows, values, per_task, curves) + _flag_findings(critic, figures, ood)
    report = diagnosis.render_report(
        findings, figures, curves,
        {"q": values["q"], "advantage": values["q"] - values["v"], "value": values["v"],
         "return_to_go": np.array([x["return_to_go"] for x in rows])},
        storage.join(out, "report"), title=f"harnessrl diagnosis: {critic.name} v{critic.version}")
    run_id = None
    if log_to_mlflow:
        run_id = log_report({f"eval/{k}": v for k, v in figures.items()}, findings, report.parent, experiment,
                            f"evaluate-{critic.name}-v{critic.version}",
                            {"harnessrl.model": critic.name, "harnessrl.model_version": str(critic.version)})
    model = {"name": critic.name, "version": critic.version, "uri": model_uri}
    log.info("evaluate: %d held-out steps of %d episodes in %.0f s; %d finding(s)", len(rows),
             figures["episodes"], time.time() - started, len(findings))
    return EvaluationResult(model=model, metrics=figures, findings=[f.to_dict() for f in findings],
                            report=str(report), mlflow_run_id=run_id, seconds=time.time() - started,
                            sizes={"records_in": ing.records_in, "quarantined": ing.records_quarantined})


def log_report(metrics: dict, findings: list, report_dir, experiment: str, run_name: str,
               tags: dict[str, str] | None = None) -> str:
    """One MLflow run holding a diagnosis: the finite numeric metrics, the findings as JSON and
    the report folder (markdown and plots) under `diagnosis/`; returns the run id. Used by
    `evaluate` and by bench/twx.py."""
    import math

    import mlflow

    from harnessrl import registry

    with mlflow.start_run(experiment_id=registry.ensure_experiment(experiment), run_name=run_name) as run:
        if tags:
            mlflow.set_tags(tags)
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)})
        mlflow.log_dict({"findings": [f.to_dict() for f in findings]}, "findings.json")
        mlflow.log_artifacts(str(report_dir), artifact_path="diagnosis")
        return run.info.run_id
