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
