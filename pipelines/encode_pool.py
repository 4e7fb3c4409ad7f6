"""Where the encode stage's encoder actors run: pool size, CPU/GPU share and threads per actor,
planned from the configuration and the cluster's resources, node by node."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harnessrl.config import EncoderConfig
from harnessrl.errors import ConfigError
from harnessrl.precision import half_weights

TASK_CPUS = 0.5  # the stage's own tasks (scan, cache finish, attach)
ACTOR_MEMORY = 1 << 30  # per encoder actor, for sizing the pool (MiniLM on CPU measured ~650 MB)


@dataclass(frozen=True)
class PoolPlan:
    """Where the encoder actors run; computed from the configuration and the cluster's resources."""

    min_actors: int
    max_actors: int
    cpus_per_actor: float
    gpus_per_actor: float
    threads: int
    device: str
    half: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    def map_kwargs(self, block_texts: int) -> dict:
        """The `map_batches` arguments that place the actor pool: each call gets one block (of at
        most `block_texts` texts); Ray Data refuses GPU actors without an explicit batch size, so
        GPU pools get `block_texts` (small blocks are then bundled up to it)."""
        import ray

        # (Ray Data places pool actors with its default SPREAD strategy: on a cluster the encoders go
        # to different nodes before doubling up; tests/test_cluster_jobs.py checks it.)
        kwargs: dict = {"compute": ray.data.ActorPoolStrategy(min_size=self.min_actors, max_size=self.max_actors),
                        "num_cpus": self.cpus_per_actor, "batch_size": None}
        if self.gpus_per_actor:
            kwargs.update(num_gpus=self.gpus_per_actor, batch_size=block_texts)
        return kwargs


def cpu_budget(cpus: float) -> float:
    """CPUs the encoder actors may reserve on a node of `cpus` CPUs: all but one, which the
    stage's read, map and write tasks need (Ray Data's ListFiles and read tasks take 1 CPU: a
    pool that leaves less on every node starves them and hangs, e.g. two 1-CPU actors on 2
    CPUs, or 1.25-CPU actors on 2-CPU nodes), and at least half."""
    return max(cpus - 1.0, cpus / 2.0)


def _node_list(resources: dict, node_cpus: float | None, nodes: list[dict] | None) -> list[tuple[float, float]]:
    """(CPUs, GPUs) per node: from `nodes` (per-node resource dicts, as `ray.nodes()` gives),
    else `resources` split into nodes of `node_cpus` CPUs, else one node."""
    if nodes:
        found = [(float(n.get("CPU", 0)), float(n.get("GPU", 0))) for n in nodes]
        found = [n for n in found if n[0] > 0]
        if found:
            return found
    cpus, gpus = float(resources.get("CPU", 0)), float(resources.get("GPU", 0))
    if node_cpus and 0 < node_cpus < cpus:
        k = max(1, round(cpus / node_cpus))
        return [(cpus / k, gpus / k)] * k
    return [(cpus, gpus)]


def plan_pool(cfg: EncoderConfig, resources: dict, node_cpus: float | None = None, max_blocks: int | None = None,
              actor_memory: float = ACTOR_MEMORY, nodes: list[dict] | None = None) -> PoolPlan:
    """Actor pool size, CPU share and device that fit `resources` (`ray.cluster_resources()`)
    node by node (`nodes`: per-node resource dicts; without them, nodes of `node_cpus` CPUs).

    Every actor must fit one node beside that node's read tasks (`cpu_budget` of the node, not
    of the cluster: eight 2-CPU nodes take 1-CPU actors, not 1.25-CPU ones). A configured size
    or CPU share that does not fit is reduced (with a note), never left to wait for resources;
    GPU options that the cluster cannot serve are a ConfigError."""
    cpus, gpus = float(resources.get("CPU", 0)), float(resources.get("GPU", 0))
    memory = float(resources.get("memory", 0))
    if cpus <= 0:
        raise ConfigError("the Ray cluster reports no CPUs; the encode stage needs at least one")
    gpu = cfg.gpus_per_actor > 0
    if gpu and gpus < cfg.gpus_per_actor:
        raise ConfigError(
            f"encoder.gpus_per_actor is {cfg.gpus_per_actor:g} but the Ray cluster has {gpus:g} GPU(s): "
            "set encoder.gpus_per_actor: 0 to encode on CPUs, or join a cluster with GPUs "
            "(ray start --num-gpus=N); waiting for a GPU that does not exist would hang the stage")
    node_list = _node_list(resources, node_cpus, nodes)
    budgets = [cpu_budget(c) for c, _ in node_list]
    largest = max(c for c, _ in node_list)

    def fits(share: float) -> int:
        """Actors of `share` CPUs that fit, summed over the nodes."""
        total = 0
        for (_, node_gpus), budget in zip(node_list, budgets):
            n = math.floor(budget / share + 1e-9)
            if gpu:
                n = min(n, math.floor(node_gpus / cfg.gpus_per_actor + 1e-9))
            total += n
        return total

    mem_fit = max(1, int(memory * 0.8 // actor_memory)) if memory else 1 << 30
    notes: list[str] = []
    want_min = cfg.actors or cfg.min_actors
    want_max = cfg.actors or cfg.max_actors
    share = cfg.cpus_per_actor
    if share > max(budgets):
        notes.append(f"cpus_per_actor {share:g} does not fit beside the read tasks on a {largest:g}-CPU node: "
                     f"using {max(budgets):g}")
        share = max(budgets)
    if gpu and fits(share) == 0:
        raise ConfigError(f"encoder.gpus_per_actor {cfg.gpus_per_actor:g}: no node has that many GPUs free "
                          f"beside {share:g} CPU")
    fit = max(1, min(fits(share), mem_fit))
    if want_min and want_min > fit and not gpu:
        # a fixed or minimum size that does not fit: first a smaller CPU share (down to 0.25), then fewer actors
        smaller = share
        while smaller > 0.25 and fits(smaller) < want_min:
            smaller = max(0.25, round(smaller - 0.01, 2))
        if smaller < share:
            notes.append(f"{want_min} actors x {share:g} CPU do not fit beside the read tasks on "
                         f"{len(node_list)} node(s) of {largest:g} CPU: {smaller:g} CPU each")
            share = smaller
            fit = max(1, min(fits(share), mem_fit))
    hi = want_max or fit
    if hi > fit:
        notes.append(f"{hi} actors do not fit the cluster ({cpus:g} CPU on {len(node_list)} node(s), {gpus:g} GPU, "
                     f"{memory / 2**30:.0f} GiB for Ray): using {fit}")
        hi = fit
    if max_blocks:
        hi = max(1, min(hi, max_blocks))  # no more actors than blocks of work
    lo = min(want_min or hi, hi)
    if gpu:
        threads = max(1, round(share))
    else:
        per_node = math.ceil(hi / len(node_list))  # Ray Data spreads pool actors over the nodes
        threads = max(1, int(min(largest, max(share, largest / per_node))))
    return PoolPlan(min_actors=lo, max_actors=hi, cpus_per_actor=share, gpus_per_actor=cfg.gpus_per_actor,
                    threads=threads, device="cuda" if gpu else "cpu",
                    half=half_weights(cfg.precision, gpu, cfg.identity_precision), notes=tuple(notes))


def bf16_hint(device: str, precision: str, native: bool) -> str | None:
    """What the stage tells a CPU user who could encode faster: float32 is the default because
    its vectors do not depend on the batch they are computed in; bfloat16's move by up to 1e-3."""
    if device == "cpu" and precision == "float32" and native:
        return ("this CPU computes bfloat16 natively: encoder.precision: bfloat16 would encode about 2x faster "
                "(cosine to float32 0.9999+, but a text's vector then moves with its batch by up to 1e-3)")
    return None


def pool_size(cfg: EncoderConfig) -> int:
    """Largest encoder pool the connected cluster takes for `cfg`."""
    import ray

    return plan_pool(cfg, ray.cluster_resources(), nodes=_nodes()).max_actors


def _nodes() -> list[dict]:
    """Resources of each alive node."""
    import ray

    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]
