"""The model card: everything that makes a critic what it is, typed, in one place.

A critic folder holds its weights (safetensors) and this card (`critic.json`). The pipeline builds
the card once (the encoder identity of its encoded data, the render settings, lineage, the training
configuration); training completes it (the head's network configuration, reward scale, fallback
threshold, OOD threshold, tool vocabulary, metrics). Everything downstream (`Critic.load`, the
service, evaluation, the benchmarks) only reads it: no other code re-reads `critic.json` or passes
its parts around as dicts.

Versions: 2 is this layout. Version 1 (before the card, to November 2026) is read and converted:
its network configuration was called `iql`. Any other version is a clear ModelError naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harnessrl.config import RenderConfig
from harnessrl.encoders import EncoderIdentity
from harnessrl.errors import ModelError

CARD_VERSION = 2
CARD_FILE = "critic.json"
READABLE_VERSIONS = (1, 2)


class OODCard(BaseModel):
    """The out-of-distribution check: a state farther than `threshold` (cosine distance) from every
    state of the stored reference sample is flagged."""

    model_config = ConfigDict(extra="forbid")
    threshold: float
    n_reference: int


class ModelCard(BaseModel):
    """A critic's card. `head_config` is the head's own network configuration (its dataclass as a
    dict: `heads.get(head).network_config(card)` makes the typed object)."""

    model_config = ConfigDict(extra="forbid")

    format_version: int = CARD_VERSION
    model_name: str = "local"
    head: str = "frozen"
    head_config: dict[str, Any]
    encoder: dict[str, Any] = Field(description="the EncoderIdentity the embeddings come from (its JSON form)")
    render: RenderConfig = Field(default_factory=RenderConfig)
    feature_names: list[str] = Field(default_factory=list)
    reward_scale: float = 1.0
    fallback_threshold: float | None = None
    fallback_quantile: float = 0.1
    fallback_rows: int | None = Field(None, description="how many steps of successful episodes (held-out ones "
                                                        "where there were) the threshold was set on")
    ood: OODCard | None = None
    tool_head: dict[str, Any] | None = Field(None, description="the tool head's DiscreteConfig, when it has one")
    tool_vocab: list[str] = Field(default_factory=list)
    lineage: dict[str, Any] = Field(default_factory=dict)
    train_config: dict[str, Any] = Field(default_factory=dict)
    train_metrics: dict[str, Any] = Field(default_factory=dict)

    @property
    def identity(self) -> EncoderIdentity:
        return EncoderIdentity.from_json(self.encoder)

    @property
    def uses_features(self) -> bool:
        return bool(self.head_config.get("feature_dim", 0))

    @property
    def gamma(self) -> float:
        return float(self.head_config.get("gamma", 0.95))

    def check_encoder(self, other: EncoderIdentity, where: str) -> None:
        """ModelError unless this critic's embeddings came from `other` (the one place it is checked)."""
        self.identity.check_same(other, where)

    # ---- files -----------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CARD_FILE
        path.write_text(json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True))
        return path

    @classmethod
    def read(cls, directory: str | Path) -> "ModelCard":
        """The card of a critic folder, converted from version 1 if needed."""
        path = Path(directory) / CARD_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelError(f"{directory} is not a critic folder (no {CARD_FILE})") from None
        except (ValueError, OSError) as exc:
            raise ModelError(f"{path} is not readable JSON: {exc}") from None
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "critic card") -> "ModelCard":
        if not isinstance(raw, dict):
            raise ModelError(f"{where}: not a critic card (a JSON object expected)")
        version = raw.get("format_version")
        if version not in READABLE_VERSIONS:
            raise ModelError(f"{where}: critic format {version!r} is not one this version reads "
                             f"({', '.join(map(str, READABLE_VERSIONS))}); re-export the critic or upgrade harnessrl")
        if version == 1:
            raw = _from_v1(raw)
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ModelError(f"{where}: not a valid critic card ({problems})") from None


def _from_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """Format 1 (before the card): the same facts, the network configuration under `iql`."""
    out = {k: v for k, v in raw.items() if k not in ("iql", "format_version")}
    out["head_config"] = raw.get("iql") or {}
    out["format_version"] = CARD_VERSION
    out.setdefault("head", "frozen")
    return out
