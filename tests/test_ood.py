"""OOD reference: training states are in distribution, a far-away state is flagged, and the
reference round-trips through the critic folder as safetensors."""

from __future__ import annotations

import numpy as np

from harnessrl.model_card import ModelCard, OODCard
from harnessrl.model_files import load_ood_reference, save_ood_reference
from harnessrl.ood import MIN_THRESHOLD, fit_reference, is_ood


def _cluster(n, d=16, seed=0):
    rng = np.random.default_rng(seed)
    centre = np.ones(d, np.float32)
    return (centre + 0.1 * rng.standard_normal((n, d))).astype(np.float32)


def test_training_states_pass_and_a_far_state_is_flagged():
    train = _cluster(3000)
    ref, threshold = fit_reference(train)
    assert len(ref) == 2048 and threshold >= MIN_THRESHOLD
    assert is_ood(_cluster(200, seed=1), ref, threshold).mean() <= 0.05  # new draws from the same cluster
    far = -np.ones((1, 16), np.float32)
    assert is_ood(far, ref, threshold).tolist() == [True]


def test_small_corpus_uses_leave_one_out_and_floor():
    ref, threshold = fit_reference(np.repeat(_cluster(5), 3, axis=0))
    assert len(ref) == 5 and threshold >= MIN_THRESHOLD


def test_reference_round_trip(tmp_path):
    ref, threshold = fit_reference(_cluster(100))
    save_ood_reference(tmp_path, ref)
    card = ModelCard(head_config={}, encoder={}, ood=OODCard(threshold=threshold, n_reference=len(ref)))
    loaded, t = load_ood_reference(tmp_path, card)
    assert t == threshold and np.allclose(loaded, ref, atol=1e-2)
    assert load_ood_reference(tmp_path, card.model_copy(update={"ood": None})) is None


def test_the_reference_is_drawn_from_the_rows_trained_on(ray_local):
    """With task groups held out, the reference's states come from the training split only and the
    threshold's probes from the held-out one; with nothing held out, every row is trained on."""
    import pyarrow as pa
    import ray

    from harnessrl.heads.base import DriverData

    vectors = np.eye(8, dtype=np.float32)  # state i is the i-th unit vector: which rows were drawn is readable

    def rows(idx):
        return ray.data.from_arrow(pa.table({"episode_id": [f"e{i}" for i in idx], "step_idx": [0] * len(idx),
                                             "state_emb": pa.array([vectors[i].tolist() for i in idx],
                                                                   pa.list_(pa.float32(), 8))}))

    common = dict(ds=rows(range(8)), n_rows=8, feature_dim=0, feature_stats=None, reward_scale=1.0, encoder_name="t")
    data = DriverData(**common, calibration=rows([6, 7]), train=rows(range(6)), train_rows=6)
    assert data.training[1] == 6
    assert sorted(data.training_states().argmax(1).tolist()) == [0, 1, 2, 3, 4, 5]
    assert sorted(data.held_out_states().argmax(1).tolist()) == [6, 7]
    whole = DriverData(**common)
    assert whole.training == (whole.ds, 8) and whole.training_states() is None and whole.held_out_states() is None
