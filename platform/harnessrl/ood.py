"""Out-of-distribution check for served states: far from every training state means the
critic's scores there are extrapolation (DESIGN §9 `ood`).

At training time a sample of distinct training state embeddings is kept with the model, and a
threshold is set at a high quantile of how far other training states are from that sample; a
served state farther than the threshold from all of them is flagged. Cost at serving: one
(batch x 2048) matrix product.
"""

from __future__ import annotations

import numpy as np

from harnessrl.metrics import nearest_cosine_distance

N_REFERENCE = 2048
N_PROBE = 1024
QUANTILE = 0.99
MIN_THRESHOLD = 0.05  # tiny corpora repeat states exactly: never flag near-duplicates


def fit_reference(states: np.ndarray, seed: int = 0, held_out: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """(reference sample, distance threshold) from training state embeddings. With `held_out` (states
    of task groups kept out of training) the threshold is their 99% quantile: a state of an unseen
    task from the same distribution is flagged 1% of the time. Without, other training states probe
    it (they share tasks with the reference, so unseen tasks are flagged more often)."""
    distinct = np.unique(np.asarray(states, np.float32), axis=0)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(distinct))
    ref = distinct[order[:N_REFERENCE]]
    if held_out is not None and len(held_out):
        probe = np.asarray(held_out, np.float32)
        probe = probe[rng.permutation(len(probe))[:N_PROBE]]
        return ref, max(float(np.quantile(nearest_cosine_distance(probe, ref), QUANTILE)), MIN_THRESHOLD)
    probe = distinct[order[N_REFERENCE:N_REFERENCE + N_PROBE]]
    if len(probe) == 0:  # all distinct states are in the reference: probe with leave-one-out
        probe_d = [nearest_cosine_distance(ref[i:i + 1], np.delete(ref, i, axis=0))[0]
                   for i in range(min(len(ref), N_PROBE))] if len(ref) > 1 else [0.0]
    else:
        probe_d = nearest_cosine_distance(probe, ref)
    return ref, max(float(np.quantile(probe_d, QUANTILE)), MIN_THRESHOLD)


def is_ood(states: np.ndarray, reference: np.ndarray, threshold: float) -> np.ndarray:
    return nearest_cosine_distance(states, reference) > threshold
