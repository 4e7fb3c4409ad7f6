"""Offline sanity figures on held-out steps (the full evaluation suite is DESIGN §7).

Gold top-1: how often the critic ranks the expert's action first among the step's valid
candidates, against a random scorer's expectation (mean of 1/|candidates|). The expert
action is read from the logs for evaluation only (a dotted path, `evaluate.expert_field`,
default `info.expert_action`); it is never a training input. Held-out data without expert
labels has no such figure: it is reported as not measured (None), never as NaN. A critic
with a behaviour prior is also measured as the service ranks by default (score + w * log pi_beta).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from harnessrl.config import PRIOR_WEIGHT, EvaluateConfig
from harnessrl.critic import blend
from harnessrl.transitions import untaken_candidates

EXPERT_FIELD: str = EvaluateConfig.model_fields["expert_field"].default


def candidate_features(t: dict[str, Any], candidates: list[str]) -> list[list[float]] | None:
    """Each candidate's history features, read back from a transition row (the taken action's
    `features`, the others' `candidate_features`), so that held-out text states are scored with
    the history the critic would have seen in a structured request."""
    if t.get("features") is None:
        return None
    by_text = dict(zip(untaken_candidates(t["action_text"], t.get("candidates")), t.get("candidate_features") or []))
    by_text[t["action_text"]] = t["features"]
    return [by_text[c] for c in candidates]


def expert_action(t: dict[str, Any], field: str = EXPERT_FIELD) -> str | None:
    """The expert's action of a transition row at a dotted path: the first part names a column
    (`info` is the step's JSON info object), the rest are keys inside it; None when absent."""
    head, *keys = field.split(".")
    value: Any = t.get(head)
    if head == "info":
        try:
            value = json.loads(value or "{}")
        except (TypeError, ValueError):
            return None
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) and value else None


def row_state(t: dict[str, Any], key: str = "state"):
    """A transition row's state (`key` "state" or "next_state") as the critic parses a request: its
    rendered text and its segments (a reader head reads those), so that held-out rows are scored as
    the states the critic trained on."""
    from harnessrl.render import RequestState, Segment

    text = t[f"{key}_text"]
    segments = tuple(Segment(s["role"], int(s["age"]), s["text"]) for s in t.get(f"{key}_segments") or ())
    return RequestState(text, segments=segments or (Segment("text", 0, text),))


def _row(t: dict[str, Any], candidates: list[str], expert: str | None) -> dict[str, Any]:
    return {"state_text": t["state_text"], "state": row_state(t), "candidates": candidates, "expert": expert,
            "features": candidate_features(t, candidates), "episode_id": t["episode_id"], "step_idx": t["step_idx"]}


def gold_rows(transitions: Iterable[dict[str, Any]], limit: int | None = None,
              expert_field: str = EXPERT_FIELD) -> list[dict[str, Any]]:
    """Held-out steps whose candidates include a known expert action."""
    rows = []
    for t in transitions:
        expert = expert_action(t, expert_field)
        cands = t.get("candidates") or []
        if expert and len(cands) > 1 and expert in cands:
            rows.append(_row(t, list(cands), expert))
    rows.sort(key=lambda r: (r["episode_id"], r["step_idx"]))
    return rows[:limit] if limit else rows


def smoke_rows(transitions: list[dict[str, Any]], gold: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """`n` held-out states to score over HTTP, spread over the data: gold rows when there are any,
    else any steps with candidates (or their logged action alone), with no expert to show."""
    pool = gold or sorted((_row(t, list(t.get("candidates") or [t["action_text"]]), None) for t in transitions),
                          key=lambda r: (r["episode_id"], r["step_idx"]))
    if n <= 0 or not pool:
        return []
    return pool[::max(1, len(pool) // n)][:n]


def _prepared(critic, rows: list[dict[str, Any]], chunk: int):
    """`chunk` rows at a time: the critic's parse of their (state, candidates) and the rows' logged
    history features (None unless every row has them)."""
    for i in range(0, len(rows), chunk):
        part = rows[i:i + chunk]
        features = [r.get("features") for r in part]
        yield (critic.prepare([(r.get("state") or r["state_text"], r["candidates"]) for r in part]),
               features if all(f is not None for f in features) else None)


def score_rows(critic, rows: list[dict[str, Any]], chunk: int = 64) -> list[list[float]]:
    """The critic's scores of each row's candidates, `chunk` rows per batch (with the rows' logged
    history features when every row has them)."""
    return ranked(critic, rows, chunk, prior_weight=0)[0]


def ranked(critic, rows: list[dict[str, Any]], chunk: int = 64, prior_weight: float = PRIOR_WEIGHT
           ) -> tuple[list[list[float]], list[list[float]] | None]:
    """Each row's critic scores and, with a behaviour prior and `prior_weight` > 0, the service's
    ranking of its candidates when an agent sends no logprobs: score + prior_weight * log pi_beta
    (None otherwise). One parse per chunk for both."""
    prior = prior_weight > 0 and critic.has_prior
    scores, blended = [], []
    for prep, features in _prepared(critic, rows, chunk):
        part = critic.score_prepared(prep, features)[0]
        scores += part
        if prior:
            blended += [blend(s, lp, prior_weight) for s, lp in zip(part, critic.prior_logprobs(prep))]
    return scores, blended if prior else None


def gold_top1(critic, rows: list[dict[str, Any]], chunk: int = 64, prior_weight: float = PRIOR_WEIGHT
              ) -> dict[str, float | None]:
    """Gold and random top-1 over `rows`; both None (not measured) when there are none. With a
    behaviour prior and `prior_weight` > 0, also the top-1 of score + prior_weight * log pi_beta
    (`gold_top1_prior`): what the service ranks by when an agent sends no logprobs."""
    n = len(rows)
    if not n:
        return {"steps": 0, "gold_top1": None, "random_top1": None}
    scores, blended = ranked(critic, rows, chunk, prior_weight)

    def top1(rankings: list[list[float]]) -> float:
        return sum(r["candidates"][max(range(len(x)), key=x.__getitem__)] == r["expert"]
                   for r, x in zip(rows, rankings)) / n

    out = {"steps": n, "gold_top1": top1(scores), "random_top1": sum(1.0 / len(r["candidates"]) for r in rows) / n}
    if blended is not None:
        out.update(gold_top1_prior=top1(blended), prior_weight=prior_weight)
    return out
