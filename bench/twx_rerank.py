"""The rerank protocol of bench/twx.py (issue 22): the agent proposes K actions, a scorer picks one.

This is how a critic is used (and what Retrospex, Best-of-Q and Agent Q measure): not "choose
among every valid action" but "choose among what the agent itself would do". At every step
the behaviour agent (careful, mistaken or flailing of harnessrl.examples.twx, the stand-in
LLM) draws K proposals i.i.d. from its own per-step distribution (`behaviour_step`: the
generator's, exactly); the distinct ones, in first-drawn order and each with its exact
log-probability, are what a scorer picks from:

  agent               the first proposal: the agent alone (first pass)
  agent+self          the proposal the agent rates most likely (self-consistency; ties: first drawn)
  agent+critic        the service's best_index over {text, logprob} candidates with prior_weight 0
                      (a `fallback` answer is counted, not acted on)
  agent+critic+again  the same, but on a `fallback` answer the agent draws K new proposals once
                      ("ask again") and the critic picks among those
  agent+critic+prior  the service's best_index with a per-request prior_weight w: the argmax of its
                      blended_scores = score + w * logprob (w from a sweep on seeds in no tier)
  agent+bc            BC (bench/twx_bc.py) as the reranker over the proposals
  agent+oracle        the expert's action when it is proposed, else the first proposal: the ceiling

This module holds the pure parts (proposals, pick rules, statistics, tables, diagnosis
figures); bench/twx.py plays the games.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random
from typing import Any, Callable

SCORERS = ("agent", "agent+self", "agent+critic", "agent+critic+again", "agent+critic+prior", "agent+bc",
           "agent+oracle")
REDUCED_SCORERS = ("agent", "agent+self", "agent+critic", "agent+oracle")
AGAIN = "+again"  # suffix: on a fallback answer the agent proposes once more
AGENTS = ("careful", "mistaken", "flailing")
DEFAULT_AGENTS = ("mistaken",)  # the low-first-pass stand-in of the targets
DEFAULT_K = (4,)
PRIOR_WEIGHTS = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)  # the sweep's grid for agent+critic+prior: scores are
# in reward units (bundled-log critic, mistaken K=4: median spread over a step's proposals 20, logprobs 1.1)
TOP_INSTEAD = 3  # (expert, taken instead) pairs kept per cell


def uses_critic(scorer: str) -> bool:
    return scorer.startswith("agent+critic")


def propose(step, k: int, rng: random.Random) -> list[tuple[str, float]]:
    """K i.i.d. draws from the agent's step (a harnessrl.examples.twx.BehaviourStep): the distinct
    actions in first-drawn order, each with log P(action) under that same step (clipped at 0: a
    float sum of shares may pass 1 by an ulp, and the service takes logprobs <= 0)."""
    probs = step.probabilities()
    out: dict[str, float] = {}
    for _ in range(k):
        action = step.sample(rng)[0]
        if action not in out:
            out[action] = min(0.0, math.log(probs[action]))
    return list(out.items())


def pick(scorer: str, proposals: list[tuple[str, float]], expert: str | None, state: dict, ctx: dict,
         prior_weight: float = 0.0) -> tuple[int, dict | None]:
    """(index of the proposal `scorer` takes, the service's answer for a critic scorer else None),
    before any ask-again. A critic scorer takes the service's own best_index: with a weight and
    logprobs present that is the argmax of its blended_scores, not recomputed here."""
    from harnessrl.critic import best_allowed

    texts = [a for a, _ in proposals]
    base = scorer.removesuffix(AGAIN)
    if base == "agent":
        return 0, None
    if base == "agent+self":
        return max(range(len(proposals)), key=lambda i: proposals[i][1]), None  # max keeps the first of ties
    if base == "agent+oracle":
        return (texts.index(expert) if expert in texts else 0), None
    if base == "agent+bc":
        return best_allowed(ctx["bc"].scores(state, texts)), None
    if base in ("agent+critic", "agent+critic+prior"):
        weight = prior_weight if base == "agent+critic+prior" else 0.0
        body = ctx["critic"].score(state, [{"text": a, "logprob": lp} for a, lp in proposals], prior_weight=weight)
        return int(body["best_index"]), body
    raise ValueError(f"unknown rerank scorer {scorer!r}")


def decision(proposals: list[tuple[str, float]], chosen: int, expert: str | None, body: dict | None) -> dict:
    """One pick as the decision log keeps it (the service's scores and fallback flag for a critic)."""
    rec: dict[str, Any] = {"proposals": [a for a, _ in proposals], "logprobs": [lp for _, lp in proposals],
                           "chosen": chosen, "expert": expert}
    if body is not None:
        rec.update(scores=body["scores"], blended=body.get("blended_scores"), fallback=bool(body["fallback"]))
    return rec


def final(step_log: dict) -> dict:
    """The pick a step's action came from: the second one when the agent asked again."""
    return step_log.get("again", step_log)


def choose_weight(successes: dict[float, int]) -> float:
    """The swept weight with the most successes; ties: the smallest (the least prior)."""
    return min(successes, key=lambda w: (-successes[w], w))


def decision_stats(episodes: list[dict]) -> dict[str, Any]:
    """What a cell's proposals held and what its scorer did with them: mean distinct proposals,
    the share of decisions (with a known expert) whose proposals held the expert's action, the
    share of those where it was taken, how often the agent asked again, and the commonest
    (expert, taken instead) pairs where the expert was proposed and passed over."""
    picks = [final(d) for e in episodes for d in e["log"]]
    known = [d for d in picks if d["expert"] is not None]
    proposed = [d for d in known if d["expert"] in d["proposals"]]
    missed = collections.Counter((d["expert"], d["proposals"][d["chosen"]]) for d in proposed
                                 if d["proposals"][d["chosen"]] != d["expert"])
    again = [e for e in episodes if e["scorer"].endswith(AGAIN)]
    steps = sum(e["steps"] for e in again)
    return {
        "mean_proposals": sum(len(d["proposals"]) for d in picks) / len(picks) if picks else None,
        "expert_proposed": len(proposed) / len(known) if known else None,
        "expert_picked": (len(proposed) - sum(missed.values())) / len(proposed) if proposed else None,
        "asked_again_rate": sum(e["asked_again"] for e in again) / steps if again and steps else None,
        "instead": [[expert, taken, n] for (expert, taken), n in missed.most_common(TOP_INSTEAD)],
    }


def cell_key(agent: str, k: int, scorer: str, tier: str, family: str) -> str:
    return f"{agent}|k{k}|{scorer}|{tier}|{family}"


def table(episodes: list[dict], cfg: dict, summarise: Callable[[list[dict]], dict]) -> dict[str, dict]:
    """agent x K x scorer x (each tier, "all") x (each family, "all") -> bench/twx.py's summary
    (success, Wilson 95% interval, fallback rate, ...) plus `decision_stats`."""
    out = {}
    for agent in cfg["agents"]:
        for k in cfg["k"]:
            for scorer in cfg["scorers"]:
                own = [e for e in episodes if (e["agent"], e["k"], e["scorer"]) == (agent, k, scorer)]
                for tier in [*cfg["tiers"], "all"]:
                    for family in [*cfg["families"], "all"]:
                        eps = [e for e in own if tier in ("all", e["tier"]) and family in ("all", e["family"])]
                        out[cell_key(agent, k, scorer, tier, family)] = {**summarise(eps), **decision_stats(eps)}
    return out


# ---- presentation ------------------------------------------------------------------------------
def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


OVERALL_HEADER = ["agent", "K", "scorer", "prior w", "n", "success", "95% CI", "success id / ood", "fallback rate",
                  "asked again", "expert proposed", "expert picked", "mean proposals", "loop rate"]


def overall_rows(rerank: dict) -> list[list[str]]:
    """One row per agent x K x scorer, tiers and families pooled."""
    cfg, tab = rerank["config"], rerank["table"]
    rows = []
    for agent in cfg["agents"]:
        for k in cfg["k"]:
            for scorer in cfg["scorers"]:
                m = tab[cell_key(agent, k, scorer, "all", "all")]
                tiers = " / ".join(_f(tab[cell_key(agent, k, scorer, t, "all")]["success"]) for t in cfg["tiers"])
                w = rerank.get("prior_weights", {}).get(f"{agent}|k{k}") if scorer.startswith("agent+critic+prior") \
                    else None
                rows.append([agent, str(k), scorer, _f(w, "g"), str(m["episodes"]), _f(m["success"]),
                             f"[{m['ci95'][0]:.2f}, {m['ci95'][1]:.2f}]", tiers, _f(m["fallback_rate"]),
                             _f(m["asked_again_rate"]), _f(m["expert_proposed"]), _f(m["expert_picked"]),
                             _f(m["mean_proposals"], ".1f"), _f(m["loop_rate"])])
    return rows


def _md(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def markdown(rerank: dict) -> str:
    """The rerank section: overall table, successes per family (tiers pooled) with Wilson
    intervals, the prior-weight sweep, and what the critic took instead of a proposed expert action."""
    cfg, tab = rerank["config"], rerank["table"]
    fams = [*cfg["families"], "all"]
    out = [f"Rerank protocol (the agent proposes K, the scorer picks; {', '.join(cfg['tiers'])} tiers pooled, "
           f"{cfg['seeds_per_family']} seeds per family and tier):", "", *_md(OVERALL_HEADER, overall_rows(rerank)),
           "", "Rerank successes per family (k/n [95% CI], tiers pooled):", ""]
    rows = []
    for agent in cfg["agents"]:
        for k in cfg["k"]:
            for scorer in cfg["scorers"]:
                cells = [tab[cell_key(agent, k, scorer, "all", f)] for f in fams]
                rows.append([agent, str(k), scorer, *(f"{m['successes']}/{m['episodes']} "
                                                      f"[{m['ci95'][0]:.2f}, {m['ci95'][1]:.2f}]" for m in cells)])
    out += _md(["agent", "K", "scorer", *fams], rows)
    sweep = rerank.get("sweep") or {}
    if sweep:
        out += ["", "Prior-weight sweep of agent+critic+prior (train-fold seeds in no tier and no log; "
                "the weight with the most successes is used, ties: the smallest):", ""]
        out += _md(["agent", "K", "weight", "successes", "chosen"],
                   [[key.split("|")[0], key.split("|")[1].removeprefix("k"), w, f"{s}/{n}",
                     "yes" if float(w) == res["chosen"] else ""]
                    for key, res in sweep.items() for w, (s, n) in res["successes"].items()])
    instead = [[agent, str(k), scorer, f, "; ".join(f"{e} -> {t} ({n})" for e, t, n in m["instead"])]
               for agent in cfg["agents"] for k in cfg["k"] for scorer in cfg["scorers"] if uses_critic(scorer)
               for f in cfg["families"] if (m := tab[cell_key(agent, k, scorer, "all", f)])["instead"]]
    if instead:
        out += ["", f"What the critic took instead of the expert's proposed action (commonest {TOP_INSTEAD} per "
                "family, from the decision log):", "", *_md(["agent", "K", "scorer", "family", "expert -> taken (n)"],
                                                             instead)]
    return "\n".join(out)


# ---- diagnosis ---------------------------------------------------------------------------------
def figures(rerank: dict) -> dict[str, Any]:
    """Metrics per agent x K x scorer (tiers and families pooled), for the report and MLflow
    (whose metric names take no "+": agent+critic is logged as agent_critic)."""
    cfg, tab = rerank["config"], rerank["table"]
    out: dict[str, Any] = {}
    for agent in cfg["agents"]:
        for k in cfg["k"]:
            for scorer in cfg["scorers"]:
                m = tab[cell_key(agent, k, scorer, "all", "all")]
                fig = {"success": m["success"], "ci95_low": m["ci95"][0], "ci95_high": m["ci95"][1],
                       "episodes": m["episodes"], "loop_rate": m["loop_rate"]}
                fig.update({name: m[name] for name in ("fallback_rate", "asked_again_rate", "expert_proposed",
                                                       "expert_picked") if m[name] is not None})
                out[f"rerank/{agent}/k{k}/{scorer.replace('+', '_')}"] = fig
    return out


def findings(rerank: dict) -> list:
    """A critic scorer below the agent alone, or below the agent's own self-consistency pick, on
    the same seeds (harnessrl.diagnosis.closed_loop_gap: error when the intervals are apart)."""
    from harnessrl import diagnosis

    cfg, tab = rerank["config"], rerank["table"]
    out = []
    for agent in cfg["agents"]:
        for k in cfg["k"]:
            for scorer in [s for s in cfg["scorers"] if uses_critic(s)]:
                m = tab[cell_key(agent, k, scorer, "all", "all")]
                for base in ("agent", "agent+self"):
                    if base not in cfg["scorers"]:
                        continue
                    b = tab[cell_key(agent, k, base, "all", "all")]
                    f = diagnosis.closed_loop_gap(m["successes"], m["episodes"], b["successes"], b["episodes"],
                                                  f"{scorer} ({agent} agent, K={k})", base)
                    if f is not None:
                        out.append(dataclasses.replace(f, name=f"{f.name} [rerank {agent} k{k}: {scorer} vs {base}]",
                                                       what_to_try=RERANK_FIX))
    return out


RERANK_FIX = ("reranking loses to the agent's own choice: read the rerank table's `expert picked` (how often "
              "the critic takes the expert's action when it is proposed) and what it took instead; try "
              "agent+critic+prior (the agent's logprob in the ranking), and the critic fixes of closed_loop_gap "
              "(history features, render window, pinned observations, more logs).")
