"""A whole pipeline run: ingest -> rewards/transitions -> encode -> train -> register -> evaluate -> serve check.

The same function runs on a laptop (local Ray, SQLite MLflow, local disk) and, submitted as
a Ray job, on a cluster: only the configuration differs.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Literal

from harnessrl import console, lineage, preflight, registry, settings, storage
from harnessrl.config import PipelineConfig
from harnessrl.encoders import EncoderIdentity
from harnessrl.jobs.stage_cache import run_stage, stage_key
from harnessrl.model_card import ModelCard
from harnessrl.ray_runtime import init_ray
from harnessrl.rewards import load_recipe

log = logging.getLogger(__name__)


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> dict[str, str]:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return out


def _log_dataset(name: str, uri: str, digest: str, context: str) -> None:
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    with warnings.catch_warnings():  # MLflow registers its local artifact source twice and warns about it
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(uri)
    # The digest is ours, over the whole content (MLflow's own reads the first 10k rows only).
    mlflow.log_input(MetaDataset(source=source, name=name, digest=digest[:36]), context=context)


def _serve_check(cfg: PipelineConfig, model_uri: str, rows: list[dict[str, Any]], critic) -> list[dict[str, Any]]:
    """Start the service, score held-out states over HTTP, check the answers match in-process scoring."""
    import httpx

    from harnessrl.serving import app as serving

    url = serving.start(model_uri, config=cfg.serve)
    answers = []
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            for row in rows:
                resp = http.post("/v1/score", json={"agent_id": "quickstart", "state": row["state_text"],
                                                    "candidates": row["candidates"]})
                resp.raise_for_status()
                body = resp.json()
                local = critic.score(row["state_text"], row["candidates"])
                if max(abs(a - b) for a, b in zip(body["scores"], local)) > 1e-3:
                    raise RuntimeError(f"HTTP and in-process scores differ: {body['scores']} vs {local}")
                answers.append({**body, "state_text": row["state_text"], "candidates": row["candidates"],
                                "expert": row.get("expert")})
    finally:
        serving.stop()
    return answers


def _prepare(cfg: PipelineConfig, out: str, recipe, summary: dict, force: bool) -> tuple[dict, dict]:
    """Ingest -> rewards/transitions -> encode, each skipped when its output exists for the same
    input and configuration (see jobs/stage_cache.py); returns (encoder identity, dataset digests)."""
    import mlflow

    from harnessrl.pipelines.encode import encode
    from harnessrl.pipelines.ingest import ingest
    from harnessrl.pipelines.transitions import build_transitions

    from harnessrl.pipelines.encode import EncodeResult
    from harnessrl.pipelines.ingest import IngestResult
    from harnessrl.pipelines.transitions import TransitionsResult

    skipped: list[str] = []
    raw = storage.digest_sources(storage.expand_sources(cfg.data.train))
    outcomes = storage.digest_sources([cfg.data.outcomes]) if cfg.data.outcomes else None
    k_ing = stage_key("ingest", raw, outcomes, cfg.data.format, cfg.data.max_line_bytes)
    with console.stage("ingest"):
        ing = run_stage(out, "ingest", k_ing, force, IngestResult, skipped=skipped, run=lambda: ingest(
            cfg.data.train, storage.join(out, "ingest"), cfg.data.format, cfg.data.outcomes, cfg.data.max_line_bytes))
    k_tr = stage_key("transitions", k_ing, recipe.digest(), cfg.render.model_dump())
    with console.stage("transitions"):
        tr = run_stage(out, "transitions", k_tr, force, TransitionsResult, skipped=skipped,
                       run=lambda: build_transitions(storage.join(out, "ingest"), storage.join(out, "transitions"),
                                                     recipe, cfg.render))
    k_enc = stage_key("encode", k_tr, cfg.encoder.model_dump(exclude={"actors", "min_actors", "max_actors",
                                                                     "cpus_per_actor", "gpus_per_actor", "cache"}))
    enc = run_stage(out, "encode", k_enc, force, EncodeResult, skipped=skipped, run=lambda: encode(
        storage.join(out, "transitions"), storage.join(out, "encoded"), cfg.encoder))
    summary["skipped"] = skipped
    for name, result in (("ingest", ing), ("transitions", tr), ("encode", enc)):
        summary[name] = result.summary()
        mlflow.log_metrics({f"{name}/{k}": v for k, v in result.summary().items() if isinstance(v, (int, float))})
    digests = lineage.run_digests(out, ing.raw_digest)
    _log_dataset("raw", ing.sources[0], digests["raw"], "raw")
    for name in ("transitions", "encoded"):
        _log_dataset(name, storage.join(out, name), digests[name], "training" if name == "encoded" else name)
    summary["digests"] = digests
    return EncoderIdentity.from_json(enc.encoder), digests


def _train_and_register(cfg: PipelineConfig, out: str, recipe, encoder: EncoderIdentity, digests: dict, run_id: str,
                        summary: dict) -> str:
    """Train on `out/encoded` (Ray Train run named after the MLflow run, so it can be resumed),
    register the critic with its lineage; returns the model URI."""
    import mlflow

    from harnessrl.jobs.train import train

    sha = registry.git_sha()
    lineage_tags = {
        "dataset_digests": digests, "reward_recipe": recipe.name, "reward_recipe_hash": recipe.digest(),
        "git_sha": sha, "mlflow_run_id": run_id, "pipeline": cfg.name,
        # where the training transitions are, so evaluation can keep their task groups out
        "transitions": storage.join(out if storage.is_remote(out) else str(Path(out).resolve()), "transitions"),
    }
    # the model card, built once here; training completes it (head, thresholds, metrics)
    card = ModelCard(model_name=cfg.registry.model_name, head=cfg.train.head, head_config={},
                     encoder=json.loads(encoder.to_json()), render=cfg.render, lineage=lineage_tags,
                     train_config=cfg.train.model_dump())
    model_dir = str(Path(out) / "model") if not storage.is_remote(out) else str(settings.home() / "models" / run_id)
    trn = train(storage.join(out, "encoded"), storage.join(out, "train"), cfg.train, run_id, model_dir, card, run_id)
    summary["train"] = trn.summary()
    mlflow.log_metrics({"train/seconds": trn.seconds, "train/fallback_threshold": trn.fallback_threshold})
    tags = {
        **{f"digest.{k}": v for k, v in digests.items()},
        "reward_recipe": recipe.name, "reward_recipe_hash": recipe.digest(),
        "encoder": encoder.to_json(), "train_config": json.dumps(cfg.train.model_dump()),
        "git_sha": sha, "mlflow_run_id": run_id, "fallback_threshold": f"{trn.fallback_threshold:.6g}",
        "pipeline": cfg.name, "raw_sources": json.dumps(lineage.absolute_sources(cfg.data.train)),
        "output_dir": out if storage.is_remote(out) else str(Path(out).resolve()),
    }
    version = registry.register_critic(model_dir, cfg.registry.model_name, cfg.registry.alias, tags)
    model_uri = f"models:/{cfg.registry.model_name}@{cfg.registry.alias}"
    summary["model"] = {"name": cfg.registry.model_name, "version": version, "alias": cfg.registry.alias,
                        "uri": model_uri, "run_id": run_id, "experiment": cfg.registry.experiment}
    return model_uri


def _evaluate_and_serve(cfg: PipelineConfig, out: str, recipe, model_uri: str, summary: dict) -> None:
    """Gold-action ranking on held-out episodes (where they name the expert's action at
    `evaluate.expert_field`), then a few held-out states scored over HTTP, labelled or not."""
    import mlflow

    from harnessrl.critic import Critic
    from harnessrl.evaluation import gold_rows, gold_top1, smoke_rows
    from harnessrl.pipelines.ingest import ingest
    from harnessrl.pipelines.transitions import build_transitions

    critic = Critic.load(model_uri)  # through the registry, as a user would
    held = storage.join(out, "heldout")
    with console.stage("held-out ingest"):
        h_ing = ingest(cfg.data.heldout, storage.join(held, "ingest"), cfg.data.format,
                       max_line_bytes=cfg.data.max_line_bytes)
        build_transitions(storage.join(held, "ingest"), storage.join(held, "transitions"), recipe, cfg.render)
    steps = storage.read_parquet(storage.join(held, "transitions")).to_pylist() if h_ing.episodes else []
    rows = gold_rows(steps, cfg.evaluate.max_heldout_steps, cfg.evaluate.expert_field)
    t0 = time.time()
    figures: dict[str, Any] = gold_top1(critic, rows, prior_weight=cfg.serve.prior_weight)  # as served
    figures["ms_per_step"] = 1000 * (time.time() - t0) / len(rows) if rows else None
    figures.update(heldout_episodes=h_ing.episodes, heldout_steps=len(steps), expert_field=cfg.evaluate.expert_field)
    if not rows:
        log.warning("held-out: none of the %d held-out steps has an expert action at %s among its candidates: "
                    "gold-action ranking not measured (set evaluate.expert_field to where the logs keep it)",
                    len(steps), cfg.evaluate.expert_field)
    summary["evaluate"] = figures
    mlflow.log_metrics({f"heldout/{k}": v for k, v in figures.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
    if cfg.serve.enabled and cfg.serve.smoke_requests:
        summary["served"] = _serve_check(cfg, model_uri, smoke_rows(steps, rows, cfg.serve.smoke_requests), critic)


def _start(cfg: PipelineConfig):
    preflight.pipeline(cfg)  # a missing source, recipe, encoder or token fails now, before Ray starts
    recipe = load_recipe(cfg.rewards)
    init_ray(cfg.ray_address)
    return recipe, registry.ensure_experiment(cfg.registry.experiment)


def run_pipeline(cfg: PipelineConfig, force: bool = False, until: Literal["encode", "train"] | None = None
                 ) -> dict[str, Any]:
    """Every stage, in one MLflow run; returns the summary the CLI prints. `force` reruns stages
    whose output exists for the same input and configuration (otherwise they are skipped).
    `until`: stop after that stage: "encode" prepares the data once for several `harnessrl train`
    runs, "train" trains and registers without the held-out evaluation and serve check."""
    import mlflow

    started = time.time()
    out = cfg.run_dir()
    recipe, experiment_id = _start(cfg)
    summary: dict[str, Any] = {"pipeline": cfg.name, "output_dir": out}
    run_name = f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name) as run:
        mlflow.log_params(_flatten("", cfg.model_dump(), {}))
        mlflow.set_tags({"harnessrl.pipeline": cfg.name, "harnessrl.git_sha": registry.git_sha(),
                         "harnessrl.reward_recipe": recipe.digest()})
        summary["run_id"], summary["experiment"] = run.info.run_id, cfg.registry.experiment
        encoder, digests = _prepare(cfg, out, recipe, summary, force)
        if until != "encode":
            model_uri = _train_and_register(cfg, out, recipe, encoder, digests, run.info.run_id, summary)
            if cfg.data.heldout and until is None:
                _evaluate_and_serve(cfg, out, recipe, model_uri, summary)
        summary["seconds"] = time.time() - started
        mlflow.log_metric("pipeline/seconds", summary["seconds"])
        mlflow.log_dict(summary, "summary.json")
    return summary


def train_only(cfg: PipelineConfig, resume: str | None = None) -> dict[str, Any]:
    """Train and register from the pipeline's existing encoded dataset.

    `resume` names an earlier run (its MLflow run id, which is also its Ray Train run name):
    training continues from that run's last checkpoint up to `train.steps`, and logs into
    the same MLflow run.
    """
    import mlflow

    from harnessrl import encoded_data
    from harnessrl.errors import DataError

    started = time.time()
    out = cfg.run_dir()
    encoded = storage.join(out, "encoded")  # what is missing fails before Ray starts
    if not encoded_data.exists(encoded):
        raise DataError(f"no encoded dataset at {encoded}: run `harnessrl run` on this pipeline first")
    if resume:
        fs, path = storage.filesystem(storage.join(out, "train", resume))
        if fs.get_file_info(path).type.name == "NotFound":
            raise DataError(f"no training run {resume!r} under {storage.join(out, 'train')} to resume")
    recipe, experiment_id = _start(cfg)
    encoder = encoded_data.read_identity(encoded)
    digests = lineage.run_digests(out, storage.digest_sources(storage.expand_sources(cfg.data.train)))
    summary: dict[str, Any] = {"pipeline": cfg.name, "output_dir": out, "resumed": resume}
    run_args = {"run_id": resume} if resume else {"experiment_id": experiment_id,
                                                  "run_name": f"{cfg.name}-train-{time.strftime('%Y%m%d-%H%M%S')}"}
    with mlflow.start_run(**run_args) as run:
        model_uri = _train_and_register(cfg, out, recipe, encoder, digests, run.info.run_id, summary)
        if cfg.data.heldout:
            _evaluate_and_serve(cfg, out, recipe, model_uri, summary)
    summary["seconds"] = time.time() - started
    return summary
