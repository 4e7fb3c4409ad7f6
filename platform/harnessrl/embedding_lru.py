"""An in-memory LRU of embeddings, the one the critic (`Critic.encode`, by text) and the service's
encoder deployment (by text hash) each keep: agents resend the same task, states and candidates,
and a text seen once is not encoded again while it stays among the `size` most recent.

Thread-safe (a replica's worker threads share one). Counts are per lookup: a miss for each
distinct key not held, a hit for every other key asked for (a key repeated within one lookup
is a hit from the second time on), so hits + misses = keys looked up.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np


class EmbeddingLRU:
    def __init__(self, size: int):
        self.size = size  # entries kept; 0 or less keeps none (every lookup misses)
        self.hits = self.misses = 0
        self._items: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[Hashable]) -> dict[Hashable, np.ndarray]:
        """The held vectors of `keys` (each becomes the most recent), counted as hits and misses."""
        with self._lock:
            found: dict[Hashable, np.ndarray] = {}
            distinct = dict.fromkeys(keys)
            for key in distinct:
                vec = self._items.get(key)
                if vec is not None:
                    self._items.move_to_end(key)
                    found[key] = vec
            missed = len(distinct) - len(found)
            self.misses += missed
            self.hits += len(keys) - missed
            return found

    def put_many(self, items: Mapping[Hashable, np.ndarray] | Iterable[tuple[Hashable, np.ndarray]]) -> None:
        """Add or refresh entries as the most recent; the least recent go past `size`."""
        pairs = items.items() if isinstance(items, Mapping) else items
        with self._lock:
            if self.size <= 0:
                self._items.clear()
                return
            for key, vec in pairs:
                self._items[key] = vec
                self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def uncached(self, keys: Iterable[Hashable]) -> list[Hashable]:
        """The distinct `keys` not held, in order; those held become the most recent (so they are
        still there when the caller comes back with the rest), and nothing is counted."""
        with self._lock:
            out = []
            for key in dict.fromkeys(keys):
                if key in self._items:
                    self._items.move_to_end(key)
                else:
                    out.append(key)
            return out

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "size": len(self._items)}

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items
