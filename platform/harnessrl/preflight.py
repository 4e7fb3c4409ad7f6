"""Checks that need no Ray, run before Ray starts (a missing path is reported in a second, not
after half a minute of cluster start-up), and all of `harnessrl validate` / `run --dry-run`: the
config parses, `ray_address` is well-formed, the reward recipe loads, every source names files,
the outcomes file and the encoder model exist, the service's API token (when it will be served)
is readable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harnessrl import storage
from harnessrl.config import PipelineConfig
from harnessrl.errors import DataError


def sources(specs: list[str], what: str = "source") -> list[str]:
    """The files `specs` name (paths, directories, globs, s3://, builtin:); DataError if none."""
    if not specs:
        raise DataError(f"no {what} given")
    return storage.expand_sources(specs)


def existing(path: str | None, what: str) -> None:
    """DataError unless `path` (a file, local or s3://) exists."""
    if not path:
        return
    fs, p = storage.filesystem(path)
    if fs.get_file_info(p).type.name == "NotFound":
        raise DataError(f"{what} not found: {path}")


def decision_logs(specs: list[str]) -> None:
    """`ingest --format decisions` reads folders of a service's log: each must exist."""
    for spec in specs:
        fs, p = storage.filesystem(spec)
        if fs.get_file_info(p).type.name != "Directory":
            raise DataError(f"decision log folder not found: {spec}")


def pipeline(cfg: PipelineConfig) -> dict[str, Any]:
    """Everything about a pipeline that can be checked without running it; returns what was found."""
    from harnessrl.encoders import encoder_identity
    from harnessrl.rewards import load_recipe

    from harnessrl.addresses import gcs_address

    gcs_address(cfg.ray_address)  # a malformed address is a ConfigError now (reaching it is init_ray's part)
    recipe = load_recipe(cfg.rewards)
    train = sources(cfg.data.train, "data.train source")
    heldout = sources(cfg.data.heldout, "data.heldout source") if cfg.data.heldout else []
    existing(cfg.data.outcomes, "data.outcomes file")
    identity = encoder_identity(cfg.encoder.model, cfg.encoder.max_seq_length, cfg.encoder.identity_precision)
    if cfg.render.max_tokens is not None:
        from harnessrl.tokens import load_tokenizer

        load_tokenizer(cfg.render.tokenizer or cfg.encoder.model)
    serves = cfg.serve.enabled and bool(cfg.data.heldout) and cfg.serve.smoke_requests > 0
    if serves:
        from harnessrl.api_token import resolve_token

        resolve_token()
    if cfg.output_dir and not storage.is_remote(cfg.output_dir):
        _writable(Path(cfg.output_dir))
    return {"pipeline": cfg.name, "train_files": len(train), "heldout_files": len(heldout),
            "recipe": recipe.name, "recipe_digest": recipe.digest(), "encoder": identity.model_name,
            "encoder_dim": identity.dim, "serves": serves}


def _writable(path: Path) -> None:
    """DataError when the output folder cannot be made: its nearest existing parent is a file or
    not writable."""
    import os

    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise DataError(f"output_dir {path}: cannot write under {parent}")
