"""Reward recipes: named, hashed YAML weights turned into per-step rewards (DESIGN §5).

A recipe never mutates the logs; transitions are recomputed from the kept raw fields, so a
new recipe is a new transitions dataset with a new hash in its lineage.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from harnessrl.errors import ConfigError


class RewardRecipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "default"
    success: float = 10.0
    failure: float = -2.0
    outcome_score: float = 0.0
    step_cost: float = 0.1
    source_reward: float = 1.0

    def digest(self) -> str:
        """Content hash of the weights (the name is a label, not part of the identity)."""
        body = json.dumps(self.model_dump(exclude={"name"}), sort_keys=True)
        return "sha256:" + hashlib.sha256(body.encode()).hexdigest()[:16]

    def step_rewards(self, episode: dict[str, Any], steps: list[dict[str, Any]]) -> list[dict[str, float]]:
        """Reward components for each step of one episode (in order)."""
        out = []
        last = len(steps) - 1
        for i, step in enumerate(steps):
            parts = {"step_cost": -self.step_cost}
            if self.source_reward and step.get("reward") is not None:
                parts["source"] = self.source_reward * float(step["reward"])
            if i == last and episode.get("terminated"):
                success = episode.get("outcome_success")
                if success is True:
                    parts["outcome"] = self.success
                elif success is False:
                    parts["outcome"] = self.failure
                if self.outcome_score and episode.get("outcome_score") is not None:
                    parts["outcome_score"] = self.outcome_score * float(episode["outcome_score"])
            out.append(parts)
        return out


def load_recipe(spec: str) -> RewardRecipe:
    """A recipe by builtin name (`default`) or by YAML path."""
    path = Path(spec)
    if path.suffix in {".yaml", ".yml"} or path.exists():
        if not path.is_file():
            raise ConfigError(f"reward recipe not found: {spec}")
        text = path.read_text()
    else:
        try:
            text = resources.files("harnessrl").joinpath(f"recipes/{spec}.yaml").read_text()
        except FileNotFoundError:
            raise ConfigError(f"unknown builtin reward recipe {spec!r} (try 'default' or a YAML path)") from None
    try:
        return RewardRecipe.model_validate(yaml.safe_load(text) or {})
    except (yaml.YAMLError, ValidationError) as exc:
        raise ConfigError(f"invalid reward recipe {spec}: {exc}") from None
