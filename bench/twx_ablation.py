"""Issue 5's ablation table in one command: which ingredient of the critic buys how much.

A base critic (the issue-5 rendering, history features, candidate-set penalty, expectile 0.7,
1000 steps) and one critic per changed ingredient are each trained by the pipeline and played
in closed loop on the same seeds by bench/twx.py, with and without the `avoid_repeats` rule.
The base run also plays the baselines on those seeds (BC, BC on careful episodes: the ceiling
check, the behaviour mix, random). One row per critic, one per baseline:

    python bench/twx_ablation.py --seeds-per-family 3 --work-dir /tmp/ablation --markdown ablation.md --json ablation.json
    python bench/twx_ablation.py --variants features,alpha ...            # some of them
    python bench/twx_ablation.py --variants cross ...                     # the CPU-sized cross-encoder head (~30 min)
    python bench/twx_ablation.py --logs /tmp/logs/twx_train.jsonl.gz ...  # another log corpus (bench/twx.py --logs)

Variants that keep the base's rendering and encoder share its pipeline folder, so the stage
cache skips ingest, transitions and encode and only training runs again (~4 min each on 2
cores); the rendering variant encodes in its own folder. Cells are successes over
families x seeds episodes: read them with their Wilson intervals (bench/twx.py's tables).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import twx  # noqa: E402  (bench/ is no package)

PINS = "render.pin=[task, read map, read cookbook, read math problem, read instructions book, inventory]"
BASE = [PINS, "render.list_actions=true", "render.observation_first=true", "render.max_chars=2500",
        "encoder.max_seq_length=256", "train.validation_fraction=0.1", "train.select=last", "train.steps=1000",
        # issue 5's critic, pinned: the defaults have moved since (reader head, alpha 0, expectile 0.9)
        "train.head=frozen", "train.alpha=0.3", "train.expectile=0.7"]
BASE_LABEL = "base: issue-5 rendering, history features, alpha 0.3, expectile 0.7, 1000 steps"
# name -> (what changes, overrides applied after BASE)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "rendering": ("quickstart rendering (window 3, 128 tokens, nothing pinned)",
                  ["render.pin=[]", "render.list_actions=false", "render.observation_first=false",
                   "render.window=3", "render.max_chars=1500", "encoder.max_seq_length=128"]),
    "features": ("no history features", ["train.features=false"]),
    "alpha": ("no candidate-set penalty (plain IQL)", ["train.alpha=0"]),
    "expectile": ("expectile 0.9", ["train.expectile=0.9"]),
    "steps": ("2000 steps", ["train.steps=2000"]),
    "cross": ("cross-encoder head, CPU-sized (3 layers, 192 tokens, 600 steps of 8)",
              ["train.head=cross", "train.cross.layers=3", "train.cross.max_length=192", "train.cross.batch_size=8",
               "train.candidates_per_step=2", "train.steps=600", "train.log_every=100"]),
}
DEFAULT_VARIANTS = ("rendering", "features", "alpha", "expectile", "steps")  # cross: opt-in, ~30 min on 2 cores
BASELINES = ("bc", "bc+norepeat", "bc-careful", "bc-careful+norepeat", "mix", "random")


def own_pipeline(overrides: list[str]) -> bool:
    """A variant that renders or encodes differently needs its own pipeline folder (and encode)."""
    return any(o.startswith(("render.", "encoder.")) for o in overrides)


def run_args(args: argparse.Namespace, name: str, work: Path) -> list[str]:
    """bench/twx.py's argv for the base (name "base") or one variant: the all-actions protocol only
    (the table reads it), BASE, then the variant's overrides, then the user's --set (last wins)."""
    extra = [] if name == "base" else VARIANTS[name][1]
    scorers = ["critic", "critic+norepeat", *(BASELINES if name == "base" else ())]
    argv = ["--protocol", "all-actions", "--scorers", ",".join(scorers), "--model-name", f"twx-ablation-{name}",
            "--work-dir", str(work / (name if own_pipeline(extra) else "shared"))]
    for flag in ("families", "seeds_per_family", "logs", "bc_steps"):
        value = getattr(args, flag)
        if value is not None:
            argv += [f"--{flag.replace('_', '-')}", str(value)]
    for o in [*BASE, *extra, *(args.set or [])]:
        argv += ["--set", o]
    return argv


def _cell(results: dict, scorer: str, tier: str) -> dict | None:
    return results["table"].get(f"{scorer}|{tier}|all")


def table_rows(runs: list[tuple[str, dict]]) -> list[list[str]]:
    """One row per critic (label, its run's results) and one per baseline of the first run: success
    per tier, with and without the rule, and the loop rate without it."""
    def fmt(m):
        return "-" if m is None else f"{m['success']:.2f}"

    def loops(results, scorer):
        cells = [_cell(results, scorer, t) for t in ("id", "ood")]
        return " / ".join("-" if m is None else f"{m['loop_rate']:.2f}" for m in cells)

    rows = []
    for label, res in runs:
        rows.append([label, *(fmt(_cell(res, s, t)) for s in ("critic", "critic+norepeat") for t in ("id", "ood")),
                     loops(res, "critic")])
    base = runs[0][1]
    for scorer in BASELINES:
        if scorer.endswith(twx.NO_REPEAT) or _cell(base, scorer, "id") is None:
            continue
        rule = f"{scorer}{twx.NO_REPEAT}"
        rows.append([f"{scorer} (same seeds)",
                     *(fmt(_cell(base, s, t)) for s in (scorer, rule) for t in ("id", "ood")), loops(base, scorer)])
    return rows


HEADER = ["critic / scorer", "id", "ood", "+norepeat id", "+norepeat ood", "loops id / ood"]


def markdown(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/twx_ablation.py", description=__doc__.split("\n")[0])
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"comma-separated of {', '.join(VARIANTS)} (default: {','.join(DEFAULT_VARIANTS)})")
    p.add_argument("--families", help="as bench/twx.py")
    p.add_argument("--seeds-per-family", type=int, default=3, help="per tier (default 3)")
    p.add_argument("--logs", help="as bench/twx.py: the logs every critic and BC learn from")
    p.add_argument("--bc-steps", type=int, help="as bench/twx.py")
    p.add_argument("--set", action="append", help="an override for every critic, after the variant's (repeatable)")
    p.add_argument("--work-dir", required=True, help="pipeline folders (the shared one keeps the stage cache)")
    p.add_argument("--json", help="write every run's results here")
    p.add_argument("--markdown", help="write the ablation table here")
    args = p.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    twx._log_progress()
    work = Path(args.work_dir)
    runs: list[tuple[str, dict]] = []
    for name in ["base", *args.variants.split(",")]:
        t0 = time.time()
        results = twx.run(twx.parse_args(run_args(args, name, work)))
        runs.append((BASE_LABEL if name == "base" else VARIANTS[name][0], results))
        print(f"[twx-ablation] {name}: {time.time() - t0:.0f} s", flush=True)
        if args.json:  # after every run: a late failure keeps the finished ones
            Path(args.json).write_text(json.dumps({label: r for label, r in runs}, indent=1, default=str))
    table = markdown(table_rows(runs))
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
