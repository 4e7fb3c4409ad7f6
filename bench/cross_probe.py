"""Issue 5 probe: does a cross-encoder, fine-tuned on (state, action) pairs, pick the expert's
action better than an MLP on frozen MiniLM embeddings? Supervised and offline: a quick read on
what the cross-encoder critic head (train.head: cross) can see, without RL or a closed loop.

Offline and supervised: every logged step of a TextWorldExpress corpus carries the expert's
action (`info.expert_action`) among its candidates. Both scorers learn to rank it first among
the step's candidates (softmax cross-entropy over the candidates). Accuracy is top-1 on task
groups held out from training, per family, beside random choice.

  frozen+mlp  the frozen MiniLM (128 tokens) + an MLP on [s, a, s*a, |s-a|]: what the IQL
              critic's scoring head sees
  cross       MiniLM's first --layers layers on "state [SEP] action" (--max-len tokens, the
              state truncated first), mean-pooled, a linear score; every weight trained

    python bench/cross_probe.py --transitions /tmp/twx5/work/pipeline/transitions      # ~25 min on 2 cores
    python bench/cross_probe.py --transitions DIR --layers 3 --max-len 128 --cross-steps 1000 --json out.json

Any pipeline's transitions of `builtin:twx-train` will do (`harnessrl run`, then
OUTPUT_DIR/transitions).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import time
from pathlib import Path

import numpy as np
from twx_bc import bc_net  # bench/ is on the path: this script's own folder


def load_steps(transitions: str) -> list[dict]:
    """Steps whose candidates include the expert's action (and at least one other)."""
    import pyarrow.dataset as pads

    table = pads.dataset(transitions, format="parquet").to_table(columns=["task_id", "info", "candidates", "state_text"])
    steps = []
    for r in table.to_pylist():
        gold = json.loads(r["info"] or "{}").get("expert_action")
        cands = r["candidates"] or []
        if gold in cands and len(cands) > 1:
            steps.append({"family": r["task_id"].split("/")[0], "group": r["task_id"], "state": r["state_text"],
                          "candidates": cands, "gold": cands.index(gold)})
    return steps


def split(steps: list[dict], holdout: float, test_steps: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Whole task groups held out; at most `test_steps` of their steps scored."""
    rng = random.Random(seed)
    groups = sorted({s["group"] for s in steps})
    rng.shuffle(groups)
    held = set(groups[: max(1, int(len(groups) * holdout))])
    train = [s for s in steps if s["group"] not in held]
    test = [s for s in steps if s["group"] in held]
    return train, rng.sample(test, min(test_steps, len(test)))


def accuracy(test: list[dict], correct: list[float]) -> dict:
    by: dict[str, list[float]] = collections.defaultdict(list)
    for step, ok in zip(test, correct):
        by[step["family"]].append(ok)
    return {"all": round(float(np.mean(correct)), 3),
            "families": {f: {"accuracy": round(float(np.mean(v)), 3), "steps": len(v)} for f, v in sorted(by.items())}}


def _listwise_loss(scores, gold: int):
    import torch

    return torch.nn.functional.cross_entropy(scores[None], torch.tensor([gold]))


def frozen_mlp(train: list[dict], test: list[dict], steps: int, batch: int, seed: int) -> list[float]:
    import torch

    from harnessrl.algorithms.iql import pair_features
    from harnessrl.encoders import load_encoder

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model, identity = load_encoder(max_seq_length=128)
    texts = list(dict.fromkeys([s["state"] for s in train + test] + [c for s in train + test for c in s["candidates"]]))
    emb = dict(zip(texts, model.encode(texts, batch_size=64, convert_to_numpy=True)))
    net = bc_net(identity.dim, 256)
    opt = torch.optim.Adam(net.parameters(), 1e-3)

    def scores(step):
        a = torch.tensor(np.stack([emb[c] for c in step["candidates"]]))
        s = torch.tensor(emb[step["state"]])[None].expand(len(a), -1)
        return net(pair_features(s, a)).squeeze(-1)

    for _ in range(steps):
        chosen = rng.sample(train, min(batch, len(train)))
        loss = sum(_listwise_loss(scores(s), s["gold"]) for s in chosen) / len(chosen)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return [float(scores(s).argmax().item() == s["gold"]) for s in test]


def cross_encoder(train: list[dict], test: list[dict], steps: int, batch: int, candidates: int, layers: int,
                  max_len: int, seed: int) -> list[float]:
    import torch
    import torch.nn as nn

    from harnessrl.algorithms.cross import mean_pool, trunk_from_encoder
    from harnessrl.encoders import BUILTIN_MINILM

    torch.manual_seed(seed)
    rng = random.Random(seed)
    trunk, tok = trunk_from_encoder(BUILTIN_MINILM, layers, max_len)  # the cross critic head's trunk
    head = nn.Linear(trunk.config.hidden_size, 1)
    opt = torch.optim.AdamW([{"params": trunk.parameters(), "lr": 3e-5}, {"params": head.parameters(), "lr": 1e-3}])

    def scores(states, actions):
        x = tok(states, actions, truncation="only_first", max_length=max_len, padding=True, return_tensors="pt")
        return head(mean_pool(trunk(**x).last_hidden_state, x["attention_mask"])).squeeze(-1)

    trunk.train()
    for _ in range(steps):
        states, actions, golds = [], [], []
        for s in rng.sample(train, min(batch, len(train))):
            gold = s["candidates"][s["gold"]]
            others = [c for c in s["candidates"] if c != gold]
            pick = [gold] + rng.sample(others, min(candidates - 1, len(others)))
            rng.shuffle(pick)
            golds.append((pick.index(gold), len(pick)))
            states += [s["state"]] * len(pick)
            actions += pick
        out, loss, at = scores(states, actions), 0, 0
        for gold, n in golds:
            loss = loss + _listwise_loss(out[at:at + n], gold)
            at += n
        opt.zero_grad()
        (loss / len(golds)).backward()
        opt.step()
    trunk.eval()
    with torch.no_grad():
        return [float(scores([s["state"]] * len(s["candidates"]), s["candidates"]).argmax().item() == s["gold"])
                for s in test]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", required=True, help="a pipeline's transitions folder (TextWorldExpress logs)")
    ap.add_argument("--holdout", type=float, default=0.25, help="share of task groups held out")
    ap.add_argument("--test-steps", type=int, default=300)
    ap.add_argument("--mlp-steps", type=int, default=1500)
    ap.add_argument("--mlp-batch", type=int, default=32)
    ap.add_argument("--cross-steps", type=int, default=400)
    ap.add_argument("--cross-batch", type=int, default=4, help="states per step")
    ap.add_argument("--candidates", type=int, default=6, help="candidates per state in a training step")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--max-len", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    train, test = split(load_steps(args.transitions), args.holdout, args.test_steps, args.seed)
    print(f"{len(train)} training steps, {len(test)} held-out steps scored", flush=True)
    out = {"config": vars(args), "train_steps": len(train), "test_steps": len(test),
           "random": accuracy(test, [1.0 / len(s["candidates"]) for s in test])}
    for name, run in (("frozen+mlp", lambda: frozen_mlp(train, test, args.mlp_steps, args.mlp_batch, args.seed)),
                      ("cross", lambda: cross_encoder(train, test, args.cross_steps, args.cross_batch, args.candidates,
                                                      args.layers, args.max_len, args.seed))):
        start = time.time()
        out[name] = {**accuracy(test, run()), "seconds": round(time.time() - start, 1)}
        print(f"{name}: {json.dumps(out[name])}", flush=True)
    print()
    families = sorted(out["random"]["families"])
    print(f"{'scorer':12s} {'all':>6s} " + " ".join(f"{f[:12]:>12s}" for f in families))
    for name in ("random", "frozen+mlp", "cross"):
        fam = out[name]["families"]
        print(f"{name:12s} {out[name]['all']:6.3f} " + " ".join(f"{fam[f]['accuracy']:12.2f}" for f in families))
    print(f"{'(steps)':12s} {len(test):6d} " + " ".join(f"{out['random']['families'][f]['steps']:12d}" for f in families))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
