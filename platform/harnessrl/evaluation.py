"""Offline sanity figures on held-out steps (the full evaluation suite is DESIGN §7).

Gold top-1: how often the critic ranks the expert's action first among the step's valid
candidates, against a random scorer's expectation (mean of 1/|candidates|). The expert
action is read from the logs' `info` for evaluation only; it is never a training input.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from harnessrl.transitions import untaken_candidates


def candidate_features(t: dict[str, Any], candidates: list[str]) -> list[list[float]] | None:
    """Each candidate's history features, read back from a transition row (the taken action's
    `features`, the others' `candidate_features`), so that held-out text states are scored with
    the history the critic would have seen in a structured request."""
    if t.get("features") is None:
        return None
    by_text = dict(zip(untaken_candidates(t["action_text"], t.get("candidates")), t.get("candidate_features") or []))
    by_text[t["action_text"]] = t["features"]
    return [by_text[c] for c in candidates]


def gold_rows(transitions: Iterable[dict[str, Any]], limit: int | None = None) -> list[dict[str, Any]]:
    """Held-out steps whose candidates include a known expert action."""
    rows = []
    for t in transitions:
        expert = json.loads(t.get("info") or "{}").get("expert_action")
        cands = t.get("candidates") or []
        if expert and len(cands) > 1 and expert in cands:
            rows.append({"state_text": t["state_text"], "candidates": list(cands), "expert": expert,
                         "features": candidate_features(t, list(cands)),
                         "episode_id": t["episode_id"], "step_idx": t["step_idx"]})
    rows.sort(key=lambda r: (r["episode_id"], r["step_idx"]))
    return rows[:limit] if limit else rows


def gold_top1(critic, rows: list[dict[str, Any]], chunk: int = 64) -> dict[str, float]:
    hits, baseline = 0, 0.0
    for i in range(0, len(rows), chunk):
        part = rows[i:i + chunk]
        features = [r.get("features") for r in part]
        scored = critic.score_batch([(r["state_text"], r["candidates"]) for r in part],
                                    features=features if all(f is not None for f in features) else None)
        for row, scores in zip(part, scored):
            best = max(range(len(scores)), key=scores.__getitem__)
            hits += row["candidates"][best] == row["expert"]
            baseline += 1.0 / len(row["candidates"])
    n = len(rows)
    return {"steps": n, "gold_top1": hits / n if n else float("nan"),
            "random_top1": baseline / n if n else float("nan")}
