"""`harnessrl rewards ...`: see what a reward recipe gives each step of a logged episode.

    harnessrl rewards explain PIPELINE.yaml --episode ID [--recipe NAME|PATH] [--json]
    harnessrl rewards explain --ingest DIR --episode ID [--recipe NAME|PATH] [--json]
    harnessrl rewards show [NAME|PATH]

`explain` reads the ingested episodes and steps (Parquet, local or s3://), recomputes the
recipe on the episode (the pipeline's own recipe unless `--recipe`), and prints one row per
step: the action, every component of the recipe, the step's reward and its return-to-go,
with the reason for each nonzero term underneath. The episode is named by its stable
`episode_id` or by the id the log gave it (`native_id`). No Ray: it reads two small filtered
Parquet scans in-process.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from harnessrl import storage
from harnessrl.errors import ConfigError, DataError
from harnessrl.rewards import COMPONENTS, RewardRecipe, load_recipe

ACTION_WIDTH = 40


def register(subparsers: Any) -> None:
    """Add the `rewards` command group to the `harnessrl` sub-command parsers."""
    rewards = subparsers.add_parser("rewards", help="reward recipes: explain a recipe's rewards on a logged episode")
    sub = rewards.add_subparsers(dest="rewards_command", required=True)

    ex = sub.add_parser("explain", help="each step's reward components, reward and return-to-go for one episode",
                        description="Recompute a reward recipe on one ingested episode and print, per step, "
                                    "the action, every component, the reward and the return-to-go, with the "
                                    "reason for each nonzero term. The episode is named by its episode_id or "
                                    "by the log's own id.")
    ex.add_argument("pipeline", nargs="?", help="pipeline YAML: read its ingest output and use its recipe")
    ex.add_argument("--ingest", metavar="DIR", help="an ingest output folder (episodes/, steps/), local or s3://")
    ex.add_argument("--episode", required=True, metavar="ID", help="the episode_id, or the log's own episode id")
    ex.add_argument("--recipe", metavar="NAME|PATH", help="recipe to apply (default: the pipeline's, else 'default')")
    ex.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a pipeline value")
    ex.add_argument("--width", type=int, default=ACTION_WIDTH, help="characters of the action shown (default 40)")
    ex.add_argument("--json", action="store_true", help="print the explanation as JSON")
    ex.set_defaults(fn=cmd_explain)

    show = sub.add_parser("show", help="a recipe's weights, the components it computes and its digest")
    show.add_argument("recipe", nargs="?", default="default", help="builtin name or YAML path (default: default)")
    show.set_defaults(fn=cmd_show)


# ---- inputs -----------------------------------------------------------------------------------
def resolve(pipeline: str | None, ingest_dir: str | None, recipe: str | None,
            overrides: list[str] | None = None) -> tuple[str, RewardRecipe]:
    """(ingest folder, recipe) from a pipeline YAML or an explicit ingest folder."""
    if bool(pipeline) == bool(ingest_dir):
        raise ConfigError("give either a pipeline YAML or --ingest DIR (one of them)")
    if pipeline:
        from harnessrl.config import load_pipeline

        cfg = load_pipeline(pipeline, overrides)
        return storage.join(cfg.run_dir(), "ingest"), load_recipe(recipe or cfg.rewards)
    if overrides:
        raise ConfigError("--set applies to a pipeline YAML, not to --ingest")
    return ingest_dir, load_recipe(recipe or "default")


def _dataset(uri: str, what: str) -> pads.Dataset:
    fs, path = storage.portable_filesystem(uri)
    try:
        found = fs.get_file_info(path).type
    except OSError as exc:
        raise DataError(f"cannot read {uri}: {exc}") from None
    if found != pafs.FileType.Directory:
        raise DataError(f"no ingested {what} at {uri} (run `harnessrl ingest ... --out DIR` or the pipeline first)")
    try:
        return pads.dataset(path, filesystem=fs, format="parquet")
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read the {what} table at {uri}: {exc}") from None


def load_episode(ingest_dir: str, ref: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One episode row and its step rows (in step order), by episode_id or native id."""
    episodes = _dataset(storage.join(ingest_dir, "episodes"), "episodes")
    cond = pc.field("episode_id") == ref
    if "native_id" in episodes.schema.names:
        cond = cond | (pc.field("native_id") == ref)
    rows = episodes.to_table(filter=cond).to_pylist()
    exact = [r for r in rows if r["episode_id"] == ref]
    rows = exact or rows
    if not rows:
        cols = ["native_id"] if "native_id" in episodes.schema.names else ["episode_id"]
        ids = episodes.to_table(columns=cols).column(0)
        examples = ", ".join(repr(i) for i in ids.slice(0, 3).to_pylist())
        raise DataError(f"episode {ref!r} not found in {ingest_dir} ({len(ids)} episode{'s' if len(ids) != 1 else ''}; give an episode_id "
                        f"or the log's own id, e.g. {examples})")
    if len(rows) > 1:
        raise DataError(f"{ref!r} is the log id of {len(rows)} episodes "
                        f"({', '.join(r['episode_id'] for r in rows)}): give one episode_id")
    episode = rows[0]
    steps = _dataset(storage.join(ingest_dir, "steps"), "steps").to_table(
        filter=pc.field("episode_id") == episode["episode_id"]).to_pylist()
    if not steps:
        raise DataError(f"episode {ref!r} has no steps in {ingest_dir}/steps")
    return episode, sorted(steps, key=lambda s: s["step_idx"])


# ---- the explanation --------------------------------------------------------------------------
def explain_episode(episode: dict[str, Any], steps: list[dict[str, Any]], recipe: RewardRecipe) -> dict[str, Any]:
    """What `recipe` gives each step of the episode, as plain data (the --json output)."""
    steps = sorted(steps, key=lambda s: s["step_idx"])
    scored = recipe.evaluate(episode, steps)
    stop = scored.terminate_at
    rows = []
    for t, comp in enumerate(scored.components):
        s = steps[t]
        rows.append({
            "step_idx": int(s["step_idx"]),
            "action_text": s.get("action_text") or "",
            "components": {c: comp[c] for c in COMPONENTS if c in comp},
            "reward": scored.rewards[t],
            "return_to_go": scored.return_to_go[t],
            "done": bool(s.get("terminated")) or t == stop,
            "truncated": bool(s.get("truncated")) and t != stop,
            "notes": scored.notes[t],
        })
    return {
        "episode_id": episode.get("episode_id"),
        "native_id": episode.get("native_id"),
        "task_id": episode.get("task_id"),
        "task_text": episode.get("task_text") or "",
        "outcome_success": episode.get("outcome_success"),
        "outcome_score": episode.get("outcome_score"),
        "end_reason": episode.get("end_reason"),
        "terminated": episode.get("terminated"),
        "truncated": episode.get("truncated"),
        "recipe": {"name": recipe.name, "digest": recipe.digest(), "components": recipe.enabled()},
        "steps": rows,
        "return": scored.return_to_go[0] if rows else 0.0,
        "safety_stop": None if stop is None else {"step_idx": rows[stop]["step_idx"], "pattern": scored.matched},
        "dropped_steps": [int(s["step_idx"]) for s in steps[len(rows):]],
    }


def _num(v: float) -> str:
    text = f"{v:.4f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _short(text: str, width: int) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[: max(1, width - 3)] + "..."


def format_explanation(x: dict[str, Any], width: int = ACTION_WIDTH) -> str:
    """The human table: a header, one row per step, the reasons under each row."""
    outcome = {True: "success", False: "failure", None: "unknown"}[x["outcome_success"]]
    if x["outcome_score"] is not None:
        outcome += f", score {_num(x['outcome_score'])}"
    on = ", ".join(x["recipe"]["components"]) or "nothing on"
    ending = "terminated" if x["terminated"] else "truncated (bootstraps)" if x["truncated"] else "open"
    lines = [
        f"episode   {x['episode_id']}  (log id {x['native_id']}, task {x['task_id']})",
        f"task      {_short(x['task_text'], 100)}",
        f"outcome   {outcome}; end_reason {x['end_reason']}; {ending}",
        f"recipe    {x['recipe']['name']} {x['recipe']['digest']}: {on}",
        "",
    ]
    present = {c for r in x["steps"] for c in r["components"]}
    cols = [c for c in COMPONENTS if c in present or c in x["recipe"]["components"]]
    header = ["step", "action", *cols, "reward", "return_to_go", "end"]
    body = []
    for r in x["steps"]:
        end = "done" if r["done"] else "trunc" if r["truncated"] else ""
        body.append([str(r["step_idx"]), _short(r["action_text"], width),
                     *[_num(r["components"][c]) if c in r["components"] else "." for c in cols],
                     _num(r["reward"]), _num(r["return_to_go"]), end])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    lines.append(fmt(header))
    for r, cells in zip(x["steps"], body):
        lines.append(fmt(cells))
        if r["notes"]:
            lines.append(" " * (widths[0] + 2) + "why: " + "; ".join(r["notes"]))
    lines.append("")
    lines.append(f"return    {_num(x['return'])} (sum of the step rewards; '.' = component off or not applicable)")
    if x["safety_stop"]:
        stop = x["safety_stop"]
        dropped = x["dropped_steps"]
        gone = ("" if not dropped else f"; step {dropped[0]} is dropped from learning" if len(dropped) == 1
                else f"; steps {dropped[0]}..{dropped[-1]} ({len(dropped)}) are dropped from learning")
        lines.append(f"safety    step {stop['step_idx']} matched '{stop['pattern']}': "
                     f"the episode ends there (done){gone}")
    return "\n".join(lines)


def explain(pipeline: str | None, ingest_dir: str | None, episode: str, recipe: str | None = None,
            overrides: list[str] | None = None) -> dict[str, Any]:
    where, rec = resolve(pipeline, ingest_dir, recipe, overrides)
    ep, steps = load_episode(where, episode)
    out = explain_episode(ep, steps, rec)
    out["ingest_dir"] = where
    return out


def cmd_explain(args: argparse.Namespace) -> int:
    x = explain(args.pipeline, args.ingest, args.episode, args.recipe, args.set)
    print(json.dumps(x, indent=2) if args.json else format_explanation(x, max(8, args.width)))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe)
    print(json.dumps({"name": recipe.name, "digest": recipe.digest(), "components": recipe.enabled(),
                      "recipe": recipe.model_dump(mode="json")}, indent=2))
    return 0
