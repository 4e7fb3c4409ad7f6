"""How much of a TextWorldExpress result is the critic's training seed, and does an ensemble help?

N critics that differ only in `train.seed` (the same logs, rendering and encoded data: trained one
after another in one pipeline folder, where the stage cache encodes once) play the all-actions protocol of
bench/twx.py on its seeds, each alone and as an ensemble that ranks by the members' mean score
(and mean minus their spread: a lower confidence bound), beside the behaviour mix. Offline, on the
held-out test logs' steps with an expert action: each member's and the ensemble's top-1, and how
often two members choose the same candidate. One command:

    python bench/twx_seeds.py --train-seeds 0,1,2 --json seeds.json      # ~8 min per critic, then ~10 min of play
    python bench/twx_seeds.py --reduced                                  # 2 tiny critics, 2 families, 1 seed (~3 min)

The critics are scored in this process through the service's own request model and decision
(`Critic.prepare`, `score_prepared`, `decide_scores`: what `/v1/score` runs), so the members and
their ensemble are played by one code path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import twx  # noqa: E402  (bench/ is no package)

FAMILIES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "peckingorder", "simonsays")
REDUCED_FAMILIES = ("coin", "simonsays")


class EnsembleScorer:
    """Scores a request with every member critic and ranks by their mean score ("mean") or by the
    mean minus the members' standard deviation ("lcb"); one member is the critic alone. Answers
    with the fields of a /v1/score response that bench/twx.py's `play` reads; the fallback
    threshold and OOD flag are the first member's, checked on the mean score."""

    def __init__(self, critics: Sequence, rank: str = "mean"):
        if rank not in ("mean", "lcb"):
            raise ValueError(f"rank {rank!r}: mean or lcb")
        self.critics, self.rank = list(critics), rank

    def member_scores(self, state: dict, candidates: list[str]) -> tuple[np.ndarray, bool | None, Any]:
        from harnessrl.serving.api import ScoreRequest

        request = ScoreRequest(agent_id="twx-seeds", state=state, candidates=candidates)
        batch = [(request.state_value(), request.candidate_texts())]
        preps = [critic.prepare(batch) for critic in self.critics]  # each member renders as it was trained
        scored = [critic.score_prepared(prep, ood=True) for critic, prep in zip(self.critics, preps)]
        scores = np.asarray([s for (s,), _ in scored], dtype=np.float64)
        return scores, scored[0][1][0], preps[0].parsed[0]  # the first member's OOD flag and parsed state

    def score(self, state: dict, candidates: list[str], avoid_repeats: bool = False) -> dict:
        from harnessrl.features import repeats_here

        scores, far, parsed = self.member_scores(state, candidates)
        mean = scores.mean(0)
        ranking = mean - scores.std(0) if self.rank == "lcb" else mean
        repeats = repeats_here(parsed.history, parsed.observation, candidates) if avoid_repeats else None
        d = self.critics[0].decide_scores(mean.tolist(), far, repeats, ranking.tolist())
        return {"best_index": d.best_index, "fallback": d.fallback, "scores": ranking.tolist(), "ood": d.ood}


def gold_rows(heldout_dir: Path, limit: int) -> list[dict]:
    import pyarrow.dataset as pads

    from harnessrl import evaluation

    steps = pads.dataset(str(heldout_dir), format="parquet").to_table().to_pylist()
    return evaluation.gold_rows(steps, limit)


def offline(critics: Sequence, rows: list[dict]) -> dict[str, Any]:
    """Expert top-1 per member and for the mean ensemble, and the members' pairwise agreement."""
    from harnessrl.evaluation import score_rows

    per = [score_rows(critic, rows) for critic in critics]
    choice = [[int(np.argmax(s)) for s in member] for member in per]
    mean_choice = [int(np.argmax(np.mean([np.asarray(m[i]) for m in per], 0))) for i in range(len(rows))]

    def top1(chosen: list[int]) -> float:
        return float(np.mean([r["candidates"][c] == r["expert"] for r, c in zip(rows, chosen)])) if rows else 0.0

    pairs = [(a, b) for a in range(len(per)) for b in range(a + 1, len(per))]
    return {"steps": len(rows), "member_top1": [top1(c) for c in choice], "mean_top1": top1(mean_choice),
            "agreement": {f"{a}-{b}": float(np.mean([x == y for x, y in zip(choice[a], choice[b])]))
                          for a, b in pairs}}


def table(episodes: list[dict], scorers: list[str], families: Sequence[str]) -> list[str]:
    lines = ["| scorer | id | ood | pooled | loop rate | per family (id + ood) |", "|---|---|---|---|---|---|"]
    for s in scorers:
        eps = [e for e in episodes if e["label"] == s]
        cells = []
        for tier in ("id", "ood"):
            m = twx.summarise([e for e in eps if e["tier"] == tier])
            cells.append(f"{m['successes']}/{m['episodes']} [{m['ci95'][0]:.2f}, {m['ci95'][1]:.2f}]")
        pooled = twx.summarise(eps)
        fam = ", ".join(str(sum(e["success"] for e in eps if e["family"] == f)) for f in families)
        lines.append(f"| {s} | {cells[0]} | {cells[1]} | {pooled['successes']}/{pooled['episodes']} | "
                     f"{pooled['loop_rate']:.2f} | {fam} |")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/twx_seeds.py", description=__doc__.split("\n")[0])
    p.add_argument("--train-seeds", help="train.seed of each critic (default 0,1,2; reduced 0,1)")
    p.add_argument("--families", help=f"comma-separated (default {','.join(FAMILIES)})")
    p.add_argument("--seeds-per-family", type=int, help="games per family and tier (default 5; reduced 1)")
    p.add_argument("--tiers", default="id,ood")
    p.add_argument("--logs", help="native JSONL(.gz) training logs (default: the bundled ones)")
    p.add_argument("--set", action="append", help="pipeline override for every critic (KEY=VALUE), repeatable")
    p.add_argument("--model-name", default="twx-seeds", help="critic k is registered as NAME-k")
    p.add_argument("--heldout-steps", type=int, default=800, help="test-log steps with an expert action, offline")
    p.add_argument("--skip-train", action="store_true", help="use the critics NAME-k@champion registered before")
    p.add_argument("--reduced", action="store_true", help="2 critics of 200 steps on 40 episodes, 2 families, 1 seed")
    p.add_argument("--reduced-episodes", type=int, default=40)
    p.add_argument("--work-dir", help="the pipeline folder's parent (default: a temp dir)")
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    import tempfile

    from harnessrl import registry
    from harnessrl.critic import Critic
    from harnessrl.examples.twx_expert import MAX_STEPS, _Engine
    from harnessrl.ray_runtime import init_ray, shutdown_ray

    train_seeds = [int(s) for s in twx._csv(args.train_seeds or ("0,1" if args.reduced else "0,1,2"))]
    if len(train_seeds) < 2:
        raise SystemExit("--train-seeds: at least two critics make an ensemble")
    families = twx._csv(args.families) if args.families else list(REDUCED_FAMILIES if args.reduced else FAMILIES)
    n_games = args.seeds_per_family or (1 if args.reduced else 5)
    tiers = twx._csv(args.tiers)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="twx-seeds-"))
    work.mkdir(parents=True, exist_ok=True)
    names = [f"{args.model_name}-{k}" for k in train_seeds]
    timings: dict[str, float] = {}

    init_ray()
    try:
        if not args.skip_train:
            for k, name in zip(train_seeds, names):
                t0 = time.time()
                member = argparse.Namespace(model_name=name, reduced=args.reduced, reduced_episodes=args.reduced_episodes,
                                            logs=args.logs, set=[*(args.set or []), f"train.seed={k}",
                                                                 "data.heldout=[builtin:twx-test]"])
                uri, _, summary = twx.train_critic(member, work)
                timings[f"train {name}"] = time.time() - t0
                print(f"[twx-seeds] {uri}: {summary['train'].get('steps')} steps in {timings[f'train {name}']:.0f} s",
                      flush=True)
    finally:
        shutdown_ray()
    critics = [Critic.load(registry.model_uri(f"{n}@champion", "--model-name")) for n in names]

    t0 = time.time()
    heldout = work / "pipeline" / "heldout" / "transitions"
    off = offline(critics, gold_rows(heldout, args.heldout_steps)) if heldout.exists() else None
    if off:
        timings["offline"] = time.time() - t0
        print(f"[twx-seeds] offline top-1 on {off['steps']} test-log steps: members "
              f"{', '.join(f'{x:.3f}' for x in off['member_top1'])}, mean ensemble {off['mean_top1']:.3f}; "
              f"agreement {off['agreement']}", flush=True)

    n = len(critics)
    players: list[tuple[str, str, Any]] = [(f"seed {k}", "critic", EnsembleScorer([c]))
                                           for k, c in zip(train_seeds, critics)]
    players += [(f"mean of {n}", "critic", EnsembleScorer(critics)),
                (f"mean of {n} +norepeat", "critic+norepeat", EnsembleScorer(critics)),
                (f"mean - std of {n}", "critic", EnsembleScorer(critics, "lcb")), ("mix", "mix", None)]
    engine = _Engine()
    episodes: list[dict] = []
    t0 = time.time()
    try:
        seeds = twx.pick_seeds(engine, families, tiers, n_games, twx.used_seeds(twx.known_records(args.logs)))
        for (tier, family), games in seeds.items():
            for game in games:
                for label, scorer, client in players:
                    ep = twx.play(engine, scorer, family, twx.TIERS[tier], game, MAX_STEPS,
                                  {"critic": client} if client else {})
                    episodes.append({**{k: v for k, v in ep.items() if k != "actions"}, "tier": tier, "label": label})
            done = [e for e in episodes if e["tier"] == tier and e["family"] == family]
            print(f"[twx-seeds] {tier}/{family}: " + ", ".join(
                f"{label}={sum(e['success'] for e in done if e['label'] == label)}/{len(games)}"
                for label, *_ in players), flush=True)
    finally:
        engine.close()
    timings["play"] = time.time() - t0
    lines = table(episodes, [label for label, *_ in players], families)
    print("\n".join(lines))
    print(f"[twx-seeds] per family: {', '.join(families)}; timings (s): "
          + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
    return {"config": {"train_seeds": train_seeds, "families": families, "seeds_per_family": n_games, "tiers": tiers,
                       "models": names, "set": args.set or [], "work_dir": str(work)},
            "offline": off, "table": lines, "timings": timings, "episodes": episodes}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
