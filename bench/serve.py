"""Scoring under many concurrent agents: the harnessrl service against a naive server (issue 6).

Simulated agents walk through real episodes of the example corpus (builtin twx_test, native
JSONL) step by step: at step t an agent sends the structured state {task, history of (action,
result), observation} of that step and K candidates (the step's logged candidates, padded from
other actions of the same episode, the taken action always among them). Several agents play the
same episodes, so states and candidates recur as they do for real agents.

Systems, run one after the other on the same machine, each with the same critic:
  (b) baseline   one FastAPI/uvicorn process (1 worker, a subprocess) that loads the critic with
                 harnessrl.critic.Critic (embedding cache size 0) and encodes and scores every
                 request on its own: no batching, no cache (one request at a time under a lock:
                 the Critic is not thread-safe; torch uses --baseline-threads threads)
  (a) harnessrl  serving.app.start(config=ServeConfig(...)): Ray Serve, @serve.batch, LRU
                 embedding cache, 1 replica unless --replicas; the encoder inline, or with
                 --encoder as a deployment of its own (serve.encoder, 0.5 CPU); the service's
                 prior_weight (a reader critic's behaviour prior is computed too) unless --prior-weight
Load: a separate process (asyncio + httpx) so the client never shares a GIL with a server.
  closed loop  --agents agents, each sends its next request when the previous answer arrives,
               for --duration-s after --warmup-s (both systems)
  open loop    harnessrl only: requests at a fixed rate = --open-fraction x its closed-loop
               throughput, for --open-duration-s; reports p99 at that load
Every loop is bounded in time (and in-flight requests in the open loop); requests still in flight
at the end are counted as unfinished, not as errors. Because the machine is shared, each phase
reports the share of the CPUs other processes used meanwhile and the load average.

The critic: --model (a critic folder, models:/..., or NAME@ALIAS in $HARNESSRL_HOME's registry),
else a tiny one trained here by the quickstart pipeline on --train-episodes episodes with
--train-steps steps (~2-4 min on 2 busy cores), or --untrained (random weights, the real MiniLM
encoder: the cost of scoring is the same; for tests).

    python bench/serve.py                                   # ~8-10 min on 2 cores
    python bench/serve.py --model /path/to/critic-folder --duration-s 45 --json serve.json
    python bench/serve.py --untrained --agents 4 --duration-s 3 --warmup-s 1 --open-duration-s 3
"""

# No `from __future__ import annotations`: FastAPI reads the baseline's request model from the
# handler's signature.
import argparse
import asyncio
import gzip
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

CORPUS = "data/twx_test.jsonl.gz"


# ---- the agents' requests -------------------------------------------------------------------------
def load_episodes(n: int | None = None) -> list[dict]:
    raw = resources.files("harnessrl.examples").joinpath(CORPUS).read_bytes()
    eps = [json.loads(line) for line in gzip.decompress(raw).splitlines() if line.strip()]
    return [e for e in eps if e.get("steps")][:n]


def episode_requests(ep: dict, k: int) -> list[dict]:
    """One /v1/score body per step: the state the agent sees before acting and k candidates."""
    steps = ep["steps"]
    pool = list(dict.fromkeys(s["action"] for s in steps))
    out = []
    for t, step in enumerate(steps):
        history = [{"action": steps[i]["action"], "observation": steps[i + 1].get("observation") or ""}
                   for i in range(t)]
        cands = list(dict.fromkeys([step["action"], *(step.get("candidates") or [])]))
        cands += [a for a in pool if a not in cands]
        fill = 0
        while len(cands) < k:  # a short episode: generic commands, as agents propose them
            cands.append(["look around", "inventory", "wait", "task"][fill % 4] + ("" if fill < 4 else f" {fill}"))
            fill += 1
        cands = cands[:k]
        random.Random(f"{ep['episode_id']}:{t}").shuffle(cands)
        out.append({"agent_id": None, "state": {"task": ep.get("task") or "", "history": history,
                                                "observation": step.get("observation") or ""},
                    "candidates": cands})
    return out


class Agent:
    """Walks episodes step by step; a new episode (drawn with its own RNG) after the last step."""

    def __init__(self, i: int, episodes: list[list[dict]], seed: int):
        self.id, self.episodes, self.rng = f"agent-{i}", episodes, random.Random(f"{seed}:{i}")
        self.ep, self.t = self.rng.randrange(len(episodes)), 0

    def next(self) -> dict:
        if self.t >= len(self.episodes[self.ep]):
            self.ep, self.t = self.rng.randrange(len(self.episodes)), 0
        body = {**self.episodes[self.ep][self.t], "agent_id": self.id}
        self.t += 1
        return body


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


# ---- load generator (its own process) -------------------------------------------------------------
async def _load(url: str, mode: str, agents: int, warmup_s: float, duration_s: float, rate: float, k: int,
                seed: int, timeout_s: float, max_in_flight: int) -> dict:
    import httpx

    episodes = [episode_requests(e, k) for e in load_episodes()]
    pool = [Agent(i, episodes, seed) for i in range(agents)]
    lat: list[float] = []
    status: dict[str, int] = {}
    in_window = {"n": 0}
    t0 = time.perf_counter()
    t_meas, t_end = t0 + warmup_s, t0 + warmup_s + duration_s
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:

        async def one(body: dict) -> None:
            start = time.perf_counter()
            try:
                r = await client.post("/v1/score", json=body)
                key = str(r.status_code)
                if r.status_code == 200:
                    json.loads(r.content)["best_index"]  # a well-formed answer
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # timeouts, refused connections, malformed answers
                key = f"error:{type(exc).__name__}"
            end = time.perf_counter()
            # closed loop: every answer that arrives inside the measured window (a request may
            # have been sent during the warm-up); open loop: every request sent inside it
            counted = t_meas <= end <= t_end if mode == "closed" else start >= t_meas
            if counted:
                status[key] = status.get(key, 0) + 1
                if key == "200":
                    lat.append(end - start)
            if t_meas <= end <= t_end:
                in_window["n"] += key == "200"

        async def closed(agent: Agent) -> None:
            while time.perf_counter() < t_end:
                await one(agent.next())

        unfinished = 0
        if mode == "closed":
            tasks = [asyncio.create_task(closed(a)) for a in pool]
            done, pending = await asyncio.wait(tasks, timeout=max(0.0, t_end - time.perf_counter()) + 0.5)
        else:
            tasks, dropped, n = set(), 0, 0
            while True:
                due = t0 + n / rate  # warm-up at the same rate, then the measured part
                if due >= t_end:
                    break
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                tasks = {t for t in tasks if not t.done()}
                if len(tasks) >= max_in_flight:
                    dropped += due >= t_meas
                else:
                    tasks.add(asyncio.create_task(one(pool[n % agents].next())))
                n += 1
            done, pending = await asyncio.wait(tasks, timeout=timeout_s) if tasks else (set(), set())
            if dropped:
                status["client_dropped"] = dropped
        for t in pending:
            t.cancel()
        unfinished = len(pending)
        await asyncio.gather(*pending, return_exceptions=True)
    ok = status.get("200", 0)
    return {"mode": mode, "agents": agents, "rate": rate if mode == "open" else None, "duration_s": duration_s,
            "warmup_s": warmup_s, "requests_ok": ok, "throughput_rps": round(in_window["n"] / duration_s, 2),
            "p50_ms": _ms(percentile(lat, 0.5)), "p99_ms": _ms(percentile(lat, 0.99)),
            "mean_ms": _ms(sum(lat) / len(lat) if lat else None), "status": status, "unfinished": unfinished}


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 1)


def sub_load(args) -> None:
    res = asyncio.run(_load(args.url, args.mode, args.agents, args.warmup_s, args.duration_s, args.rate, args.k,
                            args.seed, args.timeout_s, args.max_in_flight))
    Path(args.out).write_text(json.dumps(res))


# ---- the naive baseline server (its own process) --------------------------------------------------
def sub_baseline(args) -> None:
    import threading

    import torch
    import uvicorn
    from fastapi import FastAPI

    from harnessrl.critic import Critic
    from harnessrl.serving.api import ScoreRequest

    torch.set_num_threads(args.baseline_threads)
    critic = Critic.load(args.model)
    critic.lru.size = 0  # every text encoded again, every request
    lock = threading.Lock()  # Critic is not thread-safe; one request at a time, as one worker would
    app = FastAPI()

    @app.post("/v1/score")
    def score(request: ScoreRequest) -> dict:
        with lock:
            d = critic.decide_scores(critic.score(request.state_value(), request.candidate_texts()))
        return {"scores": d.scores, "best_index": d.best_index, "fallback": d.fallback, "reason": d.reason}

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    uvicorn.run(app, host="127.0.0.1", port=args.port, workers=1, log_level="warning", access_log=False)


# ---- driver ---------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> float:
    import httpx

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy after {timeout_s} s")


def warm_up(url: str, k: int, timeout_s: float) -> float:
    """A few requests one by one before any measured part (first-call costs: threads, allocator)."""
    import httpx

    t0 = time.perf_counter()
    for body in episode_requests(load_episodes(1)[0], k)[:3]:
        httpx.post(url + "/v1/score", json=body, timeout=timeout_s).raise_for_status()
    return time.perf_counter() - t0


def run_load(url: str, mode: str, args, work: Path, duration_s: float, rate: float = 0.0) -> dict:
    """The load generator as a subprocess, inside a CPU monitor of this process tree."""
    from encode import Monitor

    out = work / f"load-{mode}-{time.time_ns()}.json"
    cmd = [sys.executable, __file__, "--sub", "load", "--url", url, "--mode", mode, "--agents", str(args.agents),
           "--warmup-s", str(args.warmup_s), "--duration-s", str(duration_s), "--rate", str(rate),
           "--k", str(args.k), "--seed", str(args.seed), "--timeout-s", str(args.timeout_s),
           "--max-in-flight", str(args.max_in_flight), "--out", str(out)]
    load0 = os.getloadavg()[0]
    with Monitor(memory=False) as mon:
        proc = subprocess.run(cmd, timeout=args.warmup_s + duration_s + 2 * args.timeout_s + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"load generator exited with {proc.returncode}")
    res = json.loads(out.read_text())
    res.update(others_cpu_share=round(mon.others_share, 2), own_cpu_s=round(mon.own_cpu_s, 1),
               loadavg_start=round(load0, 2), loadavg_end=round(os.getloadavg()[0], 2))
    return res


def untrained_critic(path: Path) -> str:
    """A critic folder with random weights and the real MiniLM encoder (what scoring costs)."""
    import torch

    from harnessrl.algorithms.iql import IQLConfig, IQLNetwork
    from harnessrl.encoders import load_encoder
    from harnessrl.features import FEATURE_NAMES
    from harnessrl.config import RenderConfig
    from harnessrl.heads.frozen import FrozenScorer
    from harnessrl.model_card import ModelCard
    from harnessrl.model_files import save_critic

    torch.manual_seed(0)
    _, identity = load_encoder("builtin:all-MiniLM-L6-v2", "cpu", 128)
    cfg = IQLConfig(feature_dim=len(FEATURE_NAMES))
    card = ModelCard(model_name="serve-bench-untrained", head="frozen", head_config=cfg.to_dict(),
                     encoder=json.loads(identity.to_json()), feature_names=list(FEATURE_NAMES),
                     render=RenderConfig(window=3, max_chars=1500, tool_from="first_word"))
    save_critic(path, FrozenScorer(IQLNetwork(cfg)), card)
    return str(path)


def train_critic(args, work: Path) -> str:
    """The quickstart pipeline on the first --train-episodes train episodes, --train-steps steps."""
    from harnessrl.config import load_pipeline
    from harnessrl.jobs.pipeline import run_pipeline
    from harnessrl.ray_runtime import init_ray, shutdown_ray

    lines = gzip.decompress(
        resources.files("harnessrl.examples").joinpath("data/twx_train.jsonl.gz").read_bytes()).splitlines(True)
    subset = work / "twx_train_subset.jsonl"
    subset.write_bytes(b"".join(lines[: args.train_episodes]))
    out = work / "pipeline"
    overrides = [f"output_dir={out}", "serve.enabled=false", "data.heldout=[]", f"data.train=[{subset}]",
                 "registry.model_name=serve-bench-critic", "registry.experiment=serve-bench",
                 f"train.steps={args.train_steps}", f"train.checkpoint_every={args.train_steps}",
                 "train.batch_size=128", "train.log_every=25"]
    init_ray(num_cpus=os.cpu_count())
    try:
        run_pipeline(load_pipeline(ROOT / "pipelines" / "quickstart.yaml", overrides))
    finally:
        shutdown_ray()
    return str(out / "model")


def bench_baseline(args, model: str, work: Path) -> dict:
    port = free_port()
    log = (work / "baseline.log").open("wb")
    proc = subprocess.Popen([sys.executable, __file__, "--sub", "baseline", "--model", model, "--port", str(port),
                             "--baseline-threads", str(args.baseline_threads)], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        started = wait_healthy(url, args.start_timeout_s, proc) + warm_up(url, args.k, args.start_timeout_s)
        print(f"(b) baseline up in {started:.1f} s; closed loop, {args.agents} agents, {args.duration_s} s ...",
              flush=True)
        res = run_load(url, "closed", args, work, args.duration_s)
        res["start_s"] = round(started, 1)
        return res
    finally:
        stop(proc, grace_s=20)


def stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGINT (the server shuts down cleanly), then SIGKILL after `grace_s`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def run_harnessrl_sub(args, model: str, work: Path) -> dict:
    """(a) in a subprocess with its own local Ray: the replica's log lines go to harnessrl.log, not here."""
    out, log = work / "harnessrl.json", work / "harnessrl.log"
    sub_args = json.dumps({**vars(args), "model": model, "work_dir": str(work)})
    budget = args.start_timeout_s + 3 * (args.warmup_s + args.timeout_s) + args.duration_s + args.open_duration_s + 180
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, __file__, "--sub", "harnessrl", "--sub-args", sub_args,
                                 "--out", str(out)], stdout=fh, stderr=subprocess.STDOUT)
        try:
            for line in _follow(log, proc, budget):
                if line.startswith("(a)"):
                    print(line, flush=True)
        finally:
            stop(proc, grace_s=60)
    if proc.returncode != 0 or not out.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"harnessrl run exited with {proc.returncode}; end of {log}:\n{tail}")
    return json.loads(out.read_text())


def _follow(path: Path, proc: subprocess.Popen, budget_s: float):
    """Lines of a growing log until the process exits (at most budget_s)."""
    t0, pos, buf = time.perf_counter(), 0, ""
    while True:
        done = proc.poll() is not None
        with path.open("r", errors="replace") as fh:
            fh.seek(pos)
            chunk = fh.read()
            pos = fh.tell()
        buf += chunk
        *lines, buf = buf.split("\n")
        yield from lines
        if done:
            return
        if time.perf_counter() - t0 > budget_s:
            raise RuntimeError(f"harnessrl run took more than {budget_s:.0f} s")
        time.sleep(0.5)


def bench_harnessrl(args, model: str, work: Path) -> dict:
    import httpx

    from harnessrl.config import ServeConfig
    from harnessrl.ray_runtime import init_ray, shutdown_ray
    from harnessrl.serving import app

    out: dict = {}
    init_ray(num_cpus=os.cpu_count())
    try:
        t0 = time.perf_counter()
        cfg = ServeConfig(model=model, port=free_port(), replicas=args.replicas, max_batch_size=args.max_batch_size,
                          batch_wait_timeout_s=args.batch_wait_s, reload_every_s=0,
                          encoder={"num_cpus": 0.5} if getattr(args, "encoder", False) else None,
                          **({} if getattr(args, "prior_weight", None) is None else {"prior_weight": args.prior_weight}))
        url = app.start(config=cfg)
        wait_healthy(url, args.start_timeout_s)
        warm_up(url, args.k, args.start_timeout_s)
        out["start_s"] = round(time.perf_counter() - t0, 1)
        print(f"(a) harnessrl up in {out['start_s']:.1f} s; closed loop, {args.agents} agents, {args.duration_s} s ...",
              flush=True)
        out["closed"] = run_load(url, "closed", args, work, args.duration_s)
        info = httpx.get(url + "/v1/model", timeout=10).json()
        out["closed"]["embedding_cache"] = info.get("embedding_cache")
        out["prior"] = {"behaviour_prior": info.get("behaviour_prior"), "prior_weight": info.get("prior_weight")}
        prom = httpx.get(url + "/metrics", timeout=10).text
        out["closed"]["batch_size"] = batch_sizes(prom)
        out["closed"]["encoder_cache"] = encoder_cache(prom)
        rate = args.open_fraction * out["closed"]["throughput_rps"]
        if args.open_duration_s > 0 and rate > 0:
            print(f"(a) harnessrl open loop at {rate:.1f} req/s ({args.open_fraction} x closed-loop), "
                  f"{args.open_duration_s} s ...", flush=True)
            out["open"] = run_load(url, "open", args, work, args.open_duration_s, rate)
            out["open"]["embedding_cache"] = httpx.get(url + "/v1/model", timeout=10).json().get("embedding_cache")
    finally:
        try:
            app.stop()
        finally:
            shutdown_ray()
    return out


def batch_sizes(prom: str) -> dict | None:
    """Mean batch size of /v1/score from the replica's Prometheus histogram."""
    total = count = None
    for line in prom.splitlines():
        if line.startswith("#") or "batch_size" not in line or "/v1/score" not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.split("{")[0].endswith("_sum"):
            total = float(value)
        elif name.split("{")[0].endswith("_count"):
            count = float(value)
    return {"batches": int(count), "mean": round(total / count, 1)} if count else None


def encoder_cache(prom: str) -> dict | None:
    """The encoder deployment's LRU figures (encoder mode only)."""
    found = {}
    for line in prom.splitlines():
        if line.startswith("harnessrl_encoder_cache_"):
            name, value = line.rsplit(" ", 1)
            found[name.removeprefix("harnessrl_encoder_cache_").removesuffix("_total")] = int(float(value))
    return found or None


def print_report(out: dict) -> None:
    a, b = out["harnessrl"], out["baseline"]
    rows = [("(a) harnessrl, closed loop", a["closed"]), ("(b) baseline, closed loop", b)]
    if "open" in a:
        rows.insert(1, (f"(a) harnessrl, open loop {a['open']['rate']:.1f}/s", a["open"]))
    print()
    print(f"{out['agents']} agents, K={out['k']} candidates, corpus {CORPUS} ({out['episodes']} episodes, "
          f"{out['distinct_texts']} distinct state+candidate texts); model {out['model']}; {out['cpus']} CPUs; "
          f"harnessrl encoder: {'a deployment of its own' if out.get('encoder') else 'inline'}; behaviour prior: "
          f"{a.get('prior')}")
    print(f"{'system':34s} {'ok':>6s} {'req/s':>7s} {'p50 ms':>8s} {'p99 ms':>8s} {'status':24s} {'unfin':>5s} "
          f"{'others CPU':>10s} {'load avg':>10s}")
    for name, r in rows:
        st = ",".join(f"{k}:{v}" for k, v in sorted(r["status"].items()))
        print(f"{name:34s} {r['requests_ok']:6d} {r['throughput_rps']:7.2f} {r['p50_ms'] or 0:8.0f} "
              f"{r['p99_ms'] or 0:8.0f} {st:24s} {r['unfinished']:5d} {r['others_cpu_share']:9.0%} "
              f"{r['loadavg_start']:4.1f}-{r['loadavg_end']:<4.1f}")
    c = a["closed"]
    if c.get("embedding_cache"):
        ec = c["embedding_cache"]
        print(f"harnessrl embedding cache after the closed loop: {ec}; /v1/score batches: {c.get('batch_size')}")
    if c.get("encoder_cache"):
        print(f"encoder deployment's cache after the closed loop: {c['encoder_cache']}")
    ratio = c["throughput_rps"] / b["throughput_rps"] if b["throughput_rps"] else float("nan")
    lower_p99 = c["p99_ms"] is not None and b["p99_ms"] is not None and c["p99_ms"] < b["p99_ms"]
    out["ratio_throughput"] = round(ratio, 2)
    # the machine is shared: the same ratio per share of the CPUs other processes left to each run
    left_a, left_b = 1 - c["others_cpu_share"], 1 - b["others_cpu_share"]
    norm = ratio * left_b / left_a if left_a > 0 and left_b > 0 and b["throughput_rps"] else float("nan")
    out["ratio_throughput_cpu_left"] = round(norm, 2)
    out["target_met"] = bool(ratio >= 5 and lower_p99)
    print(f"throughput (a)/(b): {ratio:.2f}x; p99 (a) {c['p99_ms']} ms vs (b) {b['p99_ms']} ms "
          f"(target: >= 5x with a lower p99: {'met' if out['target_met'] else 'NOT met'})")
    print(f"throughput (a)/(b) per share of the CPUs left by other processes: {norm:.2f}x "
          f"({left_a:.0%} vs {left_b:.0%} left)")
    if "open" in a:
        print(f"harnessrl p99 at {a['open']['rate']:.1f} req/s ({out['open_fraction']} x saturation): "
              f"{a['open']['p99_ms']} ms (p50 {a['open']['p50_ms']} ms)")
    errors = {k: v for r in (c, b, a.get("open", {"status": {}})) for k, v in r["status"].items()
              if not k.startswith("2")}
    if errors:
        print(f"non-2xx answers and client errors (measured part): {errors}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--duration-s", type=float, default=45, help="measured closed-loop time per system")
    ap.add_argument("--warmup-s", type=float, default=5, help="before each measured part, not counted")
    ap.add_argument("--open-duration-s", type=float, default=30, help="open-loop run of harnessrl (0: skip)")
    ap.add_argument("--open-fraction", type=float, default=0.5, help="open-loop rate / closed-loop throughput")
    ap.add_argument("--k", type=int, default=8, help="candidates per request")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None, help="critic folder, models:/..., or NAME@ALIAS")
    ap.add_argument("--untrained", action="store_true", help="random-weight critic (the real encoder)")
    ap.add_argument("--train-episodes", type=int, default=40)
    ap.add_argument("--train-steps", type=int, default=50)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--encoder", action="store_true",
                    help="(a) with the encoder as a deployment of its own (serve.encoder, 0.5 CPU) instead of inline")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--batch-wait-s", type=float, default=0.01)
    ap.add_argument("--prior-weight", type=float, default=None,
                    help="(a)'s serve prior_weight (default: the service's; 0: no behaviour prior computed)")
    ap.add_argument("--baseline-threads", type=int, default=1,
                    help="torch threads of (b) (default 1, as a harnessrl replica)")
    ap.add_argument("--timeout-s", type=float, default=30, help="per request")
    ap.add_argument("--max-in-flight", type=int, default=512, help="open loop: beyond, arrivals are dropped")
    ap.add_argument("--start-timeout-s", type=float, default=180)
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sub", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--url", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="closed", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sub-args", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sub == "load":
        return sub_load(args)
    if args.sub == "baseline":
        return sub_baseline(args)
    if args.sub == "harnessrl":
        ns = argparse.Namespace(**json.loads(args.sub_args))
        res = bench_harnessrl(ns, ns.model, Path(ns.work_dir))
        Path(args.out).write_text(json.dumps(res))
        return

    t_start = time.perf_counter()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="harnessrl-bench-serve-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HARNESSRL_HOME", str(work / "home"))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.model:
        from harnessrl import registry

        model = str(Path(args.model).resolve()) if Path(args.model).exists() else registry.model_uri(args.model)
    elif args.untrained:
        model = untrained_critic(work / "untrained-critic")
    else:
        print(f"training a tiny critic ({args.train_episodes} episodes, {args.train_steps} steps) ...", flush=True)
        t0 = time.perf_counter()
        model = train_critic(args, work)
        print(f"  done in {time.perf_counter() - t0:.0f} s: {model}", flush=True)
    episodes = load_episodes()
    reqs = [r for e in episodes for r in episode_requests(e, args.k)]
    distinct = {json.dumps(r["state"], sort_keys=True) for r in reqs} | {c for r in reqs for c in r["candidates"]}
    out: dict = {"agents": args.agents, "k": args.k, "duration_s": args.duration_s, "warmup_s": args.warmup_s,
                 "open_fraction": args.open_fraction, "model": model, "cpus": os.cpu_count(),
                 "episodes": len(episodes), "steps": len(reqs), "distinct_texts": len(distinct),
                 "baseline_threads": args.baseline_threads, "replicas": args.replicas, "encoder": args.encoder,
                 "max_batch_size": args.max_batch_size, "batch_wait_s": args.batch_wait_s, "argv": sys.argv[1:]}
    out["baseline"] = bench_baseline(args, model, work)
    out["harnessrl"] = run_harnessrl_sub(args, model, work)
    out["total_s"] = round(time.perf_counter() - t_start, 1)
    print_report(out)
    print(f"total {out['total_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    print("BENCH_JSON " + json.dumps(out), flush=True)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
