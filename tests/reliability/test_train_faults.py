"""Ray Train fault tolerance: a training worker killed with SIGKILL mid-run while it streams its
shard (rows referencing the distinct-text table); the worker group restarts from the last
checkpoint, the step count continues from there to the end, and no checkpoint folder is left
beyond the ones Ray Train keeps."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from harnessrl.config import TrainConfig
from harnessrl.model_card import ModelCard

pytestmark = pytest.mark.integration
STEPS, EVERY = 1000, 100  # the kill comes after two checkpoints (step 200): 800 steps left to resume


def _alive_train_workers() -> list[int]:
    """PIDs of this session's Ray Train workers (children of its raylet titled ray::RayTrainWorker...):
    not the state API, which cannot tell which Ray to ask when other Ray instances run on the machine."""
    from faults import workers_running

    return workers_running("RayTrainWorker")


def test_killed_worker_resumes_from_last_checkpoint(encoded, work):
    from harnessrl.jobs.train import train

    cfg = TrainConfig(head="frozen", steps=STEPS, batch_size=64, num_workers=2, cpus_per_worker=0.5, checkpoint_every=EVERY,
                      log_every=EVERY, max_failures=2)
    meta = ModelCard(head_config={}, encoder=encoded.encoder, render={"window": 3, "max_chars": 1500})
    run_dir = work["dir"] / "fault-train" / "fault-test"
    box: dict = {}

    def fit():
        try:
            box["result"] = train(str(work["dir"] / "encoded"), str(work["dir"] / "fault-train"), cfg, "fault-test",
                                  str(work["dir"] / "fault-model"), meta)
        except BaseException as exc:  # surfaced by the assertions below
            box["error"] = exc

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    deadline = time.time() + 600
    # Two checkpoint folders on disk: the first is surely registered with Ray Train by then
    # (a folder alone may be one still being written, which Ray rightly does not resume from).
    while sum(p.is_dir() for p in run_dir.glob("checkpoint_*")) < 2:
        assert thread.is_alive(), box.get("error")
        assert time.time() < deadline, "no checkpoints within 600 s"
        time.sleep(0.2)
    workers = _alive_train_workers()
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    killed_at = time.time()

    thread.join(900)
    assert not thread.is_alive(), "training did not finish after the worker was killed"
    assert "error" not in box, box.get("error")
    metrics = box["result"].metrics
    assert metrics["step"] == STEPS
    # The restarted group resumed from a checkpoint (a multiple of EVERY), not from step 0.
    assert metrics["resumed_from_step"] >= EVERY and metrics["resumed_from_step"] % EVERY == 0
    assert time.time() > killed_at
    # the rows it streamed hold references into the distinct-text table, not copies of vectors
    from harnessrl.encoded_data import references

    assert references(str(work["dir"] / "encoded"))
    # no orphaned checkpoint: what is left is what Ray Train keeps (CheckpointConfig(num_to_keep=2))
    left = sorted(p.name for p in run_dir.glob("checkpoint_*") if p.is_dir())
    assert len(left) <= 2 and all((run_dir / n / "state.safetensors").is_file() for n in left), left
