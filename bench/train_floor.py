"""What a Ray Train run costs before and after its steps: `train.poll_s` against Ray's own default.

Ray Train's controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by default);
each `ray.train.report` (the train job reports at every checkpoint) and the run's start and end
wait for a poll. The train job sets it to `train.poll_s` (harnessrl.ray_runtime.train_poll_interval).
This runs, alternately in one local Ray, the same TorchTrainer run (1 worker x 0.5 CPU, as the
tests and the laptop default run it) at Ray's default and at the given interval, and prints the
wall time of each `fit()`, their medians and the ratio. The loop does no work but `--reports`
reports, so the figures are the fixed cost the interval adds, not the training's.

    python bench/train_floor.py                         # 3 rounds, 1 report, train.poll_s's default
    python bench/train_floor.py --rounds 5 --reports 10 --poll-s 0.2

Ray binds 127.0.0.1; nothing is logged to MLflow.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from harnessrl.config import TrainConfig  # noqa: E402
from harnessrl.ray_runtime import TRAIN_POLL_ENV, init_ray, train_poll_interval  # noqa: E402


def _loop(config):
    import ray.train

    for i in range(config["reports"]):
        ray.train.report({"i": i})


def fit_seconds(reports: int, name: str, storage: str) -> float:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    t = time.perf_counter()
    TorchTrainer(_loop, train_loop_config={"reports": reports},
                 scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.5}),
                 run_config=RunConfig(name=name, storage_path=storage)).fit()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="runs of each (alternating)")
    p.add_argument("--reports", type=int, default=1, help="ray.train.report calls per run")
    p.add_argument("--poll-s", type=float, default=TrainConfig().poll_s, help="ours (default: train.poll_s's)")
    args = p.parse_args(argv)
    os.environ.pop(TRAIN_POLL_ENV, None)  # Ray's default for the baseline
    init_ray()
    setups = {"ray default (2 s)": contextlib.nullcontext, f"train.poll_s {args.poll_s:g} s":
              lambda: train_poll_interval(args.poll_s)}
    times: dict[str, list[float]] = {label: [] for label in setups}
    with tempfile.TemporaryDirectory(prefix="harnessrl-floor-") as storage:
        fit_seconds(args.reports, "warm-up", storage)  # the first run also pays for imports and worker start
        for r in range(args.rounds):
            for i, (label, setup) in enumerate(setups.items()):
                with setup():
                    times[label].append(fit_seconds(args.reports, f"run{i}-{r}", storage))
                print(f"round {r + 1}: {label}: fit {times[label][-1]:.1f} s", flush=True)
    base, ours = (statistics.median(v) for v in times.values())
    print(f"\n{args.reports} report(s) per run, median of {args.rounds}: ray default {base:.1f} s, "
          f"train.poll_s {args.poll_s:g} s {ours:.1f} s: {base / ours:.2f}x "
          f"(load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
