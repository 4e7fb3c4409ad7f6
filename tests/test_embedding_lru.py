"""The one embedding LRU (harnessrl.embedding_lru), kept by the critic and the encoder deployment:
least recently used out first, hits and misses per key looked up, and consistent under threads."""

from __future__ import annotations

import threading

import numpy as np

from harnessrl.embedding_lru import EmbeddingLRU


def _vec(i: int) -> np.ndarray:
    return np.full(4, float(i), np.float32)


def test_least_recently_used_goes_first():
    lru = EmbeddingLRU(3)
    lru.put_many({k: _vec(i) for i, k in enumerate("abc")})
    assert lru.get_many(["a"]).keys() == {"a"}  # a is now the most recent: b is the oldest
    lru.put_many([("d", _vec(3))])
    assert "b" not in lru and {"a", "c", "d"} == {k for k in "abcd" if k in lru} and len(lru) == 3
    assert lru.uncached(["c", "x", "x"]) == ["x"]  # c refreshed: a is the oldest now
    lru.put_many({"e": _vec(4)})
    assert "a" not in lru and "c" in lru
    np.testing.assert_array_equal(lru.get_many(["e"])["e"], _vec(4))


def test_hits_and_misses_per_key_looked_up():
    lru = EmbeddingLRU(8)
    assert lru.get_many(["a", "b", "a"]) == {}
    assert lru.stats() == {"hits": 1, "misses": 2, "size": 0}  # the second "a" of one lookup is a hit
    lru.put_many({"a": _vec(1)})
    found = lru.get_many(["a", "c"])
    assert list(found) == ["a"] and lru.stats() == {"hits": 2, "misses": 3, "size": 1}
    lru.uncached(["a", "z"])  # asks, fetches nothing: not counted
    assert lru.stats()["hits"] == 2 and lru.stats()["misses"] == 3


def test_size_zero_keeps_nothing_and_a_smaller_size_evicts_on_the_next_put():
    none = EmbeddingLRU(0)
    none.put_many({"a": _vec(1)})
    assert len(none) == 0 and none.get_many(["a"]) == {} and none.misses == 1
    lru = EmbeddingLRU(4)
    lru.put_many({k: _vec(i) for i, k in enumerate("abcd")})
    lru.size = 2
    lru.put_many({"e": _vec(5)})
    assert [k for k in "abcde" if k in lru] == ["d", "e"]
    lru.clear()
    assert len(lru) == 0 and lru.stats()["size"] == 0


def test_threads_share_one_lru_consistently():
    """8 threads look up and add overlapping keys: no lost counts, never over size, every vector
    found is the one stored under its key."""
    lru, size, rounds, per = EmbeddingLRU(50), 50, 300, 6
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(rounds):
            keys = [int(k) for k in rng.integers(0, 120, per)]
            found = lru.get_many(keys)
            for k, v in found.items():
                if v[0] != k:
                    errors.append(f"key {k} holds {v[0]}")
            lru.put_many({k: _vec(k) for k in keys if k not in found})
            if len(lru) > size:
                errors.append(f"{len(lru)} entries")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = lru.stats()
    assert not errors, errors[:3]
    assert stats["hits"] + stats["misses"] == 8 * rounds * per and stats["size"] == size
    assert stats["hits"] > 0 and stats["misses"] > 0
