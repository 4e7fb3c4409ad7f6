"""Gradient steps/s of our IQL update against d3rlpy 2.8's IQL on identical inputs (issue 3).

"Ours" is one step of what training runs by default: `IQLLearner.update` (twin Q over [s, a] +
V, the critic) plus `DiscreteLearner.update` with method awr (the AWR actor over the tool
vocabulary, weighted by the critic's advantage) on the same minibatch: IQL's critic and actor,
as d3rlpy's IQL step is its twin Q + V + Gaussian AWR actor. Two variants are timed beside it:
`train.precision: bfloat16` (opt-in; `bf16` is the same name) and `train.tool_head: iql` (the tool head with a discrete twin
Q + V of its own, what training ran before awr became the default).
Both use 256x2 MLPs with LayerNorm, observation 768, action 384, batch 256, Adam, the same
synthetic data (seeded) and the same number of torch threads.

Methods timed in process, interleaved in rounds:
  ours                      sample indices from in-memory tensors + the two updates (like fit())
  ours, update only         the two updates on pre-sampled batches (pure compute)
  ours, bf16                as "ours", forward passes under bfloat16 autocast
  ours, tool_head=iql       as "ours", with the discrete-IQL tool head
  d3rlpy fit()              one timed `fit(n_steps=...)` call per round, nothing subtracted
  d3rlpy update()           `algo.update(batch)` on pre-sampled batches (pure compute)
and, unless --skip-ray, in a Ray Train worker (TorchTrainer, 1 worker) over a ray.data dataset
with the columns the encode stage writes, interleaved in rounds there:
  ray worker: update only   pure compute in the worker (the reference for the two data paths)
  ray shard: load+sample    iter_batches(pyarrow) -> tensors once (load time reported), then
                            sample indices each step, as jobs/train.py does
  ray shard: streaming      each step's batch straight from iter_torch_batches(batch_size)

Noise: each block also measures how much of the CPUs other processes used meanwhile; each round
first waits (bounded) for a quiet moment, and figures are medians over the quiet rounds (all
rounds if none was), ratios medians of per-round ratios. Every loop is bounded in steps and in
seconds (--max-block-s, --wait-quiet-s). Ray binds to 127.0.0.1.

    python bench/train.py                      # ~2 min on 2 quiet cores (longer when busy)
    python bench/train.py --skip-ray --rounds 5 --json /tmp/train-bench.json
    python bench/train.py --device cuda        # ours and d3rlpy on the GPU
    python bench/train.py --profile            # where our update spends its time
    python bench/train.py --scale              # the train job at 100k and 1M transitions (bench/train_scale.py)

d3rlpy is not a project dependency; install it without touching torch (see bench/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

OBS_DIM, ACT_DIM, HIDDEN = 768, 384, 256
EPISODE_LEN = 20


# ---- data ---------------------------------------------------------------------------------
def make_data(n: int, n_tools: int, seed: int) -> dict[str, np.ndarray]:
    """Synthetic transitions in episodes of EPISODE_LEN steps: unit-norm 'embeddings' (so the
    action entries lie in [-1, 1]), next state = the next row of the episode, zeros after the
    terminal step (what d3rlpy's MDPDataset builds from the same rows)."""
    n = max(EPISODE_LEN, n - n % EPISODE_LEN)
    rng = np.random.default_rng(seed)

    def unit(shape):
        x = rng.standard_normal(shape).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    obs, act = unit((n, OBS_DIM)), unit((n, ACT_DIM))
    done = np.zeros(n, np.float32)
    done[EPISODE_LEN - 1::EPISODE_LEN] = 1.0
    nxt = np.zeros_like(obs)
    nxt[:-1] = obs[1:]
    nxt[done == 1.0] = 0.0
    return {
        "state_emb": obs, "action_emb": act, "next_state_emb": nxt,
        "reward": (rng.standard_normal(n) * 0.1).astype(np.float32), "done": done,
        "tool_id": rng.integers(0, n_tools, n).astype(np.int64),
    }


def make_learners(n_tools: int, device: str, tool_head: str = "awr", bf16: bool = False):
    """The two learners as jobs/train.py builds them (defaults: TrainConfig's)."""
    from harnessrl.algorithms.discrete import DiscreteConfig, DiscreteLearner
    from harnessrl.algorithms.iql import IQLConfig, IQLLearner

    critic = IQLLearner(IQLConfig(state_dim=OBS_DIM, action_dim=ACT_DIM, hidden_dim=HIDDEN, bf16=bf16), device=device)
    head = DiscreteLearner(DiscreteConfig(state_dim=OBS_DIM, n_actions=n_tools, hidden_dim=HIDDEN, method=tool_head,
                                          bf16=bf16), device=device)
    return critic, head


def ours_update(critic, head, b: dict) -> None:
    """One step of ours: the critic, then the tool head on the same batch (as jobs/train.py)."""
    critic.update(b["state_emb"], b["action_emb"], b["reward"], b["next_state_emb"], b["done"])
    head.update(b["state_emb"], b["tool_id"], b["reward"], b["next_state_emb"], b["done"], adv=critic.advantage)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def machine_busy_s() -> float:
    """CPU seconds all processes have used since boot (Linux /proc/stat; 0 elsewhere)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return 0.0
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


class Meter:
    """Wall time, this process's CPU time, and the share of the machine's CPUs that *other*
    processes used meanwhile ("foreign"): with 2 cores and 2 torch threads, any of it stalls
    every parallel region, so a block with foreign load says little about either method."""

    def __init__(self):
        self.t0, self.c0, self.b0 = time.perf_counter(), time.process_time(), machine_busy_s()

    def read(self) -> tuple[float, float, float]:
        wall, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
        foreign = max(0.0, machine_busy_s() - self.b0 - cpu) / (max(wall, 1e-9) * (os.cpu_count() or 1))
        return wall, cpu, min(foreign, 1.0)


def wait_quiet(max_wait_s: float, threshold: float) -> float:
    """Wait (at most max_wait_s) for a half-second in which other processes use under
    `threshold` of the CPUs; returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_wait_s:
        m = Meter()
        time.sleep(0.5)
        if m.read()[2] < threshold:
            break
    return time.perf_counter() - t0


def timed_block(step: Callable[[], None], steps: int, max_s: float, device: str) -> tuple[int, float, float, float]:
    """Run up to `steps` steps, stopping early after `max_s` seconds: (steps done, wall seconds,
    CPU seconds of this process, foreign CPU share; see Meter)."""
    sync(device)
    m = Meter()
    done = 0
    while done < steps:
        step()
        done += 1
        if time.perf_counter() - m.t0 > max_s:
            break
    sync(device)
    return (done, *m.read())


# ---- our path, in process ------------------------------------------------------------------
class Ours:
    def __init__(self, data: dict[str, np.ndarray], args, tool_head: str = "awr", bf16: bool = False):
        import torch

        self.device, self.batch = args.device, args.batch
        self.t = {k: torch.from_numpy(v).to(args.device) for k, v in data.items()}
        self.n = len(data["reward"])
        torch.manual_seed(args.seed)
        self.critic, self.head = make_learners(args.n_tools, args.device, tool_head, bf16)
        self.gen = torch.Generator(device=args.device).manual_seed(args.seed)
        # Pre-sampled batches for the update-only figure (cycled).
        self.pool = [self.sample() for _ in range(16)]
        self.i = 0
        self.parts = {"critic": 0.0, "tool_head": 0.0, "steps": 0}
        self.block_parts: list[dict[str, float]] = []  # per timed block of step()

    def block(self, steps: int, max_s: float) -> tuple[int, float, float, float]:
        self.parts = {"critic": 0.0, "tool_head": 0.0, "steps": 0}
        out = timed_block(self.step, steps, max_s, self.device)
        self.block_parts.append(dict(self.parts))
        return out

    def sample(self) -> dict:
        import torch

        idx = torch.randint(self.n, (self.batch,), generator=self.gen, device=self.device)
        return {k: v[idx] for k, v in self.t.items()}

    def step(self) -> None:
        b = self.sample()
        t0 = time.perf_counter()
        self.critic.update(b["state_emb"], b["action_emb"], b["reward"], b["next_state_emb"], b["done"])
        t1 = time.perf_counter()  # update() ends in .item() calls: the device is synced here
        self.head.update(b["state_emb"], b["tool_id"], b["reward"], b["next_state_emb"], b["done"],
                         adv=self.critic.advantage)
        t2 = time.perf_counter()
        self.parts["critic"] += t1 - t0
        self.parts["tool_head"] += t2 - t1
        self.parts["steps"] += 1

    def step_update_only(self) -> None:
        self.i += 1
        ours_update(self.critic, self.head, self.pool[self.i % len(self.pool)])


# ---- d3rlpy ---------------------------------------------------------------------------------
class _Stop(Exception):
    pass


class D3:
    def __init__(self, data: dict[str, np.ndarray], args):
        import structlog

        # d3rlpy logs every fit() call through structlog (INFO parameters, WARNING "skip building").
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
        with contextlib.redirect_stderr(io.StringIO()):  # gym's "unmaintained" banner on import
            import d3rlpy
        from d3rlpy.logging import NoopAdapterFactory
        from d3rlpy.models.encoders import VectorEncoderFactory
        from harnessrl.algorithms.iql import IQLConfig as OurIQL

        self.version = d3rlpy.__version__
        d3rlpy.seed(args.seed)
        self.dataset = d3rlpy.dataset.MDPDataset(
            observations=data["state_emb"], actions=data["action_emb"], rewards=data["reward"],
            terminals=data["done"], action_space=d3rlpy.ActionSpace.CONTINUOUS)
        enc = VectorEncoderFactory(hidden_units=[HIDDEN, HIDDEN], use_layer_norm=True)  # = our mlp()
        ours = OurIQL()
        self.algo = d3rlpy.algos.IQLConfig(
            batch_size=args.batch, gamma=ours.gamma, tau=ours.polyak, expectile=ours.expectile,
            actor_encoder_factory=enc, critic_encoder_factory=enc, value_encoder_factory=enc,
        ).create(device="cuda:0" if args.device.startswith("cuda") else "cpu:0")
        self.algo.build_with_dataset(self.dataset)
        self.noop = NoopAdapterFactory()
        self.device, self.max_s = args.device, args.max_block_s
        self.pool = [self.dataset.sample_transition_batch(args.batch) for _ in range(16)]
        self.i = 0

    def fit_block(self, steps: int) -> tuple[int, float, float, float]:
        """One fit(n_steps=steps) call, timed whole; stopped by its callback after max_s."""
        done = [0]

        def callback(algo, epoch, total_step):
            done[0] = total_step
            if time.perf_counter() - t0 > self.max_s:
                raise _Stop

        sync(self.device)
        m = Meter()
        t0 = m.t0
        try:
            self.algo.fit(self.dataset, n_steps=steps, n_steps_per_epoch=steps, show_progress=False,
                          logger_adapter=self.noop, save_interval=10**9, with_timestamp=False,
                          experiment_name="bench", callback=callback)
        except _Stop:
            pass
        sync(self.device)
        return (done[0], *m.read())

    def step_update_only(self) -> None:
        self.i += 1
        self.algo.update(self.pool[self.i % len(self.pool)])


# ---- our path on Ray Train --------------------------------------------------------------------
def _matrix(column) -> np.ndarray:
    """fixed_size_list<float>[d] -> (n, d) float32 (as jobs/train.py reads its shard)."""
    arr = column.combine_chunks()
    return arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(arr), arr.type.list_size)


def _ray_loop(config: dict[str, Any]) -> None:
    """The Ray Train worker: load-then-sample and streaming, interleaved in rounds."""
    import ray.train
    import torch

    torch.set_num_threads(config["threads"])
    torch.manual_seed(config["seed"])
    device = config["device"]
    if device.startswith("cuda"):
        import ray.train.torch

        device = str(ray.train.torch.get_device())
    max_s, steps, batch = config["max_block_s"], config["steps"], config["batch"]
    shard = ray.train.get_dataset_shard("train")

    # (a) what jobs/train.py does: the whole shard into memory once, then sample each step.
    t0 = time.perf_counter()
    parts: dict[str, list[np.ndarray]] = {k: [] for k in config["columns"]}
    for b in shard.iter_batches(batch_size=4096, batch_format="pyarrow"):
        for k in ("state_emb", "action_emb", "next_state_emb"):
            parts[k].append(_matrix(b.column(k)))
        for k in ("reward", "done"):
            parts[k].append(b.column(k).to_numpy(zero_copy_only=False).astype(np.float32))
        parts["tool_id"].append(b.column("tool_id").to_numpy(zero_copy_only=False).astype(np.int64))
    t = {k: torch.from_numpy(np.concatenate(v)).to(device) for k, v in parts.items()}
    sync(device)
    load_s = time.perf_counter() - t0
    n = len(t["reward"])
    critic, head = make_learners(config["n_tools"], device)
    gen = torch.Generator(device=device).manual_seed(config["seed"])

    def step_loaded():
        idx = torch.randint(n, (batch,), generator=gen, device=device)
        ours_update(critic, head, {k: v[idx] for k, v in t.items()})

    # (b) each step's batch straight from the shard's iterator; a new epoch when one ends.
    # (The same learners: the update cost does not depend on their weights.)
    epochs = [0]

    def stream():
        while True:
            epochs[0] += 1
            yield from shard.iter_torch_batches(batch_size=batch, drop_last=True, device=device)

    t0 = time.perf_counter()
    it = stream()
    first = next(it)
    first_batch_s = time.perf_counter() - t0
    ours_update(critic, head, first)

    def step_stream():
        ours_update(critic, head, next(it))

    # (c) the pure-compute reference in this same process: pre-sampled batches, no data path.
    pool = [{k: v[torch.randint(n, (batch,), generator=gen, device=device)] for k, v in t.items()} for _ in range(16)]
    i = [0]

    def step_update_only():
        i[0] += 1
        ours_update(critic, head, pool[i[0] % len(pool)])

    for _ in range(config["warmup"]):
        step_loaded()
        step_stream()
        step_update_only()
    blocks: dict[str, list[tuple[int, float, float, float]]] = {"update_only": [], "loaded": [], "stream": []}
    for _ in range(config["rounds"]):
        wait_quiet(config["wait_quiet_s"], config["quiet_threshold"])
        for name, fn in (("update_only", step_update_only), ("loaded", step_loaded), ("stream", step_stream)):
            blocks[name].append(timed_block(fn, steps, max_s, device))
    out = {"load_s": load_s, "rows": n, "first_stream_batch_s": first_batch_s,
           "stream_epochs_started": epochs[0], "device": device, "worker_threads": torch.get_num_threads(),
           "worker_niceness": os.nice(0), "blocks": blocks}
    # Ray Train V2 keeps no metrics of a report without a checkpoint in the Result: a file on
    # this (single) machine carries the figures back.
    with open(config["result_path"], "w") as f:
        json.dump(out, f)
    ray.train.report({"load_s": load_s})


def run_ray(data: dict[str, np.ndarray], args) -> dict[str, Any]:
    import pyarrow as pa
    from harnessrl.ray_runtime import init_ray, shutdown_ray

    # Ray starts its workers at nice 15: on a shared machine the worker then loses the CPUs to
    # every other process while the in-process figures above ran at nice 0. Same footing here.
    os.environ.setdefault("RAY_worker_niceness", "0")
    t_start = time.perf_counter()
    init_ray(num_cpus=args.ray_cpus)
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    init_s = time.perf_counter() - t_start
    n = len(data["reward"])

    def col(v: np.ndarray):
        if v.ndim == 2:
            return pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1])
        return pa.array(v)

    blocks = 8
    bounds = np.linspace(0, n, blocks + 1).astype(int)
    tables = [pa.table({k: col(v[lo:hi]) for k, v in data.items()}) for lo, hi in itertools.pairwise(bounds)]
    ds = ray.data.from_arrow(tables).materialize()  # in the object store; see the 2-CPU deadlock note
    storage = tempfile.mkdtemp(prefix="bench-train-ray-")
    use_gpu = args.device.startswith("cuda")
    try:
        trainer = TorchTrainer(
            _ray_loop,
            train_loop_config={
                "threads": args.threads, "seed": args.seed, "device": args.device, "n_tools": args.n_tools,
                "batch": args.batch, "steps": args.steps, "rounds": args.rounds, "warmup": args.warmup,
                "max_block_s": args.max_block_s, "columns": list(data),
                "result_path": os.path.join(storage, "result.json"),
                "wait_quiet_s": args.wait_quiet_s, "quiet_threshold": args.quiet_threshold,
            },
            scaling_config=ScalingConfig(num_workers=1, use_gpu=use_gpu,
                                         resources_per_worker={"CPU": 1, **({"GPU": 1} if use_gpu else {})}),
            run_config=RunConfig(name=f"bench-train-{uuid.uuid4().hex[:8]}", storage_path=storage),
            datasets={"train": ds},
        )
        t0 = time.perf_counter()
        result = trainer.fit()
        fit_s = time.perf_counter() - t0
        if result.error:
            raise RuntimeError(f"the Ray Train run failed: {result.error}")
        with open(os.path.join(storage, "result.json")) as f:
            m = json.load(f)
    finally:
        shutil.rmtree(storage, ignore_errors=True)
        shutdown_ray()
    return {"init_s": init_s, "trainer_fit_s": fit_s, **m}


# ---- profile ------------------------------------------------------------------------------
def profile_ours(ours: Ours, steps: int, wait_s: float, threshold: float) -> dict[str, float]:
    """torch.profiler over `steps` of our update: top ops, and self time grouped by kind. Up to
    three tries, each after waiting for quiet: a profile taken while other processes hold the
    cores shows mostly where threads waited for each other."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ours.device.startswith("cuda") else [])
    for _ in range(3):
        wait_quiet(wait_s, threshold)
        m = Meter()
        with profile(activities=acts) as prof:
            for _ in range(steps):
                ours.step_update_only()
        wall, _, foreign = m.read()
        if foreign < threshold:
            break
    print(f"profile: {steps} steps of ours (update only), {1000 * wall / steps:.1f} ms/step under the profiler; "
          f"other processes used {foreign:.0%} of the CPUs")
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=45))
    groups = {"matmul (addmm/mm)": ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear"),
              "layer_norm (fwd+bwd)": ("aten::native_layer_norm", "aten::native_layer_norm_backward"),
              "index (batch gather)": ("aten::index",)}
    total = sum(e.self_cpu_time_total for e in events)
    out = {k: sum(e.self_cpu_time_total for e in events if e.key in names) / total for k, names in groups.items()}
    adam = next((e for e in events if e.key.startswith("Optimizer.step#")), None)
    if adam is not None:  # inclusive time of the optimiser step (its own ops are counted there)
        out["Adam.step (inclusive)"] = adam.cpu_time_total / total
    item = next((e for e in events if e.key == "aten::item"), None)
    out["aten::item calls/step"] = (item.count / steps) if item else 0.0
    print("share of self CPU time: " + ", ".join(f"{k} {v:.0%}" if "calls" not in k else f"{k} {v:.0f}"
                                                 for k, v in out.items()))
    return out


def summarise(blocks: dict[str, list[tuple[int, float, float, float]]], threshold: float) -> list[dict[str, Any]]:
    """Per method: median and best steps/s over rounds, CPU ms/step, ratios to d3rlpy fit() and
    (Ray data paths) to the pure-compute rate in the same worker, each from blocks run side by side.

    Only "quiet" rounds count, those in which other processes used under `threshold` of the CPUs
    in every block of the round (all rounds when none was quiet; `quiet_rounds` says which)."""
    def quiet_rounds(names: list[str]) -> list[int]:
        n = len(blocks[names[0]])
        return [i for i in range(n) if all(blocks[k][i][3] < threshold for k in names)]

    groups = [[k for k in blocks if not k.startswith("ray")], [k for k in blocks if k.startswith("ray")]]
    quiet = {k: quiet_rounds(g) for g in groups if g for k in g}
    keep = {k: v or list(range(len(blocks[k]))) for k, v in quiet.items()}
    blocks = {k: [v[i] for i in keep[k]] for k, v in blocks.items()}
    rates = {k: [b[0] / b[1] for b in v] for k, v in blocks.items()}

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(rates[a], rates[b]))

    base = "d3rlpy fit()" if "d3rlpy fit()" in rates else None
    rows = []
    for name, rs in rates.items():
        med = statistics.median(rs)
        row = {"method": name, "steps_per_s": med, "ms_per_step": 1000.0 / med, "best_steps_per_s": max(rs),
               "cpu_ms_per_step": 1000.0 * sum(b[2] for b in blocks[name]) / sum(b[0] for b in blocks[name]),
               "foreign_cpu_share_max": max(b[3] for b in blocks[name]), "quiet_rounds": quiet[name],
               "rounds_steps_per_s": rs, "ratio_vs_d3rlpy_fit": None, "ratio_best_vs_d3rlpy_fit_best": None}
        if base:
            in_process = not name.startswith("ray")  # the Ray run comes after the in-process rounds
            row["ratio_vs_d3rlpy_fit"] = paired(name, base) if in_process else med / statistics.median(rates[base])
            row["ratio_best_vs_d3rlpy_fit_best"] = max(rs) / max(rates[base])
        if name.startswith("ray shard"):  # "loading must not halve the pure-compute rate"
            row["ratio_vs_worker_update_only"] = paired(name, "ray worker: update only")
        rows.append(row)
    return rows


# ---- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--scale" in argv:  # the train job at 100k and 1M transitions (issue 26): bench/train_scale.py
        from train_scale import main as scale

        return scale([a for a in argv if a != "--scale"])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30, help="timed steps per method per round")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (figures are medians)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per method first")
    p.add_argument("--max-block-s", type=float, default=20.0, help="a timed block stops after this many seconds")
    p.add_argument("--n", type=int, default=20_000, help="transitions in the synthetic data")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--n-tools", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for every method")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ray-cpus", type=int, default=2, help="num_cpus of the local Ray instance")
    p.add_argument("--wait-quiet-s", type=float, default=5.0,
                   help="before each round wait up to this long for other processes to go quiet")
    p.add_argument("--quiet-threshold", type=float, default=0.10,
                   help="a round is quiet when other processes use less than this share of the CPUs")
    p.add_argument("--skip-ray", action="store_true")
    p.add_argument("--skip-d3rlpy", action="store_true")
    p.add_argument("--profile", action="store_true", help="profile our update (torch.profiler) at the end")
    p.add_argument("--json", help="write the figures here as JSON")
    args = p.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no GPU")
    torch.set_num_threads(args.threads)
    data = make_data(args.n, args.n_tools, args.seed)
    n = len(data["reward"])
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": args.device,
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
            "cpu_count": os.cpu_count(), "machine": platform.processor() or platform.machine(),
            "python": platform.python_version(), "n": n, "batch": args.batch, "obs_dim": OBS_DIM,
            "act_dim": ACT_DIM, "hidden": [HIDDEN, HIDDEN], "n_tools": args.n_tools, "rounds": args.rounds,
            "steps_per_round": args.steps, "warmup": args.warmup, "d3rlpy": None}
    print(f"bench/train.py: n={n} batch={args.batch} obs={OBS_DIM} act={ACT_DIM} hidden=2x{HIDDEN} "
          f"tools={args.n_tools} device={args.device} torch {torch.__version__} threads={torch.get_num_threads()} "
          f"rounds={args.rounds}x{args.steps} steps", flush=True)

    ours = Ours(data, args)
    variants = {"ours, bf16": Ours(data, args, bf16=True), "ours, tool_head=iql": Ours(data, args, tool_head="iql")}
    methods: dict[str, Callable[[], tuple[int, float, float, float]]] = {
        "ours": lambda: ours.block(args.steps, args.max_block_s),
        "ours, update only": lambda: timed_block(ours.step_update_only, args.steps, args.max_block_s, args.device),
    }
    for name, v in variants.items():
        methods[name] = lambda v=v: timed_block(v.step, args.steps, args.max_block_s, args.device)
    for _ in range(args.warmup):
        ours.step()
        ours.step_update_only()
        for v in variants.values():
            v.step()
    if not args.skip_d3rlpy:
        try:
            d3 = D3(data, args)
        except ImportError as e:
            print(f"d3rlpy is not installed ({e}); see bench/README.md, or pass --skip-d3rlpy", file=sys.stderr)
            return 2
        meta["d3rlpy"] = d3.version
        d3.fit_block(args.warmup)
        for _ in range(args.warmup):
            d3.step_update_only()
        methods["d3rlpy fit()"] = lambda: d3.fit_block(args.steps)
        methods["d3rlpy update()"] = lambda: timed_block(d3.step_update_only, args.steps, args.max_block_s,
                                                         args.device)

    load_start = os.getloadavg()
    blocks: dict[str, list[tuple[int, float, float, float]]] = {k: [] for k in methods}
    for r in range(args.rounds):
        waited = wait_quiet(args.wait_quiet_s, args.quiet_threshold)
        for name, fn in methods.items():
            blocks[name].append(fn())
        print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1][0] / v[-1][1]:.1f}" for k, v in blocks.items())
              + f" steps/s; other processes used {max(v[-1][3] for v in blocks.values()):.0%} of the CPUs"
              + (f" (waited {waited:.0f} s for quiet)" if waited > 1 else ""), flush=True)

    ray_res = None
    if not args.skip_ray:
        print("  Ray Train run (1 worker) ...", flush=True)
        ray_res = run_ray(data, args)
        for name, key in (("ray worker: update only", "update_only"), ("ray shard: load+sample", "loaded"),
                          ("ray shard: streaming", "stream")):
            blocks[name] = [tuple(b) for b in ray_res["blocks"][key]]
    meta["loadavg_start"], meta["loadavg_end"] = load_start, os.getloadavg()

    rows = summarise(blocks, args.quiet_threshold)
    print()
    print(f"{'method':<26} {'steps/s':>8} {'ms/step':>8} {'best':>7} {'cpu ms/step':>12} {'vs d3rlpy fit()':>16} "
          f"{'(best/best)':>12}")
    for row in rows:
        ratio, best = row["ratio_vs_d3rlpy_fit"], row["ratio_best_vs_d3rlpy_fit_best"]
        print(f"{row['method']:<26} {row['steps_per_s']:>8.1f} {row['ms_per_step']:>8.1f} "
              f"{row['best_steps_per_s']:>7.1f} {row['cpu_ms_per_step']:>12.1f} "
              f"{f'{ratio:.2f}x' if ratio is not None else '-':>16} {f'{best:.2f}x' if best is not None else '-':>12}")
    def which(q: list[int]) -> str:
        return str(q) if q else "none: ALL rounds used, figures unreliable"

    print(f"(medians over the quiet rounds of {args.rounds}: in process {which(rows[0]['quiet_rounds'])}"
          + (f", Ray {which(rows[-1]['quiet_rounds'])}" if ray_res else "")
          + f"; ratios: median of per-round ratios of methods timed side by side, else of medians; "
          f"load average {load_start[0]:.1f} at start, {meta['loadavg_end'][0]:.1f} at end)")
    quiet = next(r for r in rows if r["method"] == "ours")["quiet_rounds"] or range(args.rounds)
    parts = {k: sum(ours.block_parts[i][k] for i in quiet) for k in ("critic", "tool_head", "steps")}
    if parts["steps"]:
        print(f"ours per step: critic (IQLLearner.update) {1000 * parts['critic'] / parts['steps']:.1f} ms + "
              f"tool head (DiscreteLearner.update, awr: the actor) "
              f"{1000 * parts['tool_head'] / parts['steps']:.1f} ms")
    if ray_res:
        by = {r["method"]: r for r in rows}
        loaded, stream = by["ray shard: load+sample"], by["ray shard: streaming"]
        print(f"ray: load of {ray_res['rows']} rows (iter_batches -> tensors) {ray_res['load_s']:.2f} s; "
              f"first streamed batch {ray_res['first_stream_batch_s']:.2f} s; init {ray_res['init_s']:.1f} s, "
              f"trainer.fit {ray_res['trainer_fit_s']:.1f} s; worker threads {ray_res['worker_threads']}, "
              f"nice {ray_res['worker_niceness']}")
        print(f"ray data path vs pure compute in the same worker: load+sample {loaded['ratio_vs_worker_update_only']:.2f}x, "
              f"streaming {stream['ratio_vs_worker_update_only']:.2f}x "
              f"(faster: {'load+sample' if loaded['steps_per_s'] >= stream['steps_per_s'] else 'streaming'})")
    ours_row = next(r for r in rows if r["method"] == "ours")
    if ours_row["ratio_vs_d3rlpy_fit"] is not None:
        verdict = "meets it" if ours_row["ratio_vs_d3rlpy_fit"] >= 1.5 else "misses it"
        if not ours_row["quiet_rounds"]:
            verdict = "no quiet round: no verdict, rerun when the machine is idle"
        print(f"target >= 1.5x d3rlpy fit(): ours is {ours_row['ratio_vs_d3rlpy_fit']:.2f}x ({verdict})")

    prof = profile_ours(ours, min(args.steps, 30), args.wait_quiet_s, args.quiet_threshold) if args.profile else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": rows,
                       "ray": {k: v for k, v in ray_res.items() if k != "blocks"} if ray_res else None,
                       "ours_ms": {k: 1000 * v / max(parts["steps"], 1) for k, v in parts.items() if k != "steps"},
                       "profile_share": prof}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
