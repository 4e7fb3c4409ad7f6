"""Train job: data-parallel IQL on Ray Train (`TorchTrainer`, DDP), checkpoints, MLflow metrics.

Each worker reads its own shard of the encoded transitions into memory once and samples
minibatches from it (the standard offline-RL replay), so every worker takes the same number
of steps whatever its shard size. Rank 0 writes checkpoints and logs metrics to MLflow.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from harnessrl.config import TrainConfig
from harnessrl.features import FEATURE_NAMES, tool_ids

log = logging.getLogger(__name__)
ARRAY_COLUMNS = ("state_emb", "action_emb", "next_state_emb", "reward", "done", "outcome_success")


@dataclass
class TrainResult:
    model_dir: str
    checkpoint_path: str
    steps: int
    seconds: float
    metrics: dict[str, float]
    reward_scale: float
    fallback_threshold: float

    def summary(self) -> dict:
        return asdict(self)


def _matrix(column) -> np.ndarray:
    """fixed_size_list<float>[d] -> (n, d) float32 without a Python loop."""
    arr = column.combine_chunks()
    return arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(arr), arr.type.list_size)


def _padded(column, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """list<list<float>[d]> -> (n, k_max, d) zero-padded float32 and its (n, k_max) mask.

    The inner lists are fixed-size embeddings, or variable lists of `width` features."""
    arr = column.combine_chunks()
    inner = arr.type.value_type
    n, d = len(arr), (inner.list_size if pa.types.is_fixed_size_list(inner) else width)
    offsets = arr.offsets.to_numpy()
    lengths = np.diff(offsets)
    k_max = int(lengths.max()) if n else 0
    values = arr.values.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, d)
    values = values[offsets[0]: offsets[-1]]
    rows = np.repeat(np.arange(n), lengths)
    cols = np.arange(len(values)) - np.repeat(offsets[:-1] - offsets[0], lengths)
    out = np.zeros((n, k_max, d), np.float32)
    mask = np.zeros((n, k_max), bool)
    out[rows, cols], mask[rows, cols] = values, True
    return out, mask


def _features(column) -> np.ndarray:
    """list<float> with one fixed length per table -> (n, F) float32."""
    arr = column.combine_chunks()
    flat = arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    return flat.reshape(len(arr), -1) if len(arr) else flat.reshape(0, len(FEATURE_NAMES))


def _pad_to(parts: list[np.ndarray], k: int) -> list[np.ndarray]:
    return [np.pad(x, ((0, 0), (0, k - x.shape[1])) + ((0, 0),) * (x.ndim - 2)) for x in parts]


def load_arrays(batches, candidates: bool = True) -> dict[str, np.ndarray]:
    """Concatenate pyarrow batches of encoded transitions into the arrays training needs."""
    parts: dict[str, list] = {k: [] for k in (*ARRAY_COLUMNS, "features", "tool", "cand", "cand_mask", "cand_f")}
    for b in batches:
        if candidates and "candidate_emb" in b.column_names:
            cand, mask = _padded(b.column("candidate_emb"))
            parts["cand"].append(cand)
            parts["cand_mask"].append(mask)
            parts["cand_f"].append(_padded(b.column("candidate_features"), len(FEATURE_NAMES))[0][:, : cand.shape[1]])
        for k in ("state_emb", "action_emb", "next_state_emb"):
            parts[k].append(_matrix(b.column(k)))
        parts["features"].append(_features(b.column("features")))
        parts["tool"].append(np.array(b.column("tool").to_pylist(), dtype=object))
        parts["reward"].append(b.column("reward").to_numpy(zero_copy_only=False).astype(np.float32))
        parts["done"].append(b.column("done").to_numpy(zero_copy_only=False).astype(np.float32))
        parts["outcome_success"].append(
            np.array([bool(x) for x in b.column("outcome_success").to_pylist()], dtype=bool))
    if parts["cand"]:  # batches pad to their own k_max: pad to the largest
        k = max(c.shape[1] for c in parts["cand"])
        for key in ("cand", "cand_mask", "cand_f"):
            parts[key] = _pad_to(parts[key], k)
    return {k: np.concatenate(v) for k, v in parts.items() if v}


def on_device(net, world: int, device):
    """The network on the worker's device (its GPU when Ray Train gave it one), DDP-wrapped when
    there are several workers."""
    from ray.train.torch import prepare_model

    net = net.to(device)
    return prepare_model(net, move_to_device=False) if world > 1 else net


class _Learners:
    """The critic (IQL over candidate embeddings) and, when the data calls several tools, the
    tool head (an AWR policy over the tool vocabulary, with or without a discrete Q of its own),
    stepped on the same batch."""

    def __init__(self, config: dict[str, Any], world: int, device: str = "cpu"):
        from harnessrl.algorithms.discrete import DiscreteConfig, DiscreteLearner, DiscreteNetwork
        from harnessrl.algorithms.iql import IQLConfig, IQLLearner, IQLNetwork

        def wrap(net):
            return on_device(net, world, device)

        self.cfg = IQLConfig(**config["iql"])
        net = IQLNetwork(self.cfg)
        if self.cfg.feature_dim:
            net.q.set_feature_stats(*config["feature_stats"])  # before DDP, which broadcasts buffers
        self.critic = IQLLearner(self.cfg, wrap(net))
        self.tool_cfg = DiscreteConfig(**config["tool_head"]) if config.get("tool_head") else None
        self.tools = DiscreteLearner(self.tool_cfg, wrap(DiscreteNetwork(self.tool_cfg))) if self.tool_cfg else None

    def parts(self):
        yield "state", self.critic
        if self.tools:
            yield "tools", self.tools

    def save(self, directory: str, step: int, extra: dict) -> None:
        from harnessrl.training_state import save_training_state

        for name, lr in self.parts():
            save_training_state(directory, lr.core, lr.target_q, lr.opt, step, extra, name=name)

    def load(self, directory: str) -> int:
        from harnessrl.training_state import load_training_state

        return min(load_training_state(directory, lr.core, lr.target_q, lr.opt, name=name)["step"]
                   for name, lr in self.parts())


class _Validation:
    """Held-out task groups scored every `log_every` steps: the critic's TD error on transitions of
    tasks it never trained on, |Q(s, a) - (r + gamma (1 - done) V(s'))| in scaled reward units.
    Every rank scores the same data with the same (DDP-synchronised) weights, so all ranks agree
    on the best step and on stopping early without talking to each other."""

    CHUNK = 4096

    def __init__(self, data: dict[str, np.ndarray], reward_scale: float, gamma: float, use_f: bool):
        import torch

        keys = ("state_emb", "action_emb", "next_state_emb", "reward", "done") + (("features",) if use_f else ())
        self.t = {k: torch.from_numpy(data[k]) for k in keys}
        self.t["reward"] = self.t["reward"] * reward_scale
        self.gamma, self.n = gamma, len(data["reward"])
        self.reset_best()

    def reset_best(self) -> None:
        self.best_value, self.best_step, self.since_best = float("inf"), 0, 0
        self.best: dict[str, dict] = {}  # learner name -> state dict copy of the best weights

    def score(self, learners: _Learners) -> float:
        import torch

        net, total = learners.critic.core, 0.0
        dev = next(net.parameters()).device
        with torch.no_grad():
            for i in range(0, self.n, self.CHUNK):
                t = {k: v[i:i + self.CHUNK].to(dev) for k, v in self.t.items()}
                q = net.q.min_q(t["state_emb"], t["action_emb"], t.get("features"))
                target = t["reward"] + self.gamma * (1 - t["done"]) * net.v(t["next_state_emb"])
                total += float((q.float() - target.float()).abs().sum())
        return total / self.n

    def observe(self, step: int, value: float, learners: _Learners) -> None:
        if value < self.best_value:
            self.best_value, self.best_step, self.since_best = value, step, 0
            self.best = {name: {k: v.detach().clone() for k, v in lr.core.state_dict().items()}
                         for name, lr in learners.parts()}
        else:
            self.since_best += 1

    def save(self, directory: str) -> dict[str, Any]:
        from harnessrl.training_state import save_network_weights

        for name, weights in self.best.items():
            save_network_weights(directory, weights, f"best-{name}")
        return {"best_step": self.best_step, "best_value": self.best_value, "since_best": self.since_best}

    def restore(self, directory: str, state: dict[str, Any] | None, learners: _Learners) -> None:
        from safetensors.torch import load_file

        if not state or not state.get("best_step"):
            return
        self.best_value, self.best_step, self.since_best = state["best_value"], state["best_step"], state["since_best"]
        self.best = {name: {k[4:]: v for k, v in load_file(os.path.join(directory, f"best-{name}.safetensors")).items()}
                     for name, _ in learners.parts()}


def _frozen_setup(config: dict[str, Any], rank: int, world: int, device):
    """(learners, step function, validation or None) of the frozen-embedding head: the shard's
    embeddings as tensors, minibatches sampled from them."""
    import ray.train
    import torch

    data = load_arrays(ray.train.get_dataset_shard("train").iter_batches(batch_size=4096, batch_format="pyarrow"))
    n = len(data["reward"])
    if n == 0:
        raise RuntimeError(f"worker {rank} got an empty shard")
    t = {k: torch.from_numpy(data[k]) for k in ("state_emb", "action_emb", "next_state_emb", "reward", "done")}
    t["reward"] = t["reward"] * config["reward_scale"]
    learners = _Learners(config, world, device)
    use_f = learners.cfg.feature_dim > 0
    if use_f:
        t["features"] = torch.from_numpy(data["features"])
    use_cand = learners.cfg.alpha > 0 and "cand" in data and data["cand"].shape[1] > 0
    if use_cand:
        t["cand"], t["cand_mask"] = torch.from_numpy(data["cand"]), torch.from_numpy(data["cand_mask"])
        t["cand_f"] = torch.from_numpy(data["cand_f"])
    if learners.tools:
        t["tool_id"] = torch.tensor(tool_ids(config["tool_vocab"], data["tool"].tolist()))
    t = {k: v.to(device) for k, v in t.items()}  # the shard lives where the network does
    per_worker = max(1, config["batch_size"] // world)

    def step(gen: torch.Generator) -> dict[str, float]:
        idx = torch.randint(n, (per_worker,), generator=gen)
        s, s2, r, done = t["state_emb"][idx], t["next_state_emb"][idx], t["reward"][idx], t["done"][idx]
        f = t["features"][idx] if use_f else None
        cand = cand_mask = cand_f = None
        if use_cand:  # a few untaken candidates per state keep the penalty's cost bounded
            cols = torch.randperm(t["cand"].shape[1], generator=gen)[: config["candidates_per_step"]]
            cand, cand_mask = t["cand"][idx][:, cols], t["cand_mask"][idx][:, cols]
            cand_f = t["cand_f"][idx][:, cols] if use_f else None
        metrics = learners.critic.update(s, t["action_emb"][idx], r, s2, done, f, cand, cand_mask, cand_f)
        if learners.tools:
            metrics.update({f"tool_{k}": v for k, v in learners.tools.update(
                s, t["tool_id"][idx], r, s2, done, adv=learners.critic.advantage).items()})
        return metrics

    val = None
    if config.get("validation"):
        val_data = load_arrays(ray.train.get_dataset_shard("val").iter_batches(batch_size=4096, batch_format="pyarrow"),
                               candidates=False)
        val = _Validation(val_data, config["reward_scale"], learners.cfg.gamma, use_f)
    return learners, step, val


def _train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    from ray.train.torch import get_device

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(config["threads"])
    torch.manual_seed(config["seed"])  # same init on every rank; DDP broadcasts rank 0's anyway
    load_start = time.time()
    if config.get("head") == "cross":
        from harnessrl.jobs.train_cross import cross_setup as setup
    else:
        setup = _frozen_setup
    learners, train_step, val = setup(config, rank, world, get_device())
    load_seconds = time.time() - load_start

    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = learners.load(d)
            if val is not None:
                with open(os.path.join(d, "state.json")) as fh:
                    val.restore(d, json.load(fh).get("validation"), learners)

    mlflow_client = None
    if rank == 0 and config.get("mlflow_run_id"):
        from mlflow import MlflowClient

        mlflow_client = MlflowClient(config["tracking_uri"])
    gen = torch.Generator().manual_seed(config["seed"] * 1000 + rank + start)
    window: list[dict[str, float]] = []
    window_start = time.time()
    for step in range(start + 1, config["steps"] + 1):
        window.append(train_step(gen))
        last = stop = step == config["steps"]
        if step % config["log_every"] == 0 or last:
            metrics = {k: float(np.mean([m[k] for m in window])) for k in window[0]}
            metrics["q_abs_max"] = float(max(m["q_abs_max"] for m in window))
            metrics["steps_per_s"] = len(window) / max(time.time() - window_start, 1e-9)
            metrics["load_seconds"] = load_seconds
            if val is not None:
                metrics["val_td_error"] = val.score(learners)
                val.observe(step, metrics["val_td_error"], learners)
                metrics["val_best_step"] = float(val.best_step)
                stop = last or bool(config.get("patience") and val.since_best >= config["patience"])
            window, window_start = [], time.time()
            if rank == 0:  # progress on the driver's console (Ray forwards worker output)
                val_part = f", held-out TD error {metrics['val_td_error']:.4f}" if val is not None else ""
                print(f"train: step {step}/{config['steps']}, loss_q {metrics['loss_q']:.4f}, loss_v "
                      f"{metrics['loss_v']:.4f}{val_part}, {metrics['steps_per_s']:.2f} steps/s", flush=True)
            if mlflow_client:
                from mlflow.entities import Metric

                now = int(time.time() * 1000)
                mlflow_client.log_batch(config["mlflow_run_id"],
                                        metrics=[Metric(f"train/{k}", v, now, step) for k, v in metrics.items()])
        if step % config["checkpoint_every"] == 0 or stop:
            with tempfile.TemporaryDirectory() as tmp:
                ckpt = None
                if rank == 0:
                    extra = {"reward_scale": config["reward_scale"]}
                    if val is not None:
                        extra["validation"] = val.save(tmp)
                    learners.save(tmp, step, extra)
                    ckpt = ray.train.Checkpoint.from_directory(tmp)
                ray.train.report({"step": step, "resumed_from_step": start, **metrics}, checkpoint=ckpt)
        if stop:  # every rank reaches the same decision (see _Validation)
            break


def split_validation(ds, fraction: float, seed: int) -> dict[str, Any]:
    """{"train", "val"}: the encoded rows split by task group (harnessrl.metrics.split_by_group), so
    that no task is in both and the held-out score is that of unseen tasks."""
    import pyarrow.compute as pc

    from harnessrl.errors import DataError
    from harnessrl.metrics import split_by_group

    groups = ds.select_columns(["group_id"]).to_pandas()["group_id"].astype(str).tolist()
    _, held = split_by_group(groups, fraction, seed)
    held_groups = pa.array(sorted({g for g, h in zip(groups, held) if h}), pa.string())
    if len(held_groups) == 0 or held.all():
        raise DataError(f"train.validation_fraction {fraction}: the data has {len(set(groups))} task group(s); "
                        "validation needs two or more (set validation_fraction: 0)")

    def part(batch: pa.Table, keep_held: bool) -> pa.Table:
        mask = pc.is_in(pc.fill_null(pc.cast(batch["group_id"], pa.string()), "None"), value_set=held_groups)
        return batch.filter(mask if keep_held else pc.invert(mask))

    log.info("train: %d of %d task groups (%d of %d transitions) held out for validation", len(held_groups),
             len(set(groups)), int(held.sum()), len(groups))
    return {name: ds.map_batches(part, batch_format="pyarrow", fn_kwargs={"keep_held": name == "val"}).materialize()
            for name in ("train", "val")}


def reward_scale_for(returns: np.ndarray) -> float:
    """Scale rewards so the largest |return| is about 1: Q stays in a range the MLP fits easily."""
    peak = float(np.max(np.abs(returns))) if len(returns) else 1.0
    return 1.0 / peak if peak > 1.0 else 1.0


def _fallback_threshold(net, data: dict[str, np.ndarray], reward_scale: float, quantile: float,
                        use_features: bool) -> float:
    """A low quantile of Q(s, a) over the steps of successful episodes, in reward units.

    Why: the critic's job is to say when no candidate looks like the actions that led to
    success. Steps on successful paths are the reference; a best candidate scoring below
    what (1 - quantile) of them scored is outside that experience. Falls back to all
    steps when the data has no success.
    """
    import torch

    mask = data["outcome_success"] if data["outcome_success"].any() else np.ones(len(data["reward"]), bool)
    s, a = torch.from_numpy(data["state_emb"][mask]), torch.from_numpy(data["action_emb"][mask])
    f = torch.from_numpy(data["features"][mask]) if use_features else None
    with torch.no_grad():
        q = torch.cat([net.q.min_q(s[i:i + 8192], a[i:i + 8192], f[i:i + 8192] if f is not None else None)
                       for i in range(0, len(s), 8192)])
    return float(np.quantile(q.numpy() / reward_scale, quantile))


def defined_tools_of(ds) -> list[str]:
    """Every tool the episodes define (the `defined_tools` column; absent in older data: none)."""
    import pyarrow.compute as pc

    if "defined_tools" not in ds.schema().names:
        return []
    found: set[str] = set()
    for b in ds.select_columns(["defined_tools"]).iter_batches(batch_size=65536, batch_format="pyarrow"):
        found.update(pc.unique(pc.list_flatten(b.column("defined_tools"))).to_pylist())
    return sorted(t for t in found if t)


def _tool_head_config(cfg: TrainConfig, tools: np.ndarray, state_dim: int,
                      defined: list[str] | tuple = ()) -> tuple[dict | None, list[str]]:
    """The discrete head's config and vocabulary (tools called, then tools defined but never
    called, capped at `max_tools`), or (None, vocab) when there is nothing to choose between
    (fewer than two tools) or it is switched off."""
    from collections import Counter

    from harnessrl.algorithms.discrete import DiscreteConfig
    from harnessrl.features import tool_vocabulary

    vocab = tool_vocabulary(Counter(tools.tolist()), cfg.max_tools, defined)
    if cfg.tool_head == "none" or len(vocab) < 2:
        return None, vocab
    head = DiscreteConfig(state_dim=state_dim, n_actions=len(vocab), hidden_dim=cfg.hidden_dim, gamma=cfg.gamma,
                          expectile=cfg.expectile, polyak=cfg.polyak, lr=cfg.lr, method=cfg.tool_head,
                          awr_beta=cfg.awr_beta, bf16=cfg.precision == "bfloat16")
    return head.to_dict(), vocab


def _storage(storage_dir: str) -> dict[str, Any]:
    """Where Ray Train keeps checkpoints. For `s3://` the filesystem is built here and handed to
    the workers with its endpoint and credentials resolved, so they need no S3 environment."""
    from harnessrl import storage

    if not storage.is_remote(storage_dir):
        return {"storage_path": storage_dir}
    fs, path = storage.portable_filesystem(storage_dir)
    return {"storage_path": path, "storage_filesystem": fs}


def train(encoded_dir: str, storage_dir: str, cfg: TrainConfig, run_name: str, model_dir: str,
          meta: dict[str, Any], mlflow_run_id: str | None = None) -> TrainResult:
    """Fit IQL (and the tool head) on `encoded_dir/data`, write the critic folder to `model_dir`.

    `meta` (encoder identity, render settings, lineage) is stored with the model. `storage_dir`
    (local or `s3://`) holds the run's checkpoints.
    """
    import ray
    import torch
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from harnessrl import settings, storage
    from harnessrl.algorithms.iql import IQLConfig, IQLNetwork
    from harnessrl.encoded_data import check_identity
    from harnessrl.encoders import EncoderIdentity
    from harnessrl.model_files import save_critic, save_ood_reference
    from harnessrl.ood import fit_reference
    from harnessrl.training_state import load_network_weights

    # the embeddings must be those of the encoder the critic will be saved with (and serve with)
    check_identity(encoded_dir, EncoderIdentity.from_json(meta["encoder"]), f"training data {encoded_dir}")
    start = time.time()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    ds = ray.data.read_parquet(storage.join(encoded_dir, "data")).materialize()  # see the 2-CPU deadlock note
    data = load_arrays(ds.iter_batches(batch_size=8192, batch_format="pyarrow"), candidates=False)
    returns = ds.select_columns(["return_to_go"]).to_pandas()["return_to_go"].to_numpy()
    scale = reward_scale_for(returns)
    feature_dim = data["features"].shape[1] if cfg.features else 0
    iql = IQLConfig(state_dim=data["state_emb"].shape[1], action_dim=data["action_emb"].shape[1],
                    hidden_dim=cfg.hidden_dim, gamma=cfg.gamma, expectile=cfg.expectile, polyak=cfg.polyak,
                    lr=cfg.lr, alpha=cfg.alpha, feature_dim=feature_dim, bf16=cfg.precision == "bfloat16")
    feature_stats = ([data["features"].mean(0).tolist(), data["features"].std(0).tolist()] if feature_dim
                     else None)
    cross = cfg.head == "cross"
    tool_head, vocab = _tool_head_config(cfg, data["tool"], iql.state_dim, defined_tools_of(ds))
    if cross and tool_head:
        log.warning("train: the data calls %d tools but the cross head trains no tool head (train.head: frozen "
                    "has one)", len(vocab))
        tool_head = None
    datasets = {"train": ds}
    if cfg.validation_fraction > 0:
        datasets = split_validation(ds, cfg.validation_fraction, cfg.seed)
    use_gpu = cfg.gpus_per_worker > 0
    resources = {"CPU": cfg.cpus_per_worker, **({"GPU": cfg.gpus_per_worker} if use_gpu else {})}
    loop_config = {
        "iql": iql.to_dict(), "feature_stats": feature_stats, "tool_head": tool_head, "tool_vocab": vocab,
        "steps": cfg.steps, "batch_size": cfg.batch_size, "seed": cfg.seed,
        "log_every": cfg.log_every, "checkpoint_every": cfg.checkpoint_every, "reward_scale": scale,
        "candidates_per_step": cfg.candidates_per_step,
        "threads": max(1, int(round(cfg.cpus_per_worker))), "mlflow_run_id": mlflow_run_id,
        "tracking_uri": settings.tracking_uri(), "validation": "val" in datasets, "patience": cfg.patience,
    }
    if cross:
        from harnessrl.jobs import train_cross

        loop_config.update(train_cross.loop_config(cfg, meta["encoder"]["model_name"], feature_dim))
    log.info("train: IQL (%s head) on %d transitions (%d history features, tool head: %s over %d tools), "
             "%d worker(s) x %s, %d steps", cfg.head, len(returns), feature_dim,
             tool_head["method"] if tool_head else "none", len(vocab), cfg.num_workers, resources, cfg.steps)
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=use_gpu, resources_per_worker=resources,
                                     placement_strategy=cfg.placement_strategy),
        run_config=RunConfig(
            name=run_name, **_storage(storage_dir),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=cfg.max_failures),
        ),
        datasets=datasets,
        dataset_config=DataConfig(datasets_to_split=["train"]),  # every worker scores the whole "val"
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"training run {run_name} finished without a checkpoint: {result.error}")
    net = None if cross else IQLNetwork(iql)
    tools_net = None
    with result.checkpoint.as_directory() as d:
        with open(os.path.join(d, "state.json")) as fh:
            validation = json.load(fh).get("validation")
        best = "best-" if validation and validation.get("best_step") and cfg.select == "best" else ""
        if cross:
            scorer, threshold = train_cross.export(
                d, loop_config["cross"], meta["encoder"]["model_name"], best, feature_dim,
                train_cross.sample_successful(ds, len(returns), train_cross.THRESHOLD_ROWS, cfg.seed), scale,
                cfg.fallback_quantile)
        else:
            load_network_weights(d, net, name=f"{best}state")
        if tool_head:
            from harnessrl.algorithms.discrete import DiscreteConfig, DiscreteNetwork

            tools_net = DiscreteNetwork(DiscreteConfig(**tool_head))
            load_network_weights(d, tools_net, name=f"{best}tools")
    if not cross:
        threshold = _fallback_threshold(net.eval(), data, scale, cfg.fallback_quantile, feature_dim > 0)
    metrics = {k: float(v) for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
    if validation:
        metrics.update({"val_best_step": float(validation["best_step"]), "val_best_td_error": validation["best_value"],
                        "selected_step": float(validation["best_step"] if best else metrics.get("step", cfg.steps))})
        log.info("train: held-out TD error best %.4f at step %d; exporting the %s weights (step %d)",
                 validation["best_value"], validation["best_step"], cfg.select, int(metrics["selected_step"]))
    reference, ood_threshold = fit_reference(data["state_emb"], cfg.seed)
    head_meta = {"head": "cross", "iql": loop_config["cross"]} if cross else {"head": "frozen", "iql": iql.to_dict()}
    save_critic(model_dir, scorer if cross else net, {**meta, **head_meta, "reward_scale": scale,
                                 "ood": {"threshold": ood_threshold, "n_reference": len(reference)},
                                 "feature_names": list(FEATURE_NAMES) if feature_dim else [],
                                 "fallback_threshold": threshold, "fallback_quantile": cfg.fallback_quantile,
                                 "tool_vocab": vocab, "train_metrics": metrics},
                tool_head=(tools_net, tool_head) if tools_net is not None else None)
    save_ood_reference(model_dir, reference)
    out = TrainResult(model_dir=str(model_dir), checkpoint_path=result.checkpoint.path, steps=cfg.steps,
                      seconds=time.time() - start, metrics=metrics, reward_scale=scale, fallback_threshold=threshold)
    log.info("train: done in %.0f s; loss_q %.4f loss_v %.4f; fallback threshold %.3f", out.seconds,
             metrics.get("loss_q", float("nan")), metrics.get("loss_v", float("nan")), threshold)
    return out
