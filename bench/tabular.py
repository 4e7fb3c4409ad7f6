"""Text-rendered tabular MDPs with exact Q* through the whole pipeline (issue 13's check).

For each task (harnessrl.examples.tabular: FrozenLake, CliffWalking, Taxi) and wording, logs of an
epsilon-greedy policy around Q* go through the pipeline with its default settings (only the data,
the head and the names change), and the trained critic is asked about every reachable state:

- with an empty history (`{task, history: [], observation}`: the state alone), and
- with the full history of a logged visit (a sample of the logs' steps, as an agent would send it).

Per task: the share of states where the critic's greedy choice is optimal under Q* (ties count),
and the Spearman correlation of its Q with Q* over every (state, action) pair; beside them, a
random scorer's expected share of optimal choices. Q* is in the units of the pipeline's reward
recipe and discount, so it is what the critic estimates.

    python bench/tabular.py                                   # 3 tasks x 2 wordings, the default head
    python bench/tabular.py --tasks frozenlake --wordings a,b --heads reader,frozen --json out.json --markdown out.md
    python bench/tabular.py --reduced                         # a smoke run: FrozenLake, 2 wordings, 600 steps
    python bench/tabular.py --tasks frozenlake --wordings b --ablation   # one row per changed ingredient
    # --episodes N (per task; default harnessrl.examples.tabular.DEFAULT_EPISODES), --set k=v (pipeline overrides)

The CI-sized check is tests/test_reader_head.py (FrozenLake, default steps, empty history >= 0.9).
Ray binds 127.0.0.1; MLflow is the default local store under $HARNESSRL_HOME.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REDUCED_SET = ["train.steps=600", "train.log_every=200", "train.checkpoint_every=600"]
# --ablation: one ingredient of the default critic changed per row (name -> what changes, overrides)
ABLATION: dict[str, tuple[str, list[str]]] = {
    "base": ("the defaults (reader head)", []),
    "frozen": ("frozen head (one pooled vector per rendered state)", ["train.head=frozen"]),
    "text": ("one text: the rendered state as the reader's one segment",
             ["render.segments=text", "train.reader.history_dropout=0"]),
    "tokens": ("token path on", ["train.reader.tokens=true"]),
    "details": ("the observation's lines and sentences as segments too (render.details 8)", ["render.details=8"]),
    "features": ("no history features", ["train.features=false"]),
    "penalty": ("candidate penalty on (alpha 0.3)", ["train.alpha=0.3"]),
    "penalty_here": ("candidate penalty (alpha 0.3) on actions never taken from the observation",
                     ["train.alpha=0.3", "train.reader.penalty_on=unseen_here"]),
    "dropout": ("no history dropout", ["train.reader.history_dropout=0"]),
    "dueling": ("no dueling split", ["train.reader.dueling=false"]),
    "value": ("V fit to the taken action (plain IQL) instead of the best candidate", ["train.reader.value_target=taken"]),
    "supported": ("V fit to the best candidate taken from the observation (value_target supported)",
                  ["train.reader.value_target=supported"]),
}
FULL_HISTORY_STATES = 400  # logged visits asked about with their history


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties get their average rank)."""
    def ranks(x):
        x = np.asarray(x, np.float64)
        order = x.argsort(kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
        return (np.bincount(inv, r) / counts)[inv]

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def score_states(critic, mdp, Q: np.ndarray, queries: list[tuple[int, dict]]) -> dict[str, float]:
    """Greedy optimality and Spearman with Q* over `queries` (underlying state, request state)."""
    index = {s: i for i, s in enumerate(mdp.states)}
    scores = critic.score_batch([(state, list(mdp.actions)) for _, state in queries])
    optimal, q_hat, q_star, random_share = [], [], [], []
    for (s, _), sc in zip(queries, scores):
        qs = Q[index[s]]
        best = qs >= qs.max() - 1e-6
        optimal.append(bool(best[int(np.argmax(sc))]))
        random_share.append(best.mean())
        q_hat += list(sc)
        q_star += list(qs)
    return {"states": len(queries), "optimal": float(np.mean(optimal)), "spearman": spearman(q_hat, q_star),
            "random_optimal": float(np.mean(random_share))}


def queries(mdp, episodes: list[dict], n_logged: int, seed: int) -> dict[str, list[tuple[int, dict]]]:
    empty = [(s, {"task": mdp.task_text, "history": [], "observation": mdp.observation(s)}) for s in mdp.reachable]
    visits = []
    for e in episodes:
        history = []
        for st in e["steps"]:
            visits.append((st["info"]["state"], {"task": mdp.task_text, "history": list(history),
                                                 "observation": st["observation"]}))
            history.append({"action": st["action"], "observation": st["result"]})
    rng = random.Random(seed)
    return {"empty": empty, "history": rng.sample(visits, min(n_logged, len(visits)))}


def run_one(task: str, wording: str, head: str | None, args, work: Path, variant: str | None = None) -> dict[str, Any]:
    from harnessrl.config import parse_pipeline, apply_overrides
    from harnessrl.critic import Critic
    from harnessrl.examples import tabular as T
    from harnessrl.jobs.pipeline import run_pipeline
    from harnessrl.rewards import load_recipe

    name = f"tabular-{task}-{wording}-{variant or head}"
    overrides = list(args.set or []) + (ABLATION[variant][1] if variant else [])
    raw = apply_overrides({"name": name, "output_dir": str(work / name), "data": {"train": []},
                           "train": {"head": head} if head else {}, "serve": {"enabled": False},
                           "registry": {"experiment": "tabular-bench", "model_name": name}}, overrides)
    cfg = parse_pipeline(raw, origin="bench/tabular.py")
    mdp = T.build(task, wording)
    weights = load_recipe(cfg.rewards).model_dump()
    n = args.episodes or T.DEFAULT_EPISODES[task]
    episodes = mdp.episodes(n, args.seed, args.epsilon, cfg.train.gamma, weights, T.MAX_STEPS[task])
    logs = work / f"{name}.jsonl"
    logs.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"train": [str(logs)]})})
    t0 = time.time()
    summary = run_pipeline(cfg, force=True)
    seconds = time.time() - t0
    critic = Critic.load(summary["model"]["uri"])
    Q = mdp.q_star(cfg.train.gamma, weights)
    qs = queries(mdp, episodes, FULL_HISTORY_STATES, args.seed)
    out = {"task": task, "wording": wording, "head": cfg.train.head, "variant": variant or "-", "episodes": n,
           "transitions": summary["transitions"]["transitions"], "coverage": T.coverage(mdp, episodes),
           "pipeline_seconds": round(seconds, 1), "train_seconds": round(summary["train"]["seconds"], 1),
           **{f"{k}_{m}": v for k, r in ((k, score_states(critic, mdp, Q, v)) for k, v in qs.items())
              for m, v in r.items()}}
    print(f"[tabular] {task}/{wording}/{variant or cfg.train.head}: optimal {out['empty_optimal']:.2f} (empty history) / "
          f"{out['history_optimal']:.2f} (full), Spearman {out['empty_spearman']:.2f} / {out['history_spearman']:.2f}, "
          f"random {out['empty_random_optimal']:.2f}; {seconds:.0f} s", flush=True)
    return out


HEADER = ["task", "wording", "head", "variant", "states", "optimal (empty history)", "optimal (full history)",
          "Spearman (empty)", "Spearman (full)", "random optimal", "coverage", "train s"]


def markdown(rows: list[dict]) -> str:
    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        out.append(f"| {r['task']} | {r['wording']} | {r['head']} | {ABLATION[r['variant']][0] if r.get('variant', '-') != '-' else '-'} | {r['empty_states']} | {r['empty_optimal']:.2f} | "
                   f"{r['history_optimal']:.2f} | {r['empty_spearman']:.2f} | {r['history_spearman']:.2f} | "
                   f"{r['empty_random_optimal']:.2f} | {r['coverage']:.2f} | {r['train_seconds']:.0f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from harnessrl.examples import tabular as T

    p = argparse.ArgumentParser(prog="bench/tabular.py", description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default=",".join(T.TASKS))
    p.add_argument("--wordings", default=",".join(T.WORDINGS))
    p.add_argument("--heads", default=None, help="comma-separated train.head values (default: the pipeline's default)")
    p.add_argument("--episodes", type=int, help="logged episodes per task (default: enough to cover it)")
    p.add_argument("--epsilon", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", help="pipeline override (repeatable)")
    p.add_argument("--reduced", action="store_true", help="a smoke run: FrozenLake, both wordings, 600 steps")
    p.add_argument("--ablation", nargs="?", const=",".join(ABLATION), default=None,
                   help=f"one row per changed ingredient of the defaults (comma-separated of {', '.join(ABLATION)}; "
                        "default all), for each task and wording; --heads is ignored")
    p.add_argument("--work-dir")
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args(argv)
    from harnessrl.config import TrainConfig
    from harnessrl.ray_runtime import init_ray

    if args.reduced:
        args.tasks, args.set = "frozenlake", REDUCED_SET + list(args.set or [])
    heads = args.heads.split(",") if args.heads else [TrainConfig().head]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="tabular-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    init_ray()
    cells = [(t, w) for t in args.tasks.split(",") for w in args.wordings.split(",")]
    if args.ablation:
        unknown = set(args.ablation.split(",")) - set(ABLATION)
        if unknown:
            p.error(f"unknown ablation variant(s) {sorted(unknown)}; known: {', '.join(ABLATION)}")
        rows = [run_one(t, w, None, args, work, v) for t, w in cells for v in args.ablation.split(",")]
    else:
        rows = [run_one(t, w, h, args, work) for t, w in cells for h in heads]
    table = markdown(rows)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
