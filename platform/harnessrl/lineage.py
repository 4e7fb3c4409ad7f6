"""Lineage: our own content digests over whole datasets, and the chain from raw logs to a model.

A digest is order-independent: rows are sorted by their key columns first, so the same
content written by a different number of Ray tasks (different files) has the same digest.
MLflow's own dataset digest reads only the first 10k rows and skips list columns, so a
changed embedding would go unnoticed; ours reads everything.

Every registered model version carries `digest.<dataset>` tags, the run's output folder and
raw sources; `chain` reads them back and `verify` recomputes each digest from the data as it
is now (`harnessrl lineage NAME@ALIAS --verify`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from harnessrl import settings, storage
from harnessrl.encoded_data import parquet_files

KEYS = ["episode_id", "step_idx"]
# dataset name -> (folder under the run's output, sort keys of its digest), in pipeline order
DATASETS: dict[str, tuple[tuple[str, ...], list[str]]] = {
    "episodes": (("ingest", "episodes"), ["episode_id"]),
    "steps": (("ingest", "steps"), KEYS),
    "transitions": (("transitions",), KEYS),
    "encoded": (("encoded", "data"), KEYS),
    "vectors": (("encoded", "_texts"), ["text_hash"]),  # the distinct-text table encoded rows reference
}
DIGEST_COLUMNS = {"vectors": ["text_hash", "emb"]}  # datasets digested on some columns only (else all)


def table_digest(table: pa.Table, keys: list[str]) -> str:
    table = table.sort_by([(k, "ascending") for k in keys]).replace_schema_metadata(None).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return "sha256:" + hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def dataset_digest(uri: str, keys: list[str], columns: list[str] | None = None) -> str:
    """Digest of every row (and column, or of `columns`) of the Parquet dataset at `uri`."""
    fs, path = storage.filesystem(uri)
    files = parquet_files(fs, path) if columns else path  # a folder with files of several schemas: its files
    table = pads.dataset(files, filesystem=fs, format="parquet", exclude_invalid_files=True).to_table(columns=columns)
    return table_digest(table, keys)


def dataset_uri(output_dir: str, name: str) -> str:
    return storage.join(output_dir, *DATASETS[name][0])


def absolute_sources(specs: list[str]) -> list[str]:
    """Source specs as recorded with a model: local paths made absolute, so `verify` works from anywhere."""
    from pathlib import Path

    return [s if s.startswith("builtin:") or storage.is_remote(s) else str(Path(s).absolute()) for s in specs]


def run_digests(output_dir: str, raw_digest: str) -> dict[str, str]:
    """Our digests of every dataset of a pipeline run (the raw corpus's is given)."""
    return {"raw": raw_digest,
            **{name: dataset_digest(dataset_uri(output_dir, name), keys, DIGEST_COLUMNS.get(name))
               for name, (_, keys) in DATASETS.items()}}


# ---- the chain of a registered model -------------------------------------------------------------
@dataclass
class Link:
    """One dataset of the chain: where it is, the digest recorded at training, and (verify) now."""

    name: str
    location: str
    recorded: str
    current: str | None = None
    status: str = "unchecked"  # unchecked | ok | MISMATCH | MISSING


@dataclass
class Chain:
    model: str
    version: str
    aliases: list[str]
    run_id: str
    pipeline: str
    git_sha: str
    reward_recipe: str
    reward_recipe_hash: str
    encoder: dict[str, Any]
    train_config: dict[str, Any]
    datasets: list[Link] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return all(d.status == "ok" for d in self.datasets)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verified": self.verified}


def chain(model_uri: str) -> Chain:
    """The lineage recorded with a registered model version (`models:/NAME@ALIAS` or `/VERSION`)."""
    from harnessrl import registry
    from harnessrl.errors import ModelError

    mv = registry.model_version(model_uri)
    tags = dict(mv.tags)
    if "digest.raw" not in tags:
        raise ModelError(f"{model_uri}: version {mv.version} carries no lineage tags (not registered by a pipeline)")
    out = tags.get("output_dir", "")
    sources = json.loads(tags.get("raw_sources", "[]"))
    links = [Link("raw", ", ".join(sources) or "(not recorded)", tags["digest.raw"])]
    links += [Link(name, dataset_uri(out, name) if out else "(not recorded)", tags[f"digest.{name}"])
              for name in DATASETS if f"digest.{name}" in tags]
    aliases = list(getattr(mv, "aliases", None) or [])
    return Chain(model=mv.name, version=str(mv.version), aliases=aliases, run_id=tags.get("mlflow_run_id", ""),
                 pipeline=tags.get("pipeline", ""), git_sha=tags.get("git_sha", ""),
                 reward_recipe=tags.get("reward_recipe", ""), reward_recipe_hash=tags.get("reward_recipe_hash", ""),
                 encoder=json.loads(tags.get("encoder", "{}")), train_config=json.loads(tags.get("train_config", "{}")),
                 datasets=links)


def verify(c: Chain, raw_sources: list[str] | None = None) -> Chain:
    """Recompute every digest from the data as it is now; marks each link ok / MISMATCH / MISSING."""
    from harnessrl.errors import DataError

    for link in c.datasets:
        try:
            if link.name == "raw":
                specs = raw_sources if raw_sources is not None else [s.strip() for s in link.location.split(",")]
                link.current = storage.digest_sources(storage.expand_sources(specs))
            else:
                link.current = dataset_digest(link.location, DATASETS[link.name][1], DIGEST_COLUMNS.get(link.name))
        except (DataError, OSError, pa.ArrowException):
            link.current, link.status = None, "MISSING"
            continue
        link.status = "ok" if link.current == link.recorded else "MISMATCH"
    return c


def render(c: Chain) -> str:
    enc = c.encoder
    lines = [
        f"model        {c.model} version {c.version}" + (f" (aliases: {', '.join(c.aliases)})" if c.aliases else ""),
        f"trained by   MLflow run {c.run_id} (pipeline '{c.pipeline}'), code {c.git_sha}",
        f"rewards      recipe '{c.reward_recipe}' {c.reward_recipe_hash}",
        f"encoder      {enc.get('model_name', '?')} dim {enc.get('dim', '?')} weights {str(enc.get('weights_hash', '?'))[:16]}"
        f" max_seq_length {enc.get('max_seq_length', '?')} normalize {enc.get('normalize', '?')}",
        "train        " + ", ".join(f"{k}={c.train_config[k]}" for k in ("steps", "batch_size", "expectile", "gamma",
                                                                          "alpha", "tool_head") if k in c.train_config),
        "data (raw logs -> model; digests over whole content):",
    ]
    for d in c.datasets:
        status = "" if d.status == "unchecked" else f"  [{d.status}" + (
            f": now {d.current[:23]}]" if d.status == "MISMATCH" else "]")
        lines.append(f"  {d.name:<12} {d.recorded[:23]}  {settings.redact(d.location)}{status}")
    if any(d.status != "unchecked" for d in c.datasets):
        lines.append("verified: every digest matches" if c.verified else
                     "NOT verified: " + ", ".join(f"{d.name} {d.status}" for d in c.datasets if d.status != "ok"))
    return "\n".join(lines)
