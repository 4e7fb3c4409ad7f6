"""Rewards + transitions stage: episodes and steps -> (s, a, r, s', done) rows, on Ray Data.

Steps are grouped by episode (a Ray Data shuffle), each group is rendered and rewarded by
the pure functions of `harnessrl.transitions` and `harnessrl.rewards`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc

from harnessrl import schemas, storage
from harnessrl.config import RenderConfig
from harnessrl.errors import DataError
from harnessrl.ray_runtime import shuffle_partitions
from harnessrl.render import Renderer
from harnessrl.rewards import RewardRecipe
from harnessrl.transitions import episode_transitions

log = logging.getLogger(__name__)
EPISODE_FIELDS = ["episode_id", "task_id", "group_id", "task_text", "terminated", "outcome_success", "outcome_score",
                  "tool_definitions"]


@dataclass
class TransitionsResult:
    out_dir: str
    transitions: int
    episodes: int
    recipe: str
    recipe_digest: str
    mean_reward: float
    mean_return: float
    success_rate: float

    def summary(self) -> dict:
        return asdict(self)


def _build(group: pa.Table, episodes: dict, recipe: RewardRecipe, render: RenderConfig) -> pa.Table:
    steps = group.to_pylist()
    rows = episode_transitions(episodes[steps[0]["episode_id"]], steps, recipe, Renderer(render))
    for r in rows:
        r["reward_components"] = list(r["reward_components"].items())
    return pa.Table.from_pylist(rows, schema=schemas.TRANSITIONS)


def build_transitions(ingest_dir: str, out_dir: str, recipe: RewardRecipe, render: RenderConfig) -> TransitionsResult:
    import ray

    episodes_tbl = storage.read_parquet(storage.join(ingest_dir, "episodes"), EPISODE_FIELDS)
    if episodes_tbl.num_rows == 0:
        raise DataError(f"no valid episodes under {ingest_dir}: nothing to build transitions from")
    episodes = {e["episode_id"]: e for e in episodes_tbl.to_pylist()}
    steps = ray.data.read_parquet(storage.join(ingest_dir, "steps"))
    storage.reset_dir(out_dir)
    steps.groupby("episode_id", num_partitions=shuffle_partitions()).map_groups(
        _build, batch_format="pyarrow", fn_kwargs={"episodes": episodes, "recipe": recipe, "render": render}
    ).write_parquet(out_dir, compression="zstd")
    stats = storage.read_parquet(out_dir, ["reward", "return_to_go", "step_idx"]).to_pandas()
    first = stats[stats.step_idx == 0]
    success = pc.mean(pc.cast(pc.fill_null(episodes_tbl.column("outcome_success"), False), pa.float64())).as_py()
    result = TransitionsResult(
        out_dir=out_dir, transitions=len(stats), episodes=len(episodes), recipe=recipe.name,
        recipe_digest=recipe.digest(), mean_reward=float(stats.reward.mean()),
        mean_return=float(first.return_to_go.mean()), success_rate=float(success),
    )
    log.info("rewards+transitions: %d transitions from %d episodes (recipe %s %s, mean return %.2f)",
             result.transitions, result.episodes, recipe.name, result.recipe_digest, result.mean_return)
    return result
