"""Checkpoints and critic folders: exact round trips through safetensors + JSON, and no pickle
anywhere on the load path."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from harnessrl import model_files
from harnessrl.algorithms.iql import IQLConfig, IQLLearner, IQLNetwork
from harnessrl.errors import ModelError
from harnessrl.heads.frozen import FrozenScorer
from harnessrl.model_card import ModelCard
from harnessrl.model_files import load_critic_files, save_critic
from harnessrl.training_state import load_network_weights, load_training_state, save_training_state

CFG = IQLConfig(state_dim=4, action_dim=4, hidden_dim=8, lr=1e-2)


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _batch(seed=0, n=8, d=4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g), torch.randn(n, d, generator=g), torch.randn(n, generator=g),
            torch.randn(n, d, generator=g), (torch.rand(n, generator=g) < 0.5).float())


def _trained(seed: int, steps: int = 3) -> IQLLearner:
    torch.manual_seed(seed)
    learner = IQLLearner(CFG)
    for i in range(steps):
        learner.update(*_batch(i))
    return learner


def _assert_same_tensors(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _assert_same_opt(a: torch.optim.Optimizer, b: torch.optim.Optimizer):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["state"].keys() == sb["state"].keys() and len(sa["state"]) > 0
    for idx in sa["state"]:
        assert sa["state"][idx].keys() == sb["state"][idx].keys()
        for name, value in sa["state"][idx].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(sb["state"][idx][name])), (idx, name)
    ga, gb = sa["param_groups"], sb["param_groups"]
    assert [(g["lr"], tuple(g["betas"]), g["eps"], g["params"]) for g in ga] == \
           [(g["lr"], tuple(g["betas"]), g["eps"], g["params"]) for g in gb]


@pytest.fixture
def saved(tmp_path):
    learner = _trained(seed=0)
    save_training_state(tmp_path, learner.core, learner.target_q, learner.opt, step=3, extra={"iql": CFG.to_dict()})
    return tmp_path, learner


def test_training_state_round_trip_is_exact(saved):
    path, original = saved
    restored = _trained(seed=1, steps=1)  # different weights and optimiser state before loading
    assert not torch.equal(restored.core.v.v[0].weight, original.core.v.v[0].weight)
    meta = load_training_state(path, restored.core, restored.target_q, restored.opt)
    assert meta["step"] == 3 and meta["iql"] == CFG.to_dict()
    _assert_same_tensors(original.core.state_dict(), restored.core.state_dict())
    _assert_same_tensors(original.target_q.state_dict(), restored.target_q.state_dict())
    _assert_same_opt(original.opt, restored.opt)


def test_training_continues_identically_after_restore(saved):
    path, original = saved
    restored = _trained(seed=1, steps=1)
    load_training_state(path, restored.core, restored.target_q, restored.opt)
    for i in range(2):
        m1 = original.update(*_batch(100 + i))
        m2 = restored.update(*_batch(100 + i))
        assert m1 == m2
    _assert_same_tensors(original.core.state_dict(), restored.core.state_dict())
    _assert_same_tensors(original.target_q.state_dict(), restored.target_q.state_dict())


def test_fresh_optimiser_would_diverge(saved):
    """Control for the test above: without the optimiser state the next step differs."""
    path, original = saved
    restored = _trained(seed=1, steps=1)
    load_network_weights(path, restored.core)
    restored.target_q.load_state_dict(original.target_q.state_dict())
    restored.opt = torch.optim.Adam(restored.core.parameters(), lr=CFG.lr)
    original.update(*_batch(100))
    restored.update(*_batch(100))
    assert not torch.equal(original.core.v.v[0].weight, restored.core.v.v[0].weight)


def test_load_network_weights_only(saved):
    path, original = saved
    net = IQLNetwork(CFG)
    load_network_weights(path, net)
    _assert_same_tensors(original.core.state_dict(), net.state_dict())


# ---- critic folders ---------------------------------------------------------------------------
CARD = ModelCard(head="frozen", head_config=CFG.to_dict(), fallback_threshold=-0.5,
                 encoder={"model_name": "m", "weights_hash": "sha256:0", "dim": 4, "normalize": True,
                          "max_seq_length": 128})


def test_critic_round_trip(tmp_path):
    net = _trained(seed=2).core
    out = save_critic(tmp_path / "critic", FrozenScorer(net), CARD)
    assert json.loads((out / model_files.CONFIG).read_text())["format_version"] == model_files.FORMAT_VERSION
    scorer, card = load_critic_files(out)
    loaded = scorer.net
    assert not loaded.training
    _assert_same_tensors(net.state_dict(), loaded.state_dict())
    assert card == CARD
    s, a = torch.randn(3, 4), torch.randn(3, 4)
    net.eval()
    with torch.no_grad():
        assert torch.equal(net.q.min_q(s, a), loaded.q.min_q(s, a))


def _forbid_pickle(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("pickle used on the load path")

    class NoUnpickler:
        def __init__(self, *args, **kwargs):
            boom()

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "Unpickler", NoUnpickler)
    monkeypatch.setattr(torch, "load", boom)


def test_patched_pickle_really_raises(monkeypatch):
    _forbid_pickle(monkeypatch)
    with pytest.raises(AssertionError):
        pickle.loads(pickle.dumps(1))
    with pytest.raises(AssertionError):
        torch.load("anything")


def test_load_paths_do_not_unpickle(tmp_path, saved, monkeypatch):
    path, original = saved
    save_critic(tmp_path / "critic", FrozenScorer(original.core), CARD)
    restored = _trained(seed=1, steps=1)
    _forbid_pickle(monkeypatch)
    scorer, _ = load_critic_files(tmp_path / "critic")
    _assert_same_tensors(original.core.state_dict(), scorer.net.state_dict())
    load_training_state(path, restored.core, restored.target_q, restored.opt)
    _assert_same_opt(original.opt, restored.opt)


@pytest.mark.parametrize("missing", [model_files.CONFIG, model_files.WEIGHTS])
def test_missing_critic_file_is_model_error(tmp_path, missing):
    out = save_critic(tmp_path / "critic", FrozenScorer(IQLNetwork(CFG)), CARD)
    (out / missing).unlink()
    with pytest.raises(ModelError, match="not a critic folder"):
        load_critic_files(out)


def test_missing_critic_folder_is_model_error(tmp_path):
    with pytest.raises(ModelError):
        load_critic_files(tmp_path / "nothing-here")


@pytest.mark.parametrize("version", [0, 3, "1", None])
def test_wrong_format_version_is_model_error(tmp_path, version):
    out = save_critic(tmp_path / "critic", FrozenScorer(IQLNetwork(CFG)), CARD)
    meta = json.loads((out / model_files.CONFIG).read_text())
    meta["format_version"] = version
    (out / model_files.CONFIG).write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="format"):
        load_critic_files(out)


def test_corrupt_critic_json_is_model_error(tmp_path):
    out = save_critic(tmp_path / "critic", FrozenScorer(IQLNetwork(CFG)), CARD)
    (out / model_files.CONFIG).write_text("{not json")
    with pytest.raises(ModelError):
        load_critic_files(out)
