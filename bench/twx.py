"""Closed-loop benchmark on TextWorldExpress (issue 4, DESIGN §11).

Every scorer plays the same held-out seeds; at each step it gets the task, the history of
(action, observation) and the valid actions, and the valid action it scores highest is taken.

  critic       the served critic: POST /v1/score on a running Ray Serve app with the structured
               state {task, history, observation} and prior_weight 0 (its scores alone, whatever the
               service's default); takes best_index (fallbacks are counted, not acted on)
  mix          the behaviour mix of the logs (careful/mistaken/flailing ~25/50/25, one agent drawn
               per episode), the generator's own agents (harnessrl.examples.twx)
  careful, mistaken, flailing   each behaviour agent alone
  random       a uniformly random valid action
  bc           behaviour cloning on all logs (in process, see bench/twx_bc.py)
  critic+bc    the critic ranking by score + w * log pi_bc(a | s), bc's policy over the candidates as
               the behaviour prior (IQL's own extracted policy is pi_beta * exp(beta * A)): the
               service's prior blend with bc's log-probabilities as the candidates' logprobs,
               w = --bc-prior-weight
  critic+bc-success, critic+bc-careful   the same with bc-success's or bc-careful's policy as the prior
  critic+prior the critic ranking by score + w * log pi_beta of its own behaviour prior (what the
               service answers by default: a reader critic trains one unless
               train.reader.prior_steps is 0, and the service blends it when a request's candidates
               carry no logprob), w = --bc-prior-weight; without a prior, the critic
  bc-success   BC on successful episodes only
  bc-careful   BC on careful-agent episodes only (ceiling check: cloning the best behaviour)
  bc-expert    BC on the expert's action at every logged state that records one (`info.expert_action`,
               as the benchmark logs do): what the same inputs allow when the labels also cover the
               states the other agents reached (reader head only)
  expert       the generator's re-planning expert (gold agent)
  NAME+norepeat   a learned scorer (critic, bc*) under the `avoid_repeats` rule: it never takes an
               action again from the same observation while another is left (the critic through
               the service's request field, BC with the same function, harnessrl.features.repeats_here)

Protocols (`--protocol`, default both): `all-actions` (the scorers above choose among every valid
action, tiers `id` and `ood`) and `rerank` (bench/twx_rerank.py, issue 22: a behaviour agent
proposes K actions from its own distribution, with their log-probabilities, and agent /
agent+self / agent+critic / agent+critic+again / agent+critic+prior / agent+bc / agent+oracle
pick one; both tiers' seeds, all 8 families by default).

Tiers: `id` = train-fold seeds never used in the logs (the bundled train and test files, and
`--logs`), `ood` = test-fold seeds (not in the test logs either). Seeds are drawn deterministically per (tier, family)
among those the expert solves from the start.

    python bench/twx.py --reduced                                   # CI configuration, < 5 min
    python bench/twx.py --families coin,sorting,arithmetic,mapreader,twc,peckingorder \
        --seeds-per-family 5 --json out.json --markdown out.md     # trains the quickstart critic first
    python bench/twx.py --model twx-critic@champion --encoded $HARNESSRL_HOME/runs/quickstart/encoded ...
    python -m harnessrl.examples.twx --out /tmp/logs --train-episodes 1500 --test-episodes 0
    python bench/twx.py --logs /tmp/logs/twx_train.jsonl.gz ...     # the critic and BC learn from more logs
    python bench/twx.py --protocol rerank --agents careful,mistaken,flailing --k 2,4,8 --seeds-per-family 8 ...

Ray binds 127.0.0.1; the service binds 127.0.0.1 on a free port; every loop is bounded.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import math
import random
import socket
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

from harnessrl import registry
from harnessrl.errors import HarnessError
from harnessrl.metrics import wilson_interval

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import twx_rerank as rerank  # noqa: E402  (bench/ is no package)

ALL_SCORERS = ("critic", "critic+bc", "critic+bc-success", "critic+bc-careful", "critic+prior", "mix", "careful",
               "mistaken", "flailing", "random", "bc", "bc-success", "bc-careful", "bc-expert", "expert")
# asked by name: bc-expert needs labelled logs; the critic with other BC priors is an experiment's
DEFAULT_SCORERS = tuple(s for s in ALL_SCORERS if s not in ("bc-expert", "critic+bc-success", "critic+bc-careful"))
REDUCED_SCORERS = ("critic", "mix", "random", "bc", "expert")
NO_REPEAT = "+norepeat"  # suffix of a learned scorer played under the avoid_repeats rule
DEFAULT_FAMILIES = ("coin", "sorting", "arithmetic", "mapreader", "twc", "peckingorder")
REDUCED_FAMILIES = ("arithmetic", "sorting")
TIERS = {"id": "train", "ood": "test"}
PROTOCOLS = ("all-actions", "rerank")


def base_scorer(name: str) -> str:
    """`critic+norepeat` -> `critic`: the scorer a variant plays with."""
    return name[: -len(NO_REPEAT)] if name.endswith(NO_REPEAT) else name


def prior_bc(name: str) -> str | None:
    """`critic+bc-success` -> `bc-success`: the BC scorer whose policy a critic scorer takes as its prior."""
    base = base_scorer(name)
    return base.removeprefix("critic+") if base.startswith("critic+bc") else None


def is_learned(name: str) -> bool:
    return name.startswith(("critic", "bc"))


# ---- statistics --------------------------------------------------------------------------------
def summarise(episodes: list[dict]) -> dict[str, Any]:
    n = len(episodes)
    k = sum(e["success"] for e in episodes)
    lo, hi = wilson_interval(k, n)
    won = [e["steps"] for e in episodes if e["success"]]
    scored = sum(e["decisions"] for e in episodes)
    return {
        "episodes": n, "successes": k, "success": k / n if n else 0.0, "ci95": [lo, hi],
        "mean_steps_to_success": sum(won) / len(won) if won else None,
        "loop_rate": sum(e["loop"] for e in episodes) / n if n else 0.0,
        "fallback_rate": sum(e["fallbacks"] for e in episodes) / scored if scored else None,
        "ood_rate": sum(flags) / len(flags) if (flags := [f for e in episodes for f in e.get("ood") or ()
                                                           if f is not None]) else None,
    }


# ---- logs and seeds ----------------------------------------------------------------------------
def _bundled(name: str) -> bytes:
    return resources.files("harnessrl.examples").joinpath(f"data/{name}.jsonl.gz").read_bytes()


def _lines(raw: bytes) -> list[bytes]:
    """The non-blank lines of JSONL bytes, gzip or not."""
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return [line for line in raw.splitlines(True) if line.strip()]


def log_lines(path: str | None) -> list[bytes]:
    """The lines of a native JSONL(.gz) log file; None: the bundled training logs."""
    return _lines(Path(path).read_bytes() if path else _bundled("twx_train"))


def read_records(name: str) -> list[dict]:
    return [json.loads(line) for line in _lines(_bundled(name))]


def known_records(logs: str | None) -> list[dict]:
    """The records BC looks episodes up in and whose seeds stay out of the tiers: the training logs
    (`--logs`), the bundled training logs and the bundled test logs."""
    extra = [json.loads(line) for line in log_lines(logs)] if logs else []
    return extra + read_records("twx_train") + read_records("twx_test")


def used_seeds(records: list[dict]) -> set[tuple[str, str, int]]:
    return {(r["metadata"]["family"], r["metadata"]["fold"], int(r["metadata"]["seed"])) for r in records}


def solvable_seeds(engine, family: str, fold: str, n: int, used: set, key: str, max_tries: int = 200) -> list[int]:
    """n seeds of `fold` not in `used` that the expert solves from the start, in the order of a
    shuffle seeded by `key` (so a smaller n gives a prefix of a larger one)."""
    from harnessrl.examples.twx_expert import _gold_key

    pool = [s for s in engine.seeds[fold] if (family, fold, s) not in used]
    random.Random(key).shuffle(pool)
    chosen: list[int] = []
    for seed in pool[:max_tries]:
        if len(chosen) >= n:
            break
        if engine.plan(family, fold, seed, [], _gold_key(seed, 0)):
            chosen.append(seed)
    return chosen


def pick_seeds(engine, families: list[str], tiers: list[str], n: int, used: set, max_tries: int = 200) -> dict:
    """(tier, family) -> n seeds of the tier's fold not in `used`, that the expert solves from the start."""
    return {(tier, family): solvable_seeds(engine, family, TIERS[tier], n, used, f"twx-bench:{tier}:{family}",
                                           max_tries) for tier in tiers for family in families}


def sweep_seeds(engine, families: list[str], n: int, used: set, tier_seeds: dict) -> dict[str, list[int]]:
    """family -> n train-fold seeds for the prior-weight sweep: in no log (`used`) and in no tier of this run."""
    taken = used | {(f, TIERS[t], s) for (t, f), seeds in tier_seeds.items() for s in seeds}
    return {f: solvable_seeds(engine, f, "train", n, taken, f"twx-bench:sweep:{f}") for f in families}


# ---- policies ----------------------------------------------------------------------------------
class Expert:
    """The generator's expert for one episode: re-plans after every deviation, exactly as
    `harnessrl.examples.twx._run_episode` does."""

    def __init__(self, engine, family: str, fold: str, seed: int):
        from harnessrl.examples.twx_expert import _InfoTracker

        self.engine, self.family, self.fold, self.seed = engine, family, fold, seed
        self.tracker = _InfoTracker()
        self.plan: list[str] | None = None

    def next(self, history: list[str], candidates: list[str], t: int) -> str | None:
        from harnessrl.examples.twx_expert import _drop_unusable, _gold_key

        cand_set = set(candidates)
        if self.plan is not None:
            _drop_unusable(self.plan, cand_set, self.tracker)
        if not self.plan:
            self.plan = self.engine.plan(self.family, self.fold, self.seed, history, _gold_key(self.seed, t),
                                         candidates) or []
            _drop_unusable(self.plan, cand_set, self.tracker)
        return self.plan[0] if self.plan else None

    def taken(self, action: str, expert: str | None, score_changed: bool) -> None:
        if expert is not None and action == expert:
            self.plan.pop(0)
        else:
            self.plan = None
        self.tracker.record(action, score_changed)


def behaviour_choice(kind: tuple[float, float], expert: str | None, candidates: list[str], rng: random.Random) -> str:
    """One action of the behaviour agent `kind` (P(expert), P(plausible mistake)): the generator's draw."""
    from harnessrl.examples.twx import behaviour_step

    return behaviour_step(*kind, expert, candidates).sample(rng)[0]


AGENT_PROBS = {name: (pe, pm) for name, _, pe, pm in __import__("harnessrl.examples.twx", fromlist=["AGENT_KINDS"]).AGENT_KINDS}


class CriticClient:
    def __init__(self, url: str, timeout: float = 60.0):
        import httpx

        self.client = httpx.Client(base_url=url, timeout=timeout)

    def score(self, state: dict, candidates: list, avoid_repeats: bool = False,
              prior_weight: float | None = None) -> dict:
        """candidates: texts or {text, logprob}; prior_weight None: the service's setting."""
        body = {"agent_id": "twx-bench", "state": state, "candidates": candidates, "avoid_repeats": avoid_repeats}
        if prior_weight is not None:
            body["prior_weight"] = prior_weight
        r = self.client.post("/v1/score", json=body)
        r.raise_for_status()
        return r.json()

    def close(self) -> None:
        self.client.close()


def episode(engine, family: str, fold: str, seed: int, max_steps: int, expert: Expert | None, choose) -> dict:
    """One game of (family, fold, seed): at every step `choose(state, candidates, gold)` returns the
    action, `gold` being the expert's (re-planned after every deviation; None without an expert
    or when it knows none). Returns success, steps, actions, loop."""
    from harnessrl.examples.twx_expert import FAMILY_PARAMS
    from harnessrl.metrics import has_loop

    env = engine.env
    obs, info = env.reset(seed=seed, gameFold=fold, gameName=family, gameParams=FAMILY_PARAMS[family],
                          generateGoldPath=False)
    task = str(info["taskDescription"])
    obs = str(obs)
    history: list[dict] = []
    actions: list[str] = []
    score = float(info["score"])
    for t in range(max_steps):
        candidates = [str(a) for a in info["validActions"]]
        state = {"task": task, "history": list(history), "observation": obs}
        gold = expert.next(actions, candidates, t) if expert else None
        action = choose(state, candidates, gold)
        new_obs, _reward, done, info = env.step(action)
        new_score = float(info["score"])
        if expert:
            expert.taken(action, gold, new_score != score)
        score = new_score
        actions.append(action)
        obs = str(new_obs)
        history.append({"action": action, "observation": obs, "status": score})  # the game's score, as logged
        if done:
            break
    return {"family": family, "fold": fold, "seed": seed, "success": bool(info["tasksuccess"]), "steps": len(actions),
            "loop": has_loop(actions), "actions": actions}


def behaviour_priors(candidates: list[str], logits: list[float]) -> list[dict]:
    """The candidates as {text, logprob}, logprob from the log-softmax of a policy's `logits` over them
    (clipped at 0, which a float sum may pass by an ulp and the service refuses)."""
    top = max(logits)
    norm = top + math.log(sum(math.exp(x - top) for x in logits))
    return [{"text": c, "logprob": min(0.0, x - norm)} for c, x in zip(candidates, logits)]


def play(engine, scorer: str, family: str, fold: str, seed: int, max_steps: int, ctx: dict) -> dict:
    """One episode of `scorer` on (family, fold, seed), all-actions protocol: it picks among every
    valid action; returns success, steps, actions, loop and its decision counts."""
    from harnessrl.critic import best_allowed
    from harnessrl.examples.twx import _draw_agent
    from harnessrl.features import repeats_here
    from harnessrl.render import Turn

    rng = random.Random(f"twx-bench:{scorer}:{family}:{fold}:{seed}")
    agent = base_scorer(scorer)
    no_repeat = scorer.endswith(NO_REPEAT)
    if scorer == "mix":
        agent = _draw_agent(rng)[0]
    needs_expert = agent in ("expert", "careful", "mistaken", "flailing")
    expert = Expert(engine, family, fold, seed) if needs_expert else None
    # avoided: decisions the avoid_repeats rule changed; prior_changed: those bc's prior moved off the critic's argmax
    counts = {"fallbacks": 0, "decisions": 0, "avoided": 0, "prior_changed": 0}
    ood: list[bool | None] = []  # the service's flag per decision (critic only)
    chosen_scores: list[float] = []

    def choose(state: dict, candidates: list[str], gold: str | None) -> str:
        if agent == "expert":
            return gold if gold is not None else rng.choice(candidates)
        if agent in AGENT_PROBS:
            return behaviour_choice(AGENT_PROBS[agent], gold, candidates, rng)
        if agent == "random":
            return rng.choice(candidates)
        if agent == "critic" or agent.startswith("critic+"):
            # critic: its scores alone (whatever the service's default); critic+bc*: that BC scorer's
            # log-probabilities as the candidates'; critic+prior: the model's own prior
            prior = prior_bc(agent)
            sent = behaviour_priors(candidates, ctx[prior].scores(state, candidates)) if prior else candidates
            body = ctx["critic"].score(state, sent, avoid_repeats=no_repeat,
                                       prior_weight=0.0 if agent == "critic" else ctx["bc_prior_weight"])
            best = int(body["best_index"])
            ranking = body.get("blended_scores") or body["scores"]  # what the service ranked by
            counts["fallbacks"] += bool(body["fallback"])
            counts["decisions"] += 1
            counts["avoided"] += best != best_allowed(ranking)
            counts["prior_changed"] += best_allowed(ranking) != best_allowed(body["scores"])
            ood.append(body.get("ood"))
            chosen_scores.append(float(body["scores"][best]))
            return candidates[best]
        if agent.startswith("bc"):
            scores = ctx[agent].scores(state, candidates)
            avoid = repeats_here([Turn(h["action"], h["observation"]) for h in state["history"]], state["observation"],
                                 candidates) if no_repeat else ()
            best = best_allowed(scores, avoid)
            counts["avoided"] += best != best_allowed(scores)
            return candidates[best]
        raise ValueError(f"unknown scorer {scorer!r}")

    ep = episode(engine, family, fold, seed, max_steps, expert, choose)
    return {"scorer": scorer, "agent": agent, **ep, **counts, "ood": ood, "chosen_scores": chosen_scores}


def play_rerank(engine, agent: str, k: int, scorer: str, family: str, fold: str, seed: int, max_steps: int,
                ctx: dict, prior_weight: float = 0.0) -> dict:
    """One episode of the rerank protocol (bench/twx_rerank.py): the behaviour agent `agent`
    proposes K actions a step, `scorer` picks one. The proposals' RNG is keyed by (agent, family,
    fold, seed) and not by scorer or K: every scorer sees the same first proposals, and the same
    draws for as long as its game goes as another's (paired comparisons); K = 2's first two
    draws are K = 4's. Keeps a decision log (proposals, logprobs, pick, the expert's action, the
    service's scores)."""
    from harnessrl.examples.twx import behaviour_step

    rng = random.Random(f"twx-bench:rerank:{agent}:{family}:{fold}:{seed}")
    counts = {"fallbacks": 0, "decisions": 0, "asked_again": 0}  # decisions: first asks the service answered
    log: list[dict] = []

    def choose(state: dict, candidates: list[str], gold: str | None) -> str:
        step = behaviour_step(*AGENT_PROBS[agent], gold, candidates)
        proposals = rerank.propose(step, k, rng)
        chosen, body = rerank.pick(scorer, proposals, gold, state, ctx, prior_weight)
        rec = rerank.decision(proposals, chosen, gold, body)
        if body is not None:
            counts["decisions"] += 1
            counts["fallbacks"] += rec["fallback"]
            if rec["fallback"] and scorer.endswith(rerank.AGAIN):  # ask again, once
                proposals = rerank.propose(step, k, rng)
                chosen, body = rerank.pick(scorer, proposals, gold, state, ctx, prior_weight)
                rec["again"] = rerank.decision(proposals, chosen, gold, body)
                counts["asked_again"] += 1
        log.append(rec)
        return proposals[chosen][0]

    ep = episode(engine, family, fold, seed, max_steps, Expert(engine, family, fold, seed), choose)
    return {"protocol": "rerank", "scorer": scorer, "agent": agent, "k": k, "prior_weight": prior_weight, **ep,
            **counts, "log": log}


def sweep_prior(engine, agent: str, k: int, seeds: dict[str, list[int]], weights: list[float], max_steps: int,
                ctx: dict) -> dict:
    """agent+critic+prior at each weight on the sweep seeds (train fold; in no tier, in no log):
    successes per weight and the chosen weight (the most successes; ties: the smallest)."""
    wins: dict[float, int] = {}
    n = sum(len(s) for s in seeds.values())
    for w in weights:
        wins[w] = sum(play_rerank(engine, agent, k, "agent+critic+prior", family, "train", seed, max_steps, ctx,
                                  w)["success"] for family, family_seeds in seeds.items() for seed in family_seeds)
    return {"successes": {f"{w:g}": [wins[w], n] for w in weights}, "chosen": rerank.choose_weight(wins)}


# ---- critic and BC -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pipeline_overrides(args, work: Path) -> list[str]:
    """The quickstart pipeline's overrides for the bench's critic: its logs (reduced: the first
    `--reduced-episodes` of them, train.steps=200, a prior of 150 steps), then the user's `--set`s."""
    overrides = [f"output_dir={work / 'pipeline'}", "serve.enabled=false", "data.heldout=[]",
                 f"registry.model_name={args.model_name}", "registry.experiment=twx-bench"]
    if args.reduced:
        subset = work / "twx_train_subset.jsonl"
        subset.write_bytes(b"".join(log_lines(args.logs)[: args.reduced_episodes]))
        overrides += [f"data.train=[{subset}]", "train.steps=200", "train.checkpoint_every=100",
                      "train.batch_size=128", "train.log_every=50", "train.reader.prior_steps=150"]
    elif args.logs:
        overrides.append(f"data.train=[{Path(args.logs).resolve()}]")
    return overrides + list(args.set or [])


def train_critic(args, work: Path) -> tuple[str, str, dict]:
    """Run the quickstart pipeline; returns (model URI, pipeline output dir, summary)."""
    from harnessrl.config import load_pipeline
    from harnessrl.jobs.pipeline import run_pipeline

    summary = run_pipeline(load_pipeline(ROOT / "pipelines" / "quickstart.yaml", pipeline_overrides(args, work)))
    return summary["model"]["uri"], str(work / "pipeline"), summary


def build_bc(names: list[str], encoded_dir: str, episodes: dict[str, dict], steps: int, render_cfg,
             head: str = "frozen", paths: dict | None = None) -> dict:
    """BC on the inputs the critic reads: the frozen embeddings (frozen and cross heads) or, for a
    reader critic, the state's segments through the reader's own network (twx_bc)."""
    from harnessrl.render import Renderer
    from twx_bc import BCScorer, load_bc_encoder, load_rows, train_bc

    if head == "reader":
        return build_reader_bc(names, encoded_dir, episodes, steps, render_cfg, paths or {})
    if "bc-expert" in names:
        raise SystemExit("bc-expert learns on the reader head's inputs: give a reader critic (--model) or train one "
                         "(the default head)")
    rows = load_rows(encoded_dir)
    model = load_bc_encoder(encoded_dir)

    def encode(texts):
        return model.encode(list(texts), convert_to_numpy=True, show_progress_bar=False, batch_size=64)

    renderer = Renderer(render_cfg)

    def render(state):
        return renderer.parse(state).text

    keeps = bc_filters(encoded_dir, rows["episode_id"], episodes)
    out, info = {}, {}
    for name in names:
        net, info[name] = train_bc(rows, keeps[name], steps)
        out[name] = BCScorer(net, encode, render)
        print(f"[twx-bench] {name}: {info[name]}", flush=True)
    return {"scorers": out, "info": info}


def bc_filters(encoded_dir: str, episode_ids: list[str], episodes: dict[str, dict]) -> dict:
    """Which rows each BC scorer learns from: all, successful episodes, careful-agent episodes. The
    pipeline's ingest table (beside `encoded/`) maps its episode ids to the logs' records."""
    import numpy as np
    import pyarrow.dataset as pads

    ing = pads.dataset(str(Path(encoded_dir).parent / "ingest" / "episodes"), format="parquet").to_table(
        columns=["episode_id", "native_id"]).to_pylist()
    native = {r["episode_id"]: r["native_id"] for r in ing}
    meta = [episodes.get(native.get(e)) for e in episode_ids]
    if any(m is None for m in meta):
        raise SystemExit("encoded rows name episodes that are not in the logs (--logs, or the bundled ones)")
    return {"bc": np.ones(len(meta), bool), "bc-success": np.array([bool(m["outcome"]["success"]) for m in meta]),
            "bc-careful": np.array([m["metadata"]["agent"] == "careful" for m in meta])}


def build_reader_bc(names: list[str], encoded_dir: str, episodes: dict[str, dict], steps: int, render_cfg,
                    paths: dict[str, bool]) -> dict:
    import numpy as np

    from harnessrl.heads.reader import table_embed
    from harnessrl.render import Renderer
    from harnessrl.behaviour_prior import train_listwise
    from twx_bc import ReaderBCScorer, expert_examples, load_bc_encoder, load_segment_rows

    rows = load_segment_rows(str(Path(encoded_dir).parent / "transitions"))
    keeps = bc_filters(encoded_dir, [r["episode_id"] for r in rows], episodes)
    model = load_bc_encoder(encoded_dir)
    cache: dict[str, object] = {}

    def live_embed(texts):  # texts the logs never had: the same encoder, as the critic's service does
        missing = [t for t in dict.fromkeys(texts) if t not in cache]
        if missing:
            cache.update(zip(missing, model.encode(missing, convert_to_numpy=True, show_progress_bar=False)))
        return np.stack([cache[t] for t in texts])

    # the encoded data's vectors; the encoder's own for a text it lacks (an expert label past the
    # encode stage's candidate cut, bc-expert)
    train_embed = table_embed(str(Path(encoded_dir) / "_texts"), missing=live_embed)

    renderer = Renderer(render_cfg)
    from harnessrl.encoded_data import read_identity

    encoder = read_identity(encoded_dir).model_name
    out, info = {}, {}
    for name in names:
        if name == "bc-expert":
            chosen = expert_examples(rows)
            if not chosen:
                raise SystemExit("bc-expert: no logged step records the expert's action (info.expert_action)")
        else:
            chosen = [r for r, keep in zip(rows, keeps[name]) if keep]
        net, inputs, info[name] = train_listwise(chosen, train_embed, encoder, paths, steps)
        inputs.embed = live_embed
        out[name] = ReaderBCScorer(net, inputs, renderer)
        print(f"[twx-bench] {name}: {info[name]}", flush=True)
    return {"scorers": out, "info": info}


def model_card(uri: str):
    """The critic's model card (render settings, lineage) without loading its encoder or weights."""
    from harnessrl.model_card import ModelCard

    return ModelCard.read(registry.resolve(uri).path)


# ---- diagnosis ---------------------------------------------------------------------------------
def write_diagnosis(results: dict, out_dir: Path, log_to_mlflow: bool = True) -> Path:
    """The run's diagnosis report (harnessrl.diagnosis): closed-loop findings per tier (the
    critic's action loops, the service's OOD flags, its success against the behaviour mix and
    random on the same seeds), the success table as metrics, the critic's learning curves from its
    training run and the distribution of the scores of the actions it chose. With the rerank
    protocol: its findings (a critic scorer below the agent alone or its self-consistency pick),
    its figures as metrics (`rerank/<agent>/k<K>/<scorer>/...`) and its tables at the end of the
    report. Logged to MLflow (experiment `twx-bench`) beside the markdown and PNGs on disk."""
    import dataclasses

    from harnessrl import diagnosis

    episodes, cfg = results["episodes"], results["config"]
    findings = []
    for tier in cfg["tiers"]:
        in_tier = [e for e in episodes if e["tier"] == tier]
        findings += [dataclasses.replace(f, name=f"{f.name} [{tier}]", evidence=f"{tier} tier: {f.evidence}")
                     for f in diagnosis.closed_loop_findings(in_tier)]
    figures: dict[str, Any] = {}
    for key, m in results["table"].items():
        scorer, tier, family = key.split("|")
        if family == "all":
            # MLflow metric names take no "+": critic+norepeat is logged as critic_norepeat
            figures[f"{tier}/{scorer.replace('+', '_')}"] = {"success": m["success"], "ci95_low": m["ci95"][0], "ci95_high": m["ci95"][1],
                                           "loop_rate": m["loop_rate"], "episodes": m["episodes"]}
    critic_eps = [e for e in episodes if e["scorer"] == "critic"]
    flags = [f for e in critic_eps for f in e.get("ood") or [] if f is not None]
    if flags:
        figures["critic_ood_rate"] = sum(flags) / len(flags)
    reranked = results.get("rerank")
    chosen = [x for e in critic_eps for x in e.get("chosen_scores") or []]
    if reranked:
        findings += rerank.findings(reranked)
        figures.update(rerank.figures(reranked))
        # without all-actions critic episodes, the scores of the actions the rerank's critic took
        chosen = chosen or [p["scores"][p["chosen"]] for e in reranked["episodes"] if rerank.uses_critic(e["scorer"])
                            for p in map(rerank.final, e["log"])]
    curves = {}
    if cfg.get("model") and chosen:
        from harnessrl.jobs.evaluate import training_curves

        try:
            curves = training_curves(model_card(cfg["model"]))
        except Exception as exc:  # a report without curves is still a report
            print(f"[twx-bench] no learning curves: {exc}", flush=True)
    report = diagnosis.render_report(findings, figures, curves, {"q": chosen}, out_dir,
                                     title="harnessrl diagnosis: closed-loop TextWorldExpress benchmark")
    if reranked:
        with report.open("a", encoding="utf-8") as f:
            f.write("\n## Rerank protocol\n\n" + rerank.markdown(reranked) + "\n")
    if log_to_mlflow:
        from harnessrl import metrics
        from harnessrl.jobs.evaluate import log_report

        results["mlflow_run_id"] = log_report(metrics.flatten(figures), findings, out_dir, "twx-bench", "twx-bench")
    results["findings"] = [f.to_dict() for f in findings]
    return report


# ---- presentation ------------------------------------------------------------------------------
def _fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def table_rows(results: dict, overall_only: bool = False) -> list[list[str]]:
    rows = []
    for key, m in results["table"].items():
        scorer, tier, family = key.split("|")
        if overall_only and family != "all":
            continue
        rows.append([scorer, tier, family, str(m["episodes"]), _fmt(m["success"]),
                     f"[{m['ci95'][0]:.2f}, {m['ci95'][1]:.2f}]", _fmt(m["mean_steps_to_success"], ".1f"),
                     _fmt(m["loop_rate"]), _fmt(m["fallback_rate"]), _fmt(m.get("ood_rate"))])
    return rows


HEADER = ["scorer", "tier", "family", "n", "success", "95% CI", "steps to success", "loop rate", "fallback rate",
          "ood rate"]


def text_table(rows: list[list[str]], header: list[str] = HEADER) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def pivot_markdown(results: dict) -> str:
    """Success k/n per scorer (rows) and family x tier (columns)."""
    cfg = results["config"]
    cols = [(t, f) for t in cfg["tiers"] for f in [*cfg["families"], "all"]]
    out = ["| scorer | " + " | ".join(f"{t} {f}" for t, f in cols) + " |", "|---|" + "---|" * len(cols)]
    for scorer in cfg["scorers"]:
        cells = [results["table"][f"{scorer}|{t}|{f}"] for t, f in cols]
        out.append(f"| {scorer} | " + " | ".join(f"{m['successes']}/{m['episodes']}" for m in cells) + " |")
    return "\n".join(out)


def markdown_table(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# ---- main --------------------------------------------------------------------------------------
def _csv(value: str) -> list[str]:
    return [v for v in value.split(",") if v]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from harnessrl.examples.twx import FAMILIES

    p = argparse.ArgumentParser(prog="bench/twx.py", description=__doc__.split("\n")[0])
    p.add_argument("--protocol", default="all-actions,rerank", help=f"comma-separated of {','.join(PROTOCOLS)} "
                   "(default both)")
    p.add_argument("--families", help=f"comma-separated, for every protocol (default: all-actions "
                   f"{','.join(DEFAULT_FAMILIES)}; rerank all {len(FAMILIES)}; reduced {','.join(REDUCED_FAMILIES)})")
    p.add_argument("--seeds-per-family", type=int, help="per tier, for every protocol (default 5; reduced 2)")
    p.add_argument("--tiers", default="id,ood", help="id,ood")
    p.add_argument("--scorers", help=f"all-actions: comma-separated of {','.join(ALL_SCORERS)}; critic{NO_REPEAT}, "
                                     f"bc{NO_REPEAT}, ... play a learned one under the avoid_repeats rule")
    p.add_argument("--rerank-scorers", help=f"rerank: comma-separated of {','.join(rerank.SCORERS)} (default all; "
                   f"reduced {','.join(rerank.REDUCED_SCORERS)})")
    p.add_argument("--agents", default=",".join(rerank.DEFAULT_AGENTS),
                   help=f"rerank: the behaviour agents that propose, of {','.join(rerank.AGENTS)} (default "
                        f"{','.join(rerank.DEFAULT_AGENTS)})")
    p.add_argument("--k", default=",".join(map(str, rerank.DEFAULT_K)), help="rerank: proposals drawn per step, "
                   "comma-separated (default 4), e.g. 2,4,8")
    p.add_argument("--prior-weight", type=float, help="rerank: agent+critic+prior's weight (default: swept)")
    p.add_argument("--prior-weights", default=",".join(f"{w:g}" for w in rerank.PRIOR_WEIGHTS),
                   help="rerank: the weights the sweep tries (default %(default)s)")
    p.add_argument("--sweep-seeds", type=int, default=2, help="rerank: train-fold seeds per family for the sweep, "
                   "in no tier and no log (default 2)")
    p.add_argument("--max-steps", type=int, default=None, help="step cap per episode (default: the logs' cap, 40)")
    p.add_argument("--model", help="NAME@ALIAS or models:/... of a trained critic; default: train one now")
    p.add_argument("--encoded", help="the pipeline's encoded dir (for BC); default: that of the training run, "
                   "or $HARNESSRL_HOME/runs/quickstart/encoded with --model")
    p.add_argument("--model-name", default="twx-bench-critic", help="registry name when training here")
    p.add_argument("--logs", help="the logs the critic and BC learn from (native JSONL, .gz or not), e.g. a larger "
                   "corpus from `python -m harnessrl.examples.twx --train-episodes 1500`; their seeds stay out of "
                   "the tiers (default: the bundled twx_train)")
    p.add_argument("--set", action="append", help="pipeline override when training here (repeatable)")
    p.add_argument("--bc-prior-weight", type=float, default=1.0, help="critic+bc*, critic+prior: the weight w of "
                   "bc's or the critic's own prior's log-probabilities (default %(default)s)")
    p.add_argument("--bc-steps", type=int, default=None, help="BC gradient steps (default 800; reduced 150)")
    p.add_argument("--reduced", action="store_true", help="the CI configuration (< 5 min on 2 cores)")
    p.add_argument("--reduced-episodes", type=int, default=40, help="log episodes (the first) the reduced critic "
                   "trains on")
    p.add_argument("--work-dir", help="where a trained pipeline writes (default: a temp dir)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--markdown", help="write the markdown table here")
    p.add_argument("--report", help="diagnosis report folder (default: <work dir>/diagnosis)")
    p.add_argument("--from-json", help="only print/write the tables of an earlier run's --json")
    args = p.parse_args(argv)
    for flag, given, known in (("--protocol", args.protocol, PROTOCOLS), ("--agents", args.agents, rerank.AGENTS),
                               ("--rerank-scorers", args.rerank_scorers or "", rerank.SCORERS)):
        unknown = [v for v in _csv(given) if v not in known]
        if unknown or (flag != "--rerank-scorers" and not _csv(given)):
            p.error(f"{flag}: unknown or missing {', '.join(unknown) or 'value'}; known: {', '.join(known)}")
    try:
        ks, weights = [int(v) for v in _csv(args.k)], [float(v) for v in _csv(args.prior_weights)]
    except ValueError as exc:
        p.error(f"--k / --prior-weights: {exc}")
    if not ks or any(k < 1 for k in ks):
        p.error(f"--k: positive integers, got {args.k!r}")
    if not weights or any(not math.isfinite(w) or w < 0 for w in [*weights, args.prior_weight or 0.0]):
        p.error("--prior-weight / --prior-weights: finite weights >= 0")
    if args.sweep_seeds < 1:
        p.error("--sweep-seeds: at least 1")
    return args


def rerank_config(args: argparse.Namespace, tiers: list[str], n_seeds: int) -> dict:
    """The rerank protocol's settings from the command line (bench/twx_rerank.py)."""
    from harnessrl.examples.twx import FAMILIES

    families = _csv(args.families) if args.families else list(REDUCED_FAMILIES if args.reduced else FAMILIES)
    scorers = _csv(args.rerank_scorers) if args.rerank_scorers else \
        list(rerank.REDUCED_SCORERS if args.reduced else rerank.SCORERS)
    return {"families": families, "tiers": tiers, "agents": _csv(args.agents), "k": [int(v) for v in _csv(args.k)],
            "scorers": scorers, "seeds_per_family": n_seeds, "prior_weight": args.prior_weight,
            "prior_weights": [float(w) for w in _csv(args.prior_weights)], "sweep_seeds_per_family": args.sweep_seeds}


def run_rerank(engine, cfg: dict, seeds: dict, used: set, max_steps: int, ctx: dict, timings: dict) -> dict:
    """The rerank protocol: agent+critic+prior's weight first (given, or swept per agent x K on
    train-fold seeds in no tier and no log), then every agent x K x scorer on every seed."""
    weights: dict[str, float] = {}
    sweep: dict[str, dict] = {}
    swept_on: dict[str, list[int]] = {}
    t0 = time.time()
    if "agent+critic+prior" in cfg["scorers"]:
        if cfg["prior_weight"] is None:
            swept_on = sweep_seeds(engine, cfg["families"], cfg["sweep_seeds_per_family"], used, seeds)
        for agent in cfg["agents"]:
            for k in cfg["k"]:
                key = f"{agent}|k{k}"
                if cfg["prior_weight"] is not None:
                    weights[key] = cfg["prior_weight"]
                    continue
                sweep[key] = sweep_prior(engine, agent, k, swept_on, cfg["prior_weights"], max_steps, ctx)
                weights[key] = sweep[key]["chosen"]
                print(f"[twx-bench] rerank sweep {key}: {sweep[key]['successes']} -> prior_weight {weights[key]:g}",
                      flush=True)
        timings["rerank_sweep"] = time.time() - t0
    t0 = time.time()
    episodes: list[dict] = []
    for (tier, family), seed_list in seeds.items():
        for seed in seed_list:
            for agent in cfg["agents"]:
                for k in cfg["k"]:
                    for scorer in cfg["scorers"]:
                        w = weights.get(f"{agent}|k{k}", 0.0) if scorer.startswith("agent+critic+prior") else 0.0
                        ep = play_rerank(engine, agent, k, scorer, family, TIERS[tier], seed, max_steps, ctx, w)
                        ep["tier"] = tier
                        episodes.append(ep)
        wins = collections.Counter((e["agent"], e["k"], e["scorer"]) for e in episodes
                                   if e["tier"] == tier and e["family"] == family and e["success"])
        print(f"[twx-bench] rerank {tier}/{family}: " + ", ".join(
            f"{a}/k{k}/{s}={wins[(a, k, s)]}/{len(seed_list)}" for a in cfg["agents"] for k in cfg["k"]
            for s in cfg["scorers"]), flush=True)
    timings["rerank_play"] = time.time() - t0
    return {"config": cfg, "seeds": {f"{t}|{f}": s for (t, f), s in seeds.items()}, "sweep": sweep,
            "sweep_seeds": swept_on, "prior_weights": weights,
            "table": rerank.table(episodes, cfg, summarise), "episodes": episodes}


def run(args: argparse.Namespace) -> dict:
    import torch

    from harnessrl.examples.twx_expert import MAX_STEPS, _Engine
    from harnessrl.ray_runtime import init_ray

    t_start = time.time()
    protocols = _csv(args.protocol)
    families = (_csv(args.families) if args.families
                else list(REDUCED_FAMILIES if args.reduced else DEFAULT_FAMILIES))
    scorers = [] if "all-actions" not in protocols else \
        _csv(args.scorers) if args.scorers else list(REDUCED_SCORERS if args.reduced else DEFAULT_SCORERS)
    tiers = _csv(args.tiers)
    n_seeds = args.seeds_per_family or (2 if args.reduced else 5)
    max_steps = args.max_steps or MAX_STEPS
    bc_steps = args.bc_steps or (150 if args.reduced else 800)
    rr = rerank_config(args, tiers, n_seeds) if "rerank" in protocols else None
    for s in scorers:
        if base_scorer(s) not in ALL_SCORERS or (s.endswith(NO_REPEAT) and not is_learned(base_scorer(s))):
            raise SystemExit(f"unknown scorer {s!r}; known: {', '.join(ALL_SCORERS)}, and critic{NO_REPEAT}, "
                             f"bc{NO_REPEAT}, ... for the learned ones")
    for t in tiers:
        if t not in TIERS:
            raise SystemExit(f"unknown tier {t!r}")
    timings: dict[str, float] = {}
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="twx-bench-"))
    work.mkdir(parents=True, exist_ok=True)

    # a given critic is looked up before Ray starts: a missing one is a one-line error, not a cluster start
    model_uri = registry.model_uri(args.model, "--model") if args.model else None
    card = model_card(model_uri) if model_uri else None

    import ray

    owns_ray = not ray.is_initialized()
    init_ray()
    encoded = args.encoded
    need_model = any(base_scorer(s).startswith("critic") for s in scorers) or bool(
        rr and any(rerank.uses_critic(s) for s in rr["scorers"]))
    need_bc = sorted({base_scorer(s) for s in scorers if s.startswith("bc")}
                     | {prior_bc(s) for s in scorers if prior_bc(s)}
                     | ({"bc"} if rr and "agent+bc" in rr["scorers"] else set()))
    training = None
    if not model_uri and (need_model or (need_bc and not encoded)):
        t0 = time.time()
        model_uri, out, summary = train_critic(args, work)
        training = {k: summary.get(k) for k in ("train", "model", "seconds")}
        encoded = encoded or str(Path(out) / "encoded")
        timings["train_critic"] = time.time() - t0
    if need_bc and not encoded:
        from harnessrl import settings

        encoded = str(settings.runs_dir() / "quickstart" / "encoded")

    records = known_records(args.logs)
    by_episode = {r["episode_id"]: r for r in records}
    ctx: dict[str, Any] = {"bc_prior_weight": args.bc_prior_weight}
    bc_info = None
    if need_bc:
        from harnessrl.config import load_pipeline

        # BC sees what the critic sees: its render settings and its head's inputs when there is one
        # (trained here or given), else the quickstart's with this run's overrides
        if model_uri:
            card = card or model_card(model_uri)  # read above when given, else the one trained here
            render_cfg, head, paths = card.render, card.head, card.head_config
        else:
            pipe = load_pipeline(ROOT / "pipelines" / "quickstart.yaml", args.set)
            render_cfg, head, paths = pipe.render, pipe.train.head, pipe.train.reader.model_dump()
        t0 = time.time()
        torch.set_num_threads(2)
        built = build_bc(need_bc, encoded, by_episode, bc_steps, render_cfg, head,
                         {k: bool(paths.get(k)) for k in ("semantic", "tokens", "match")})
        ctx.update(built["scorers"])
        bc_info = built["info"]
        timings["train_bc"] = time.time() - t0
    torch.set_num_threads(1)

    serving = None
    if need_model:
        from harnessrl.serving import app as serve_app

        t0 = time.time()
        url = serve_app.start(model_uri, "127.0.0.1", free_port())
        serving = serve_app
        ctx["critic"] = CriticClient(url)
        timings["start_service"] = time.time() - t0

    engine = _Engine()
    episodes: list[dict] = []
    reranked = None
    try:
        t0 = time.time()
        used = used_seeds(records)
        # one draw per (tier, family) for both protocols: a family both play has the same seeds in each
        every = list(dict.fromkeys([*(families if scorers else []), *(rr["families"] if rr else [])]))
        drawn = pick_seeds(engine, every, tiers, n_seeds, used)
        seeds = {(t, f): s for (t, f), s in drawn.items() if scorers and f in families}
        timings["pick_seeds"] = time.time() - t0
        t0 = time.time()
        for (tier, family), seed_list in seeds.items():
            for seed in seed_list:
                for scorer in scorers:
                    ep = play(engine, scorer, family, TIERS[tier], seed, max_steps, ctx)
                    ep["tier"] = tier
                    episodes.append(ep)
            done = [e for e in episodes if e["tier"] == tier and e["family"] == family]
            print(f"[twx-bench] {tier}/{family}: {len(done)} episodes, "
                  + ", ".join(f"{s}={sum(e['success'] for e in done if e['scorer'] == s)}/{len(seed_list)}"
                              for s in scorers), flush=True)
        timings["play"] = time.time() - t0
        if rr:
            reranked = run_rerank(engine, rr, {(t, f): s for (t, f), s in drawn.items() if f in rr["families"]},
                                  used, max_steps, ctx, timings)
    finally:
        engine.close()
        if "critic" in ctx:
            ctx["critic"].close()
        if serving is not None:
            serving.stop()
        if owns_ray:
            from harnessrl.ray_runtime import shutdown_ray

            shutdown_ray()

    table: dict[str, dict] = {}
    for scorer in scorers:
        for tier in tiers:
            for family in [*families, "all"]:
                eps = [e for e in episodes if e["scorer"] == scorer and e["tier"] == tier
                       and (family == "all" or e["family"] == family)]
                table[f"{scorer}|{tier}|{family}"] = summarise(eps)
    timings["total"] = time.time() - t_start
    return {
        "config": {"protocols": protocols, "families": families if scorers else [], "tiers": tiers,
                   "scorers": scorers, "seeds_per_family": n_seeds, "max_steps": max_steps, "model": model_uri,
                   "encoded": encoded, "bc_steps": bc_steps, "reduced": args.reduced, "argv": sys.argv[1:],
                   "work_dir": str(work)},
        "seeds": {f"{t}|{f}": s for (t, f), s in seeds.items()},
        "table": table, "training": training, "bc": bc_info,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "episodes": [{k: v for k, v in e.items()} for e in episodes],
        "rerank": reranked,
    }


def _log_progress() -> None:
    import logging

    log = logging.getLogger("harnessrl")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[harnessrl %(asctime)s] %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _log_progress()
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
    else:
        results = run(args)
        if args.json:  # before the report: a failing report must not lose the episodes
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if not args.from_json:
        report = write_diagnosis(results, Path(args.report or Path(results["config"]["work_dir"]) / "diagnosis"))
        results["report"] = str(report)
        print(f"[twx-bench] diagnosis report: {report} ({len(results['findings'])} findings)", flush=True)
    overall, rows = table_rows(results, overall_only=True), table_rows(results)
    reranked = results.get("rerank")
    if rows:
        print("overall per tier:\n" + text_table(overall) + "\n\nper family:\n" + text_table(rows))
    if reranked:
        print("\nrerank (tiers and families pooled):\n" + text_table(rerank.overall_rows(reranked),
                                                                    rerank.OVERALL_HEADER))
    print(f"[twx-bench] wall time {results['timings_s']}")
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.markdown:
        parts = [f"Config {json.dumps(results['config']['argv'])}, wall time {results['timings_s']} s."]
        if rows:
            parts += ["Overall per tier:\n\n" + markdown_table(overall),
                      "Successes per family and tier:\n\n" + pivot_markdown(results),
                      "Per family:\n\n" + markdown_table(rows)]
        if reranked:
            parts.append(rerank.markdown(reranked))
        Path(args.markdown).write_text("\n\n".join(parts) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HarnessError as exc:  # a missing model, a bad --set: say what, without a stack trace
        print(f"twx: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
