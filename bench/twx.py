"""Closed-loop benchmark on TextWorldExpress (issue 4, DESIGN §11).

Every scorer plays the same held-out seeds; at each step it gets the task, the history of
(action, observation) and the valid actions, and the valid action it scores highest is taken.

  critic       the served critic: POST /v1/score on a running Ray Serve app with the structured
               state {task, history, observation}; takes best_index (fallbacks are counted, not acted on)
  mix          the behaviour mix of the logs (careful/mistaken/flailing ~25/50/25, one agent drawn
               per episode), the generator's own agents (harnessrl.examples.twx)
  careful, mistaken, flailing   each behaviour agent alone
  random       a uniformly random valid action
  bc           behaviour cloning on all logs (in process, see bench/twx_bc.py)
  bc-success   BC on successful episodes only
  bc-careful   BC on careful-agent episodes only (ceiling check: cloning the best behaviour)
  expert       the generator's re-planning expert (gold agent)
  NAME+norepeat   a learned scorer (critic, bc*) under the `avoid_repeats` rule: it never takes an
               action again from the same observation while another is left (the critic through
               the service's request field, BC with the same function, harnessrl.features.repeats_here)

Tiers: `id` = train-fold seeds never used in the logs (the bundled train and test files, and
`--logs`), `ood` = test-fold seeds (not in the test logs either). Seeds are drawn deterministically per (tier, family)
among those the expert solves from the start.

    python bench/twx.py --reduced                                   # CI configuration, < 5 min
    python bench/twx.py --families coin,sorting,arithmetic,mapreader,twc,peckingorder \
        --seeds-per-family 5 --json out.json --markdown out.md     # trains the quickstart critic first
    python bench/twx.py --model twx-critic@champion --encoded $HARNESSRL_HOME/runs/quickstart/encoded ...
    python -m harnessrl.examples.twx --out /tmp/logs --train-episodes 1500 --test-episodes 0
    python bench/twx.py --logs /tmp/logs/twx_train.jsonl.gz ...     # the critic and BC learn from more logs

Ray binds 127.0.0.1; the service binds 127.0.0.1 on a free port; every loop is bounded.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import socket
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

from harnessrl import registry
from harnessrl.metrics import wilson_interval

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

ALL_SCORERS = ("critic", "mix", "careful", "mistaken", "flailing", "random", "bc", "bc-success", "bc-careful",
               "expert")
REDUCED_SCORERS = ("critic", "mix", "random", "bc", "expert")
NO_REPEAT = "+norepeat"  # suffix of a learned scorer played under the avoid_repeats rule
DEFAULT_FAMILIES = ("coin", "sorting", "arithmetic", "mapreader", "twc", "peckingorder")
REDUCED_FAMILIES = ("arithmetic", "sorting")
TIERS = {"id": "train", "ood": "test"}


def base_scorer(name: str) -> str:
    """`critic+norepeat` -> `critic`: the scorer a variant plays with."""
    return name[: -len(NO_REPEAT)] if name.endswith(NO_REPEAT) else name


def is_learned(name: str) -> bool:
    return name == "critic" or name.startswith("bc")


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


def pick_seeds(engine, families: list[str], tiers: list[str], n: int, used: set, max_tries: int = 200) -> dict:
    """(tier, family) -> n seeds of the tier's fold not in `used`, that the expert solves from the start."""
    from harnessrl.examples.twx_expert import _gold_key

    out: dict[tuple[str, str], list[int]] = {}
    for tier in tiers:
        fold = TIERS[tier]
        for family in families:
            pool = [s for s in engine.seeds[fold] if (family, fold, s) not in used]
            random.Random(f"twx-bench:{tier}:{family}").shuffle(pool)
            chosen: list[int] = []
            for seed in pool[:max_tries]:
                if len(chosen) >= n:
                    break
                if engine.plan(family, fold, seed, [], _gold_key(seed, 0)):
                    chosen.append(seed)
            out[(tier, family)] = chosen
    return out


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
    from harnessrl.examples.twx import _plausible_mistake

    p_expert, p_mistake = kind
    u = rng.random()
    if expert is None:
        return rng.choice(candidates)
    if u < p_expert:
        return expert
    if u < p_expert + p_mistake:
        return _plausible_mistake(expert, candidates, rng)[0]
    return rng.choice(candidates)


AGENT_PROBS = {name: (pe, pm) for name, _, pe, pm in __import__("harnessrl.examples.twx", fromlist=["AGENT_KINDS"]).AGENT_KINDS}


class CriticClient:
    def __init__(self, url: str, timeout: float = 60.0):
        import httpx

        self.client = httpx.Client(base_url=url, timeout=timeout)

    def score(self, state: dict, candidates: list[str], avoid_repeats: bool = False) -> dict:
        r = self.client.post("/v1/score", json={"agent_id": "twx-bench", "state": state, "candidates": candidates,
                                                "avoid_repeats": avoid_repeats})
        r.raise_for_status()
        return r.json()

    def close(self) -> None:
        self.client.close()


def play(engine, scorer: str, family: str, fold: str, seed: int, max_steps: int, ctx: dict) -> dict:
    """One episode of `scorer` on (family, fold, seed); returns success, steps, actions, loop."""
    from harnessrl.critic import best_allowed
    from harnessrl.examples.twx import _draw_agent
    from harnessrl.examples.twx_expert import FAMILY_PARAMS
    from harnessrl.features import repeats_here
    from harnessrl.metrics import has_loop
    from harnessrl.render import Turn

    rng = random.Random(f"twx-bench:{scorer}:{family}:{fold}:{seed}")
    agent = base_scorer(scorer)
    no_repeat = scorer.endswith(NO_REPEAT)
    if scorer == "mix":
        agent = _draw_agent(rng)[0]
    needs_expert = agent in ("expert", "careful", "mistaken", "flailing")
    expert = Expert(engine, family, fold, seed) if needs_expert else None
    env = engine.env
    obs, info = env.reset(seed=seed, gameFold=fold, gameName=family, gameParams=FAMILY_PARAMS[family],
                          generateGoldPath=False)
    task = str(info["taskDescription"])
    obs = str(obs)
    history: list[dict] = []
    actions: list[str] = []
    score = float(info["score"])
    fallbacks = decisions = avoided = 0  # avoided: decisions the avoid_repeats rule changed
    ood: list[bool | None] = []  # the service's flag per decision (critic only)
    chosen_scores: list[float] = []
    done = False
    for t in range(max_steps):
        candidates = [str(a) for a in info["validActions"]]
        state = {"task": task, "history": list(history), "observation": obs}
        gold = expert.next(actions, candidates, t) if expert else None
        if agent == "expert":
            action = gold if gold is not None else rng.choice(candidates)
        elif agent in AGENT_PROBS:
            action = behaviour_choice(AGENT_PROBS[agent], gold, candidates, rng)
        elif agent == "random":
            action = rng.choice(candidates)
        elif agent == "critic":
            body = ctx["critic"].score(state, candidates, avoid_repeats=no_repeat)
            best = int(body["best_index"])
            action, fallbacks, decisions = candidates[best], fallbacks + bool(body["fallback"]), decisions + 1
            avoided += best != best_allowed(body["scores"])
            ood.append(body.get("ood"))
            chosen_scores.append(float(body["scores"][best]))
        elif agent.startswith("bc"):
            scores = ctx[agent].scores(state, candidates)
            avoid = repeats_here([Turn(h["action"], h["observation"]) for h in history], obs, candidates) \
                if no_repeat else ()
            best = best_allowed(scores, avoid)
            action, avoided = candidates[best], avoided + (best != best_allowed(scores))
        else:
            raise ValueError(f"unknown scorer {scorer!r}")
        new_obs, _reward, done, info = env.step(action)
        new_score = float(info["score"])
        if expert:
            expert.taken(action, gold, new_score != score)
        score = new_score
        actions.append(action)
        obs = str(new_obs)
        history.append({"action": action, "observation": obs})
        if done:
            break
    return {"scorer": scorer, "agent": agent, "family": family, "fold": fold, "seed": seed,
            "success": bool(info["tasksuccess"]), "steps": len(actions), "loop": has_loop(actions),
            "fallbacks": fallbacks, "decisions": decisions, "avoided": avoided, "actions": actions, "ood": ood,
            "chosen_scores": chosen_scores}


# ---- critic and BC -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pipeline_overrides(args, work: Path) -> list[str]:
    """The quickstart pipeline's overrides for the bench's critic: its logs (reduced: the first
    `--reduced-episodes` of them, train.steps=200), then the user's `--set`s."""
    overrides = [f"output_dir={work / 'pipeline'}", "serve.enabled=false", "data.heldout=[]",
                 f"registry.model_name={args.model_name}", "registry.experiment=twx-bench"]
    if args.reduced:
        subset = work / "twx_train_subset.jsonl"
        subset.write_bytes(b"".join(log_lines(args.logs)[: args.reduced_episodes]))
        overrides += [f"data.train=[{subset}]", "train.steps=200", "train.checkpoint_every=100",
                      "train.batch_size=128", "train.log_every=50"]
    elif args.logs:
        overrides.append(f"data.train=[{Path(args.logs).resolve()}]")
    return overrides + list(args.set or [])


def train_critic(args, work: Path) -> tuple[str, str, dict]:
    """Run the quickstart pipeline; returns (model URI, pipeline output dir, summary)."""
    from harnessrl.config import load_pipeline
    from harnessrl.jobs.pipeline import run_pipeline

    summary = run_pipeline(load_pipeline(ROOT / "pipelines" / "quickstart.yaml", pipeline_overrides(args, work)))
    return summary["model"]["uri"], str(work / "pipeline"), summary


def build_bc(names: list[str], encoded_dir: str, episodes: dict[str, dict], steps: int, render_cfg: dict) -> dict:
    import numpy as np

    from harnessrl.render import Layout, parse_request_state
    from twx_bc import BCScorer, load_bc_encoder, load_rows, train_bc

    rows = load_rows(encoded_dir)
    model = load_bc_encoder(encoded_dir)

    def encode(texts):
        return model.encode(list(texts), convert_to_numpy=True, show_progress_bar=False, batch_size=64)

    def render(state):
        return parse_request_state(state, render_cfg["window"], render_cfg["max_chars"], render_cfg.get("max_tokens"),
                                   render_cfg.get("tokenizer"), Layout.from_config(render_cfg)).text

    # The pipeline's ingest table (beside `encoded/`) maps its episode ids to the logs' records.
    import pyarrow.dataset as pads

    ing = pads.dataset(str(Path(encoded_dir).parent / "ingest" / "episodes"), format="parquet").to_table(
        columns=["episode_id", "native_id"]).to_pylist()
    native = {r["episode_id"]: r["native_id"] for r in ing}
    meta = [episodes.get(native.get(e)) for e in rows["episode_id"]]
    if any(m is None for m in meta):
        raise SystemExit("encoded rows name episodes that are not in the logs (--logs, or the bundled ones)")
    keeps = {
        "bc": np.ones(len(meta), bool),
        "bc-success": np.array([bool(m["outcome"]["success"]) for m in meta]),
        "bc-careful": np.array([m["metadata"]["agent"] == "careful" for m in meta]),
    }
    out, info = {}, {}
    for name in names:
        net, info[name] = train_bc(rows, keeps[name], steps)
        out[name] = BCScorer(net, encode, render)
        print(f"[twx-bench] {name}: {info[name]}", flush=True)
    return {"scorers": out, "info": info}


def model_meta(uri: str) -> dict:
    """The critic's stored meta (render settings, lineage) without loading its encoder."""
    from harnessrl.model_files import load_critic_files

    return load_critic_files(registry.resolve(uri).path)[1]


# ---- diagnosis ---------------------------------------------------------------------------------
def write_diagnosis(results: dict, out_dir: Path, log_to_mlflow: bool = True) -> Path:
    """The run's diagnosis report (harnessrl.diagnosis): closed-loop findings per tier (the
    critic's action loops, the service's OOD flags, its success against the behaviour mix and
    random on the same seeds), the success table as metrics, the critic's learning curves from its
    training run and the distribution of the scores of the actions it chose. Logged to MLflow
    (experiment `twx-bench`) beside the markdown and PNGs on disk."""
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
    curves = {}
    if cfg.get("model") and critic_eps:
        from harnessrl.jobs.evaluate import training_curves

        try:
            curves = training_curves(model_meta(cfg["model"]))
        except Exception as exc:  # a report without curves is still a report
            print(f"[twx-bench] no learning curves: {exc}", flush=True)
    arrays = {"q": [x for e in critic_eps for x in e.get("chosen_scores") or []]}
    report = diagnosis.render_report(findings, figures, curves, arrays, out_dir,
                                     title="harnessrl diagnosis: closed-loop TextWorldExpress benchmark")
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
                     _fmt(m["loop_rate"]), _fmt(m["fallback_rate"])])
    return rows


HEADER = ["scorer", "tier", "family", "n", "success", "95% CI", "steps to success", "loop rate", "fallback rate"]


def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADER)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(HEADER), line(["-" * w for w in widths]), *map(line, rows)])


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
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/twx.py", description=__doc__.split("\n")[0])
    p.add_argument("--families", help=f"comma-separated (default {','.join(DEFAULT_FAMILIES)})")
    p.add_argument("--seeds-per-family", type=int, help="per tier (default 5; reduced 2)")
    p.add_argument("--tiers", default="id,ood", help="id,ood")
    p.add_argument("--scorers", help=f"comma-separated of {','.join(ALL_SCORERS)}; critic{NO_REPEAT}, bc{NO_REPEAT}, "
                                     "... play a learned one under the avoid_repeats rule")
    p.add_argument("--max-steps", type=int, default=None, help="step cap per episode (default: the logs' cap, 40)")
    p.add_argument("--model", help="NAME@ALIAS or models:/... of a trained critic; default: train one now")
    p.add_argument("--encoded", help="the pipeline's encoded dir (for BC); default: that of the training run, "
                   "or $HARNESSRL_HOME/runs/quickstart/encoded with --model")
    p.add_argument("--model-name", default="twx-bench-critic", help="registry name when training here")
    p.add_argument("--logs", help="the logs the critic and BC learn from (native JSONL, .gz or not), e.g. a larger "
                   "corpus from `python -m harnessrl.examples.twx --train-episodes 1500`; their seeds stay out of "
                   "the tiers (default: the bundled twx_train)")
    p.add_argument("--set", action="append", help="pipeline override when training here (repeatable)")
    p.add_argument("--bc-steps", type=int, default=None, help="BC gradient steps (default 800; reduced 150)")
    p.add_argument("--reduced", action="store_true", help="the CI configuration (< 5 min on 2 cores)")
    p.add_argument("--reduced-episodes", type=int, default=40, help="log episodes (the first) the reduced critic "
                   "trains on")
    p.add_argument("--work-dir", help="where a trained pipeline writes (default: a temp dir)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--markdown", help="write the markdown table here")
    p.add_argument("--report", help="diagnosis report folder (default: <work dir>/diagnosis)")
    p.add_argument("--from-json", help="only print/write the tables of an earlier run's --json")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    import torch

    from harnessrl.examples.twx_expert import MAX_STEPS, _Engine
    from harnessrl.ray_runtime import init_ray

    t_start = time.time()
    families = (args.families.split(",") if args.families
                else list(REDUCED_FAMILIES if args.reduced else DEFAULT_FAMILIES))
    scorers = args.scorers.split(",") if args.scorers else list(REDUCED_SCORERS if args.reduced else ALL_SCORERS)
    tiers = args.tiers.split(",")
    n_seeds = args.seeds_per_family or (2 if args.reduced else 5)
    max_steps = args.max_steps or MAX_STEPS
    bc_steps = args.bc_steps or (150 if args.reduced else 800)
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

    import ray

    owns_ray = not ray.is_initialized()
    init_ray()
    model_uri, encoded = None, args.encoded
    need_model = any(base_scorer(s) == "critic" for s in scorers)
    need_bc = sorted({base_scorer(s) for s in scorers if s.startswith("bc")})
    training = None
    if args.model:
        model_uri = registry.model_uri(args.model, "--model")
    elif need_model or (need_bc and not encoded):
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
    ctx: dict[str, Any] = {}
    bc_info = None
    if need_bc:
        from harnessrl.config import load_pipeline

        # BC sees states rendered as the encoded data's were: the critic's settings when there is
        # one (trained here or given), else the quickstart's with this run's overrides
        render_cfg = (model_meta(model_uri)["render"] if model_uri
                      else load_pipeline(ROOT / "pipelines" / "quickstart.yaml", args.set).render.model_dump())
        t0 = time.time()
        torch.set_num_threads(2)
        built = build_bc(need_bc, encoded, by_episode, bc_steps, render_cfg)
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
    try:
        t0 = time.time()
        seeds = pick_seeds(engine, families, tiers, n_seeds, used_seeds(records))
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
        "config": {"families": families, "tiers": tiers, "scorers": scorers, "seeds_per_family": n_seeds,
                   "max_steps": max_steps, "model": model_uri, "encoded": encoded, "bc_steps": bc_steps,
                   "reduced": args.reduced, "argv": sys.argv[1:], "work_dir": str(work)},
        "seeds": {f"{t}|{f}": s for (t, f), s in seeds.items()},
        "table": table, "training": training, "bc": bc_info,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "episodes": [{k: v for k, v in e.items()} for e in episodes],
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
    print("overall per tier:\n" + text_table(overall) + "\n\nper family:\n" + text_table(rows))
    print(f"[twx-bench] wall time {results['timings_s']}")
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.markdown:
        Path(args.markdown).write_text(f"Overall per tier (config {json.dumps(results['config']['argv'])}, "
                                       f"wall time {results['timings_s']} s):\n\n" + markdown_table(overall)
                                       + "\n\nSuccesses per family and tier:\n\n" + pivot_markdown(results)
                                       + "\n\nPer family:\n\n" + markdown_table(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
