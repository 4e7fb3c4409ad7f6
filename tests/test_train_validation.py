"""Checkpoint choice on held-out task groups (train.validation_fraction): the split keeps every
task on one side, the held-out TD error is what it says, the best weights survive a checkpoint
round trip, and the exported critic is the best one, not the last."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harnessrl.algorithms.iql import IQLConfig
from harnessrl.config import TrainConfig
from harnessrl.heads.base import Learners
from harnessrl.heads.frozen import FrozenValidation


def _data(n: int = 64, d: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"state_emb": rng.normal(size=(n, d)).astype(np.float32),
            "action_emb": rng.normal(size=(n, d)).astype(np.float32),
            "next_state_emb": rng.normal(size=(n, d)).astype(np.float32),
            "reward": rng.normal(size=n).astype(np.float32), "done": (rng.random(n) < 0.2).astype(np.float32)}


def _learners() -> Learners:
    from harnessrl.algorithms.iql import IQLLearner

    torch.manual_seed(0)
    return Learners(IQLLearner(IQLConfig(state_dim=8, action_dim=8, hidden_dim=16)))


def test_validation_score_is_the_held_out_td_error():
    data, learners = _data(), _learners()
    val = FrozenValidation(data, reward_scale=0.5, gamma=0.9, use_f=False)
    val.CHUNK = 10  # several chunks
    net = learners.critic.core
    with torch.no_grad():
        s, a, s2 = (torch.from_numpy(data[k]) for k in ("state_emb", "action_emb", "next_state_emb"))
        target = 0.5 * torch.from_numpy(data["reward"]) + 0.9 * (1 - torch.from_numpy(data["done"])) * net.v(s2)
        expected = float((net.q.min_q(s, a) - target).abs().mean())
    assert val.score(learners) == pytest.approx(expected, rel=1e-5)


def test_best_weights_are_kept_and_survive_a_checkpoint(tmp_path):
    learners = _learners()
    val = FrozenValidation(_data(), 1.0, 0.9, use_f=False)
    core = learners.critic.core
    val.observe(10, 1.0, learners)
    best = {k: v.clone() for k, v in core.state_dict().items()}
    with torch.no_grad():
        for p in core.parameters():
            p.add_(1.0)  # training moves on
    val.observe(20, 2.0, learners)  # worse: the step-10 weights stay the best
    assert (val.best_step, val.since_best) == (10, 1)
    state = val.save(str(tmp_path))
    again = FrozenValidation(_data(), 1.0, 0.9, use_f=False)
    again.restore(str(tmp_path), state, _learners())
    assert (again.best_step, again.best_value, again.since_best) == (10, 1.0, 1)
    for k, v in best.items():
        assert torch.equal(again.best["state"][k], v)
    val.observe(30, 0.5, learners)
    assert (val.best_step, val.since_best) == (30, 0)
    assert torch.equal(val.best["state"]["v.v.0.weight"], core.state_dict()["v.v.0.weight"])


@pytest.mark.integration
def test_training_exports_the_best_checkpoint(encoded, work):
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as pads
    import ray

    from harnessrl.encoded_data import DataStats, load_arrays, vector_table
    from harnessrl.jobs.train import split_validation, train
    from harnessrl.model_card import ModelCard
    from harnessrl.model_files import load_critic_files

    ds = ray.data.read_parquet(str(work["dir"] / "encoded" / "data")).materialize()
    stats = DataStats(ds.iter_batches(batch_size=100, batch_format="pyarrow"), ds.count(), vector_table(
        str(work["dir"] / "encoded")))
    parts, val_rows = split_validation(ds, 0.3, 0, stats.groups)
    train_groups = set(parts["train"].select_columns(["group_id"]).to_pandas()["group_id"])
    val_groups = set(parts["val"].select_columns(["group_id"]).to_pandas()["group_id"])
    assert val_groups and train_groups and not train_groups & val_groups
    assert train_groups | val_groups == set(stats.groups)
    # the held-out count comes from DataStats' pass, not from a job of its own: it is the split's
    assert parts["val"].count() == val_rows and parts["train"].count() + val_rows == ds.count()

    steps, every, patience = 400, 20, 3
    cfg = TrainConfig(head="frozen", steps=steps, batch_size=64, num_workers=1, cpus_per_worker=1, checkpoint_every=200,
                      log_every=every, validation_fraction=0.3, select="best", patience=patience, lr=3e-3)
    card = ModelCard(head_config={}, encoder=encoded.encoder, render={"window": 3, "max_chars": 1500})
    result = train(str(work["dir"] / "encoded"), str(work["dir"] / "val-train"), cfg, "val-test",
                   str(work["dir"] / "val-model"), card)
    m = result.metrics
    best_step, last = int(m["val_best_step"]), int(m["step"])
    assert m["selected_step"] == best_step and best_step % every == 0 and 0 < best_step <= last
    # ran to the end, or stopped `patience` validations after the best
    assert last == steps or last - best_step == patience * every

    # the exported critic scores the held-out rows exactly as the best validation did
    scorer, saved = load_critic_files(result.model_dir)
    rows = pads.dataset(str(work["dir"] / "encoded" / "data"), format="parquet").to_table()
    held = rows.filter(pc.is_in(rows["group_id"], value_set=pa.array(sorted(val_groups), pa.string())))
    arrays = load_arrays([held], candidates=False, vectors=vector_table(str(work["dir"] / "encoded")))
    val = FrozenValidation(arrays, saved.reward_scale, saved.gamma, use_f=saved.uses_features)

    class Exported:  # the exported network where the validation looks for it
        critic = type("C", (), {"core": scorer.net})()

    assert val.score(Exported) == pytest.approx(m["val_best_td_error"], rel=1e-4)
    assert saved.train_metrics["val_best_step"] == best_step

