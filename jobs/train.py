"""Train job: data-parallel IQL on Ray Train (`TorchTrainer`, DDP), checkpoints, MLflow metrics.

The loop is the same for every critic head (harnessrl.heads): each worker hands its shard of the
encoded transitions to the head, which streams minibatches from it (the frozen head: epoch after
epoch through a local shuffle buffer, vectors gathered from the shared distinct-text table per
batch) or holds it and samples from it (cross, reader), so every worker takes the same number of
steps whatever its shard size. Rank 0 writes checkpoints and logs metrics to MLflow. The driver completes the model card the pipeline
built: the head's network configuration, reward scale, fallback and OOD thresholds, metrics.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from harnessrl import diagnosis
from harnessrl.config import TrainConfig
from harnessrl.features import FEATURE_NAMES
from harnessrl.heads.base import Shard
from harnessrl.model_card import ModelCard, OODCard

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    model_dir: str
    checkpoint_path: str
    steps: int
    seconds: float
    metrics: dict[str, float]
    reward_scale: float
    fallback_threshold: float
    fallback_rows: int = 0  # steps of successful episodes the threshold was set on
    fallback_warning: str | None = None  # diagnosis.fallback_sample's, when they are too few to trust

    def summary(self) -> dict:
        return asdict(self)


def on_device(net, world: int, device):
    """The network on the worker's device (its GPU when Ray Train gave it one), DDP-wrapped when
    there are several workers."""
    from ray.train.torch import prepare_model

    net = net.to(device)
    return prepare_model(net, move_to_device=False) if world > 1 else net


def _train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    from ray.train.torch import get_device

    from harnessrl import heads

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(config["threads"])
    torch.manual_seed(config["seed"])  # same init on every rank; DDP broadcasts rank 0's anyway
    load_start = time.time()
    device = get_device()

    vectors = ray.get(config["vectors"]) if config.get("vectors") is not None else None  # zero-copy, read-only
    shards = {name: Shard(ray.train.get_dataset_shard(name).iter_batches, vectors)
              for name in ("train", "val") if name == "train" or config.get("validation")}
    setup = heads.head(config["head"]).worker(config, shards["train"], shards.get("val"), world, device,
                                              lambda net: on_device(net, world, device))
    learners, train_step, val = setup.learners, setup.step, setup.validation
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


def split_validation(ds, fraction: float, seed: int, group_rows: Mapping[str, int]) -> tuple[dict[str, Any], int]:
    """({"train", "val"}, rows held out): the encoded rows split by task group
    (harnessrl.metrics.split_by_group), so that no task is in both and the held-out score is that of
    unseen tasks. `group_rows`: the rows of each group ("None" for rows without one), DataStats'."""
    import pyarrow.compute as pc

    from harnessrl.errors import DataError
    from harnessrl.metrics import split_by_group

    groups = sorted(group_rows)  # the split depends on the set of groups only
    _, held = split_by_group(groups, fraction, seed)
    held_groups = [g for g, h in zip(groups, held) if h]
    if not held_groups or held.all():
        raise DataError(f"train.validation_fraction {fraction}: the data has {len(groups)} task group(s); "
                        "validation needs two or more (set validation_fraction: 0)")
    value_set = pa.array(held_groups, pa.string())

    def part(batch: pa.Table, keep_held: bool) -> pa.Table:
        mask = pc.is_in(pc.fill_null(pc.cast(batch["group_id"], pa.string()), "None"), value_set=value_set)
        return batch.filter(mask if keep_held else pc.invert(mask))

    # filtered as they are read, epoch after epoch: rows held in the object store are not held twice
    parts = {name: ds.map_batches(part, batch_format="pyarrow", fn_kwargs={"keep_held": name == "val"})
             for name in ("train", "val")}
    val_rows = sum(group_rows[g] for g in held_groups)
    log.info("train: %d of %d task groups (%d of %d transitions) held out for validation", len(held_groups),
             len(groups), val_rows, sum(group_rows.values()))
    return parts, val_rows


STORE_SHARE = 0.25  # rows: auto holds the encoded rows in the object store when they take at most this share of it
STORE_ROWS_BYTES = 1 << 30  # ... and at most this much: beyond it memory would follow the corpus, so they stream
PARQUET_EXPANSION = 4  # in-memory bytes per byte of (zstd) Parquet, at most, for reference-layout rows


def rows_in(encoded_dir: str, setting: str = "auto") -> str:
    """Where the train job reads the encoded rows from (`train.rows`): "store" or "files"."""
    import pyarrow.fs as pafs
    import ray

    from harnessrl import storage

    if setting != "auto":
        return setting
    fs, path = storage.filesystem(storage.join(encoded_dir, "data"))
    size = sum(i.size or 0 for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
               if i.type == pafs.FileType.File)
    held = min(ray.cluster_resources().get("object_store_memory", 0) * STORE_SHARE, STORE_ROWS_BYTES)
    return "store" if size * PARQUET_EXPANSION <= held else "files"


def read_rows(encoded_dir: str, where: str):
    """The encoded rows as a Ray dataset (references, not vectors, in the default layout): held in
    the object store (`where` "store": an epoch reads memory, and 2 CPUs do not deadlock on a lazy
    read beside the workers, see NOTES), or streamed from their files epoch after epoch ("files"),
    so no process holds the corpus, within Ray Data's streaming budget (blocks in flight, not the
    corpus: `ray_runtime.object_store_budget`, the ingest's too, see `train`)."""
    import ray

    from harnessrl import storage
    from harnessrl.ray_runtime import object_store_budget

    data = storage.join(encoded_dir, "data")
    if where == "store":
        return ray.data.read_parquet(data).materialize()
    log.info("train: the encoded rows are streamed from %s each epoch (train.rows: files)", data)
    with object_store_budget():  # the dataset keeps the budget it was made under, and so do its splits
        return ray.data.read_parquet(data)


def validation_fraction(cfg: TrainConfig, n_groups: int) -> float:
    """`train.validation_fraction`, or when unset 0.1 of the task groups if there are 10 or more."""
    if cfg.validation_fraction is not None:
        return cfg.validation_fraction
    return 0.1 if n_groups >= 10 else 0.0


def resolve_steps(cfg: TrainConfig, rows: int, batch_size: int) -> int:
    """`train.steps`, or for auto about `train.epochs` passes over `rows` in batches of `batch_size`
    (within config.AUTO_STEPS)."""
    from harnessrl.config import AUTO_STEPS

    if cfg.steps != "auto":
        return cfg.steps
    return int(min(AUTO_STEPS[1], max(AUTO_STEPS[0], round(cfg.epochs * rows / batch_size))))


def reward_scale_for(peak: float) -> float:
    """Scale rewards so the largest |reward| of a step (`peak`) is about 1: Q stays in a range an MLP
    fits easily. Not the largest |return|: one long losing episode (a cliff walked off ten times)
    would shrink every value, and the small gaps between actions with them, below what the critic
    resolves."""
    return 1.0 / peak if peak > 1.0 else 1.0


STORAGE_ERRORS = ("AWS Error", "NETWORK_CONNECTION", "Connection refused", "Could not connect", "Timeout was reached")


def fit_with_storage_retries(fit, cfg: TrainConfig, run_name: str):
    """`fit()`, again after a failure of the checkpoint storage (an S3 outage): Ray Train's
    FailureConfig retries worker errors only, and its controller fails the run when it cannot
    write its checkpoint list. Up to `train.storage_retries` times, `train.storage_retry_s`
    seconds apart (doubling); each retry resumes the run from its last registered checkpoint."""
    wait = cfg.storage_retry_s
    for attempt in range(cfg.storage_retries + 1):
        try:
            return fit()
        except Exception as exc:  # noqa: BLE001 - only storage failures are retried, the rest re-raised
            if attempt == cfg.storage_retries or not any(m in str(exc) for m in STORAGE_ERRORS):
                raise
            log.warning("train: run %s failed on its checkpoint storage (%s); resuming it from its last checkpoint "
                        "in %.0f s (retry %d of %d)", run_name, str(exc).splitlines()[0][:200], wait, attempt + 1,
                        cfg.storage_retries)
            time.sleep(wait)
            wait *= 2


def remove_orphaned_checkpoints(result) -> int:
    """Delete the run's checkpoint folders Ray Train does not keep: a worker killed while it
    uploaded one leaves it behind unregistered (the group resumes from an earlier one), and
    `num_to_keep` prunes registered checkpoints only. Returns how many were removed."""
    import pyarrow.fs as pafs

    fs, kept = result.filesystem, {c.path.rstrip("/") for c, _ in result.best_checkpoints or []}
    kept.add(result.checkpoint.path.rstrip("/"))
    run_dir = result.checkpoint.path.rstrip("/").rsplit("/", 1)[0]
    orphans = [i.path for i in fs.get_file_info(pafs.FileSelector(run_dir, allow_not_found=True))
               if i.type == pafs.FileType.Directory and i.base_name.startswith("checkpoint_")
               and i.path.rstrip("/") not in kept]
    for path in orphans:
        fs.delete_dir(path)
    if orphans:
        log.info("train: removed %d checkpoint folder(s) Ray Train does not keep (left by a restart): %s",
                 len(orphans), ", ".join(p.rsplit("/", 1)[-1] for p in orphans))
    return len(orphans)


def _storage(storage_dir: str) -> dict[str, Any]:
    """Where Ray Train keeps checkpoints. For `s3://` the filesystem is built here and handed to
    the workers with its endpoint and credentials resolved, so they need no S3 environment."""
    from harnessrl import storage

    if not storage.is_remote(storage_dir):
        return {"storage_path": storage_dir}
    fs, path = storage.portable_filesystem(storage_dir)
    return {"storage_path": path, "storage_filesystem": fs}


def train(encoded_dir: str, storage_dir: str, cfg: TrainConfig, run_name: str, model_dir: str,
          card: ModelCard, mlflow_run_id: str | None = None) -> TrainResult:
    """Fit the configured head (`cfg.head`) with IQL on `encoded_dir/data` and write the critic folder
    to `model_dir`: the head's files beside `card` (the pipeline's: encoder identity, render settings,
    lineage), completed here. `storage_dir` (local or `s3://`) holds the run's checkpoints."""
    import ray
    import torch
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from harnessrl import heads, settings
    from harnessrl.encoded_data import DataStats, check_identity, vector_table
    from harnessrl.heads.base import DriverData
    from harnessrl.model_files import save_critic, save_ood_reference
    from harnessrl.ood import fit_reference
    from harnessrl.ray_runtime import STREAM_OBJECT_STORE_BYTES, train_poll_interval

    head = heads.head(cfg.head)
    # the embeddings must be those of the encoder the critic will be saved with (and serve with)
    check_identity(encoded_dir, card.identity, f"training data {encoded_dir}")
    start = time.time()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    # rows in stored order through every read, split and worker: a seeded run trains on the same batches
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    ds = read_rows(encoded_dir, rows_in(encoded_dir, cfg.rows))
    vectors = vector_table(encoded_dir)  # each distinct text's vector once (None: the rows carry copies)
    stats = DataStats(ds.iter_batches(batch_size=8192, batch_format="pyarrow"), ds.count(), vectors, cfg.seed)
    scale = reward_scale_for(stats.max_abs_reward)
    feature_dim = len(stats.feature_mean) if cfg.features else 0
    feature_stats = [stats.feature_mean.tolist(), stats.feature_std.tolist()] if feature_dim else None
    data = DriverData(ds=ds, n_rows=stats.rows, feature_dim=feature_dim, feature_stats=feature_stats,
                      reward_scale=scale, encoder_name=card.identity.model_name, seed=cfg.seed, stats=stats,
                      vectors=vectors, encoded_dir=encoded_dir)
    head_config = head.loop_config(cfg, data)
    steps = resolve_steps(cfg, stats.rows, head_config.get("batch_size", cfg.batch_size))
    datasets, val_rows = {"train": ds}, 0
    fraction = validation_fraction(cfg, len(stats.groups))
    if fraction > 0:
        datasets, val_rows = split_validation(ds, fraction, cfg.seed, stats.groups)
        data.calibration, data.train = datasets["val"], datasets["train"]
        data.train_rows = stats.rows - val_rows
    use_gpu = cfg.gpus_per_worker > 0
    resources = {"CPU": cfg.cpus_per_worker, **({"GPU": cfg.gpus_per_worker} if use_gpu else {})}
    loop_config = {
        "batch_size": cfg.batch_size, "candidates_per_step": cfg.candidates_per_step,
        **head_config, "head": head.kind, "feature_stats": feature_stats,
        "steps": steps, "seed": cfg.seed, "log_every": cfg.log_every, "checkpoint_every": cfg.checkpoint_every,
        "reward_scale": scale, "threads": max(1, int(round(cfg.cpus_per_worker))), "mlflow_run_id": mlflow_run_id,
        "tracking_uri": settings.tracking_uri(), "validation": "val" in datasets, "patience": cfg.patience,
        # the vector table, shared through the object store: a node's workers read one copy, zero-copy
        "vectors": ray.put(vectors) if vectors is not None else None,
        "val_rows": val_rows, "shuffle_buffer": cfg.shuffle_buffer,
        "replay": cfg.replay,
    }
    tool_head = head_config.get("tool_head")
    log.info("train: IQL (%s head) on %d transitions (%d history features, tool head: %s over %d tools), "
             "%d worker(s) x %s, %d steps", head.kind, stats.rows, feature_dim,
             tool_head["method"] if tool_head else "none", len(head_config.get("tool_vocab", [])), cfg.num_workers,
             resources, steps)
    ingest = DataConfig.default_ingest_options()
    ingest.preserve_order = True
    # blocks in flight, not the corpus, whether the rows come from the object store or their files
    ingest.resource_limits = ingest.resource_limits.copy(object_store_memory=STREAM_OBJECT_STORE_BYTES)

    def fit():  # a new trainer with the same run name and storage resumes the run from its last checkpoint
        return TorchTrainer(
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
            dataset_config=DataConfig(datasets_to_split=["train"], execution_options=ingest),  # all score all "val"
        ).fit()

    with train_poll_interval(cfg.poll_s):
        result = fit_with_storage_retries(fit, cfg, run_name)
    if result.checkpoint is None:
        raise RuntimeError(f"training run {run_name} finished without a checkpoint: {result.error}")
    remove_orphaned_checkpoints(result)
    with result.checkpoint.as_directory() as d:
        with open(os.path.join(d, "state.json")) as fh:
            validation = json.load(fh).get("validation")
        best = "best-" if validation and validation.get("best_step") and cfg.select == "best" else ""
        exported = head.export(d, loop_config, best, data)
    q = exported.success_q / scale
    threshold = float(np.quantile(q, cfg.fallback_quantile)) if len(q) else float("nan")
    thin = diagnosis.fallback_sample(len(q), cfg.fallback_quantile)
    warning = f"{thin.evidence}; {thin.what_to_try}" if thin else None
    if warning:
        log.warning("train: %s", warning)  # the pipeline's summary repeats it
    metrics = {k: float(v) for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
    if validation:
        metrics.update({"val_best_step": float(validation["best_step"]), "val_best_td_error": validation["best_value"],
                        "selected_step": float(validation["best_step"] if best else metrics.get("step", steps))})
        log.info("train: held-out TD error best %.4f at step %d; exporting the %s weights (step %d)",
                 validation["best_value"], validation["best_step"], cfg.select, int(metrics["selected_step"]))
    ood_states = exported.ood_states if exported.ood_states is not None else stats.states
    reference, ood_threshold = (fit_reference(ood_states, cfg.seed, exported.ood_held_out) if ood_states is not None
                                else (None, 0.0))
    card = card.model_copy(update={
        "head": head.kind, "head_config": loop_config["network"], "reward_scale": scale,
        "ood": OODCard(threshold=ood_threshold, n_reference=len(reference)) if reference is not None else None,
        "feature_names": list(FEATURE_NAMES) if feature_dim else [], "fallback_threshold": threshold,
        "fallback_quantile": cfg.fallback_quantile, "fallback_rows": len(q), "tool_vocab": head_config.get("tool_vocab", []),
        "train_metrics": metrics})
    save_critic(model_dir, exported.scorer, card, tool_head=exported.tool_head)
    if reference is not None:
        save_ood_reference(model_dir, reference)
    out = TrainResult(model_dir=str(model_dir), checkpoint_path=result.checkpoint.path, steps=steps,
                      seconds=time.time() - start, metrics=metrics, reward_scale=scale, fallback_threshold=threshold,
                      fallback_rows=len(q), fallback_warning=warning)
    log.info("train: done in %.0f s; loss_q %.4f loss_v %.4f; fallback threshold %.3f", out.seconds,
             metrics.get("loss_q", float("nan")), metrics.get("loss_v", float("nan")), threshold)
    return out
