"""Issue 5 probe: does a cross-encoder, fine-tuned on (state, action) pairs, pick the expert's
action better than an MLP on frozen MiniLM embeddings? Supervised and offline: a quick read on
what the cross-encoder critic head (train.head: cross) can see, without RL or a closed loop.

Offline and supervised: every logged step of a TextWorldExpress corpus carries the expert's
action (`info.expert_action`) among its candidates. Both scorers learn to rank it first among
the step's candidates (softmax cross-entropy over the candidates). Accuracy is top-1 on task
groups held out from training, per family, beside random choice; and on the close calls alone,
the steps where another candidate starts with the expert's verb (which quantity to take, which
container to put it in), where reading the state matters most.

  frozen+mlp  the frozen MiniLM (128 tokens) + an MLP on [s, a, s*a, |s-a|]: what the IQL
              critic's scoring head sees
  cross       MiniLM's first --layers layers on "state [SEP] action" (--max-len tokens, the
              state truncated first), mean-pooled, a linear score; every weight trained

    python bench/cross_probe.py --transitions /tmp/twx5/work/pipeline/transitions      # ~25 min on 2 cores
    python bench/cross_probe.py --transitions DIR --layers 3 --max-len 128 --cross-steps 1000 --json out.json
    python bench/cross_probe.py --transitions DIR --families sorting --precision bfloat16 --max-len 256 \
        --passes 5 --max-seconds 1950 --test-steps 400                 # one family, bounded, on 2 cores
    python bench/cross_probe.py --logs LOGS.jsonl.gz --pack .dev/probe   # steps + a float16 encoder, to carry
    python bench/cross_probe.py --transitions .dev/probe/steps.parquet --encoder .dev/probe/encoder \
        --device cuda --precision bfloat16 --max-len 384 --cross-batch 32 --passes 3 --max-seconds 300 ...

Any pipeline's transitions of TextWorldExpress logs will do (`harnessrl run`, then
OUTPUT_DIR/transitions), or a file written by `--pack`: the probe's four columns and the encoder's
weights in float16 (46 MiB with the 1,500-episode corpus), small enough to carry to a GPU machine
that has torch and sentence-transformers but not this package's other dependencies. `--pack`
takes a transitions folder, or `--logs`: a native log file it ingests and renders here as the
issue-5 benchmark does, without encoding it. Cross-encoder training stops at
`--cross-steps` (or `--passes`) or `--max-seconds`, whichever comes first; the output says how many
passes it made.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package: its scripts import each other

from twx_bc import bc_net  # noqa: E402


STEP_COLUMNS = ["task_id", "info", "candidates", "state_text"]
SEGMENTS = "state_segments"  # read when the transitions have it (the reader scorers need it)


def load_steps(transitions: str, families: set[str] | None = None) -> list[dict]:
    """Steps whose candidates include the expert's action (and at least one other), of `families`
    (all when None), from a transitions folder or a packed file."""
    import pyarrow.dataset as pads

    dataset = pads.dataset(transitions, format="parquet")
    table = dataset.to_table(columns=STEP_COLUMNS + ([SEGMENTS] if SEGMENTS in dataset.schema.names else []))
    steps = []
    for r in table.to_pylist():
        gold = json.loads(r["info"] or "{}").get("expert_action")
        cands = r["candidates"] or []
        family = r["task_id"].split("/")[0]
        if gold in cands and len(cands) > 1 and (families is None or family in families):
            steps.append({"family": family, "group": r["task_id"], "state": r["state_text"],
                          "segments": [(g["role"], g["age"], g["text"]) for g in r.get(SEGMENTS) or ()],
                          "candidates": cands, "gold": cands.index(gold)})
    return steps


def transitions_from_logs(logs: str, out: Path, overrides: list[str]) -> str:
    """Ingest and transitions (no encode) of a native log file, rendered as the issue-5 benchmark
    renders (bench/twx_ablation.py's BASE over the quickstart pipeline, then `overrides`)."""
    from twx_ablation import BASE

    from harnessrl.config import load_pipeline
    from harnessrl.pipelines.ingest import ingest
    from harnessrl.pipelines.transitions import build_transitions
    from harnessrl.ray_runtime import init_ray
    from harnessrl.rewards import load_recipe

    cfg = load_pipeline(Path(__file__).resolve().parents[1] / "pipelines" / "quickstart.yaml", [*BASE, *overrides])
    init_ray()
    ingest([logs], str(out / "ingest"), cfg.data.format)
    build_transitions(str(out / "ingest"), str(out / "transitions"), load_recipe(cfg.rewards), cfg.render)
    return str(out / "transitions")


def pack(transitions: str, out: Path, encoder: str) -> dict:
    """What a GPU machine needs for the probe, small enough to carry: `steps.parquet` (the probe's
    columns, zstd) and `encoder/` (the sentence-transformers model with float16 weights; the probe
    computes in float32 or bfloat16 whatever the file holds)."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    from harnessrl.encoders import load_encoder

    out.mkdir(parents=True, exist_ok=True)
    dataset = pads.dataset(transitions, format="parquet")
    columns = STEP_COLUMNS + ([SEGMENTS] if SEGMENTS in dataset.schema.names else [])
    pq.write_table(dataset.to_table(columns=columns), out / "steps.parquet", compression="zstd")
    model, _ = load_encoder(encoder)
    model.half().save(str(out / "encoder"))
    files = [p for p in out.rglob("*") if p.is_file()]
    return {"files": len(files), "mib": round(sum(p.stat().st_size for p in files) / 2**20, 1)}


def split(steps: list[dict], holdout: float, test_steps: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Whole task groups held out; at most `test_steps` of their steps scored."""
    rng = random.Random(seed)
    groups = sorted({s["group"] for s in steps})
    rng.shuffle(groups)
    held = set(groups[: max(1, int(len(groups) * holdout))])
    train = [s for s in steps if s["group"] not in held]
    test = [s for s in steps if s["group"] in held]
    return train, rng.sample(test, min(test_steps, len(test)))


def close_call(step: dict) -> bool:
    """Another candidate starts with the expert's verb (its tool, as `render.tool_from:
    first_word` names it): the choice is which object or place (which quantity, which
    container), not what to do: where reading the state matters most."""
    from harnessrl.tool_naming import tool_name

    gold = tool_name(step["candidates"][step["gold"]], "first_word")
    return sum(tool_name(c, "first_word") == gold for c in step["candidates"]) > 1


def accuracy(test: list[dict], correct: list[float]) -> dict:
    """Top-1 overall and per family, and on the close calls alone (`close`)."""
    rows = [(step["family"], ok, close_call(step)) for step, ok in zip(test, correct)]

    def summary(family: str | None) -> dict:
        oks = [(ok, close) for f, ok, close in rows if family is None or f == family]
        on_close = [ok for ok, close in oks if close]
        return {"accuracy": round(float(np.mean([ok for ok, _ in oks])), 3), "steps": len(oks),
                "close": round(float(np.mean(on_close)), 3) if on_close else None, "close_steps": len(on_close)}

    overall = summary(None)
    return {"all": overall["accuracy"], "close": overall["close"],
            "families": {f: summary(f) for f in sorted({f for f, _, _ in rows})}}


def _listwise_loss(scores, gold: int):
    import torch

    return torch.nn.functional.cross_entropy(scores[None], torch.tensor([gold], device=scores.device))


def frozen_mlp(train: list[dict], test: list[dict], steps: int, batch: int, seed: int, encoder: str,
               device: str = "cpu", precision: str = "float32") -> list[float]:
    import torch

    from harnessrl.algorithms.iql import pair_features
    from harnessrl.encoders import load_encoder

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model, identity = load_encoder(encoder, device, 128, precision)
    model.float()  # a packed encoder holds float16 weights
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
                  max_len: int, seed: int, encoder: str, device: str = "cpu", precision: str = "float32",
                  max_seconds: float | None = None, log_every: int = 50) -> tuple[list[float], dict]:
    """Top-1 per test step, and how far training got (steps, passes over the training states, seconds,
    the last logged loss)."""
    import torch
    import torch.nn as nn

    from harnessrl.algorithms.cross import mean_pool, trunk_from_encoder
    from harnessrl.algorithms.iql import autocast

    torch.manual_seed(seed)
    rng = random.Random(seed)
    trunk, tok = trunk_from_encoder(encoder, layers, max_len)  # the cross critic head's trunk
    trunk = trunk.float().to(device)
    head = nn.Linear(trunk.config.hidden_size, 1).to(device)
    opt = torch.optim.AdamW([{"params": trunk.parameters(), "lr": 3e-5}, {"params": head.parameters(), "lr": 1e-3}])

    def scores(states, actions):
        x = tok(states, actions, truncation="only_first", max_length=max_len, padding=True, return_tensors="pt").to(device)
        with autocast(precision == "bfloat16", x["input_ids"].device):
            hidden = trunk(**x).last_hidden_state
        return head(mean_pool(hidden.float(), x["attention_mask"])).squeeze(-1)

    trunk.train()
    start, done, window = time.time(), 0, collections.deque(maxlen=log_every)
    for done in range(1, steps + 1):
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
        window.append(float(loss.detach()) / len(golds))
        elapsed = time.time() - start
        if done % log_every == 0:
            print(f"  cross step {done}/{steps}: loss {np.mean(window):.3f}, {done * batch / len(train):.2f} passes, "
                  f"{elapsed:.0f} s", flush=True)
        if max_seconds is not None and elapsed > max_seconds:
            print(f"  cross: stopped at step {done} by --max-seconds {max_seconds:g}", flush=True)
            break
    progress = {"steps": done, "passes": round(done * batch / max(len(train), 1), 2),
                "train_seconds": round(time.time() - start, 1), "last_loss": round(float(np.mean(window)), 4)}
    trunk.eval()
    with torch.no_grad():
        return [float(scores([s["state"]] * len(s["candidates"]), s["candidates"]).argmax().item() == s["gold"])
                for s in test], progress


READER_PATHS = ("semantic", "tokens", "match")


def reader_paths(name: str) -> dict[str, bool]:
    """`reader` (every path) or `reader:semantic+match` (those paths only) -> ReaderConfig switches."""
    wanted = name.split(":", 1)[1].split("+") if ":" in name else list(READER_PATHS)
    unknown = set(wanted) - set(READER_PATHS)
    if unknown:
        raise SystemExit(f"unknown reader path(s) {sorted(unknown)}; known: {', '.join(READER_PATHS)}")
    return {p: p in wanted for p in READER_PATHS}


def reader(train: list[dict], test: list[dict], steps: int, batch: int, seed: int, encoder: str, paths: dict,
           device: str = "cpu", precision: str = "float32", log_every: int = 50) -> tuple[list[float], dict]:
    """The reader head's network (the paths in `paths`) over the steps' segments, trained listwise on
    the expert's action like the other scorers (no history features; harnessrl.behaviour_prior.train_listwise)."""
    import torch

    from harnessrl.behaviour_prior import candidate_logits, train_listwise
    from harnessrl.encoders import load_encoder
    from harnessrl.render import EMBEDDED_ROLES

    if not all(s["segments"] for s in train + test):
        raise SystemExit("the reader scorers need transitions with state_segments (made by this version's pipeline)")
    model, _ = load_encoder(encoder, device, 128, precision)
    model.float()
    texts = list(dict.fromkeys([t for s in train + test for r, _, t in s["segments"] if r in EMBEDDED_ROLES]
                               + [c for s in train + test for c in s["candidates"]]))
    table = dict(zip(texts, model.encode(texts, batch_size=64, convert_to_numpy=True)))

    def embed(batch_texts):
        return np.stack([table[t] for t in batch_texts])

    net, inputs, progress = train_listwise(train, embed, encoder, paths, steps, batch, seed, device=device,
                                           log_every=log_every, max_seconds=float("inf"))
    with torch.no_grad():
        out = []
        for i in range(0, len(test), 32):
            part = test[i:i + 32]
            rows = candidate_logits(net, inputs, [s["segments"] for s in part], [s["candidates"] for s in part], device)
            out += [float(row.argmax().item() == s["gold"]) for row, s in zip(rows, part)]
    return out, progress


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> dict:
    from harnessrl.encoders import BUILTIN_MINILM
    from harnessrl.precision import COMPUTE, normalise

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--transitions", help="a pipeline's transitions folder (TextWorldExpress logs), or a --pack steps.parquet")
    src.add_argument("--logs", help="with --pack: a native log file, rendered here as the issue-5 benchmark renders")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="with --logs: a pipeline override after the issue-5 rendering")
    ap.add_argument("--pack", metavar="DIR", help="write DIR/steps.parquet and DIR/encoder (float16) and stop")
    ap.add_argument("--encoder", default=BUILTIN_MINILM, help="the sentence-transformers model: builtin or a folder")
    ap.add_argument("--families", help="comma-separated families to keep (default: all)")
    ap.add_argument("--holdout", type=float, default=0.25, help="share of task groups held out")
    ap.add_argument("--test-steps", type=int, default=300)
    ap.add_argument("--mlp-steps", type=int, default=1500)
    ap.add_argument("--mlp-batch", type=int, default=32)
    ap.add_argument("--cross-steps", type=int, default=400)
    ap.add_argument("--passes", type=float, help="cross training length in passes over the training states "
                                                 "(replaces --cross-steps)")
    ap.add_argument("--max-seconds", type=float, help="stop cross training after this long (default: no limit)")
    ap.add_argument("--cross-batch", type=int, default=4, help="states per step")
    ap.add_argument("--candidates", type=int, default=6, help="candidates per state in a training step")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--max-len", type=int, default=192)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both scorers)")
    ap.add_argument("--precision", type=normalise, choices=COMPUTE, default="float32",
                    help="compute precision of the transformer (autocast) in both scorers")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scorers", default="frozen+mlp,cross",
                    help="comma-separated: frozen+mlp, cross, reader (every path) or reader:PATH+PATH (of semantic, "
                         "tokens, match)")
    ap.add_argument("--reader-steps", type=int, default=1500)
    ap.add_argument("--reader-batch", type=int, default=32)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    if args.logs and not args.pack:
        ap.error("--logs is for --pack (the probe itself reads a transitions folder or a packed file)")
    if args.pack:
        with tempfile.TemporaryDirectory() as tmp:
            transitions = transitions_from_logs(args.logs, Path(tmp), args.set) if args.logs else args.transitions
            packed = pack(transitions, Path(args.pack), args.encoder)
        print(f"packed {args.pack}: {packed['files']} files, {packed['mib']} MiB", flush=True)
        return packed
    families = set(args.families.split(",")) if args.families else None
    train, test = split(load_steps(args.transitions, families), args.holdout, args.test_steps, args.seed)
    steps = max(1, round(args.passes * len(train) / args.cross_batch)) if args.passes else args.cross_steps
    print(f"{len(train)} training steps, {len(test)} held-out steps scored; cross: {steps} steps of "
          f"{args.cross_batch} states on {args.device} at {args.precision}", flush=True)
    out = {"config": vars(args), "train_steps": len(train), "test_steps": len(test),
           "random": accuracy(test, [1.0 / len(s["candidates"]) for s in test])}
    common = {"encoder": args.encoder, "device": args.device, "precision": args.precision}

    scorers = args.scorers.split(",")
    for name in scorers:
        start = time.time()
        if name == "frozen+mlp":
            correct, progress = frozen_mlp(train, test, args.mlp_steps, args.mlp_batch, args.seed, **common), {}
        elif name == "cross":
            correct, progress = cross_encoder(train, test, steps, args.cross_batch, args.candidates, args.layers,
                                              args.max_len, args.seed, max_seconds=args.max_seconds,
                                              log_every=args.log_every, **common)
        elif name.startswith("reader"):
            correct, progress = reader(train, test, args.reader_steps, args.reader_batch, args.seed,
                                       paths=reader_paths(name), log_every=args.log_every, **common)
        else:
            raise SystemExit(f"unknown scorer {name!r}")
        out[name] = {**accuracy(test, correct), **progress, "seconds": round(time.time() - start, 1)}
        print(f"{name}: {json.dumps(out[name])}", flush=True)
    print()
    families_seen = sorted(out["random"]["families"])
    for title, key, count, total in (("top-1, all held-out steps", "accuracy", "steps", "all"),
                                     ("top-1, close calls", "close", "close_steps", "close")):
        print(f"{title:28s} {'all':>6s} " + " ".join(f"{f[:12]:>12s}" for f in families_seen))
        for name in ("random", *scorers):
            fam = out[name]["families"]
            print(f"{name:28s} {_fmt(out[name][total]):>6s} " + " ".join(f"{_fmt(fam[f][key]):>12s}" for f in families_seen))
        n = [out["random"]["families"][f][count] for f in families_seen]
        print(f"{'(steps)':28s} {sum(n):6d} " + " ".join(f"{k:12d}" for k in n))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
