"""The critic's LRU embedding cache: a repeated text is not encoded again, cached vectors equal
fresh ones, and the cache never grows past its size (real MiniLM encoder)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harnessrl.algorithms.iql import IQLConfig, IQLNetwork
from harnessrl.heads.frozen import FrozenScorer
from harnessrl.model_card import ModelCard
from harnessrl.critic import Critic
from harnessrl.encoders import load_encoder


class CountingEncoder:
    """The real encoder, counting the texts it is asked to encode."""

    def __init__(self, model):
        self.model, self.texts = model, 0

    def encode(self, texts, **kwargs):
        self.texts += len(texts)
        return self.model.encode(texts, **kwargs)


@pytest.fixture(scope="module")
def critic():
    model, identity = load_encoder("builtin:all-MiniLM-L6-v2", "cpu", 128)
    card = ModelCard(head="frozen", head_config=IQLConfig(feature_dim=5).to_dict(), encoder=json.loads(identity.to_json()),
                     render={"window": 2, "max_chars": 500})
    return Critic(FrozenScorer(IQLNetwork(IQLConfig(feature_dim=5))), card, encoder=CountingEncoder(model), cache_size=4)


def test_repeated_texts_come_from_the_cache(critic):
    enc = critic._encoder
    first = critic.encode(["a kitchen", "take coin", "a kitchen"])
    assert enc.texts == 2 and critic.lru.misses == 2 and critic.lru.hits == 1
    again = critic.encode(["take coin", "a kitchen"])
    assert enc.texts == 2 and critic.lru.hits == 3
    assert np.array_equal(again[0], first[1]) and np.array_equal(again[1], first[0])
    fresh = enc.model.encode(["take coin"], convert_to_numpy=True)
    assert np.allclose(again[0], fresh[0], atol=1e-5)


def test_cache_is_bounded_least_recently_used_first(critic):
    critic.encode(["t1", "t2", "t3", "t4", "t5"])
    assert len(critic.lru) == 4 and "t1" not in critic.lru and "t5" in critic.lru
    before = critic._encoder.texts
    critic.score({"task": "t", "history": [], "observation": "o"}, ["t5", "t4"])
    assert critic._encoder.texts == before + 1  # only the rendered state was new


def test_given_embeddings_fill_misses_and_a_critic_without_encoder_needs_them(critic):
    """The service's encoder-deployment path: `uncached` lists the misses, `given` fills them
    (counted as misses, then cached) and the scores equal those of the critic's own encoder."""
    from harnessrl.errors import ModelError

    enc = critic._encoder
    state = {"task": "t", "history": [{"action": "go", "observation": "a hall"}], "observation": "a hall"}
    prep = critic.prepare([(state, ["look", "go"])])
    critic.lru.clear()
    missing = critic.uncached(prep.texts)
    assert missing == prep.texts and len(missing) == 3
    given = dict(zip(missing, enc.model.encode(missing, convert_to_numpy=True)))
    before, misses = enc.texts, critic.lru.misses
    scores, ood = critic.score_prepared(prep, given=given, ood=True)
    assert enc.texts == before and critic.lru.misses == misses + 3 and ood == [None]
    assert critic.uncached(prep.texts) == []
    assert np.allclose(scores[0], critic.score(state, ["look", "go"]), atol=1e-6)

    bare = Critic(critic.scorer, critic.card, encoder=None, cache_size=4)
    with pytest.raises(ModelError, match="no encoder loaded here"):
        bare.score(state, ["look", "go"])
    assert np.allclose(bare.score_prepared(bare.prepare([(state, ["look", "go"])]), given=given)[0][0], scores[0],
                       atol=1e-6)
