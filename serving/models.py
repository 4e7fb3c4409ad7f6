"""The models a replica serves: the champion and, optionally, a challenger for a stable share of
agents. Each slot follows its registry alias: when the alias moves, the new version is loaded
beside the old one and swapped in with one assignment, so requests in flight finish on the
model they started with and none is dropped."""

from __future__ import annotations

import hashlib
import logging
import threading

from harnessrl.serving.api import ModelRef

log = logging.getLogger(__name__)


def routes_to_challenger(agent_id: str | None, share: float) -> bool:
    """Stable per agent (hash of `agent_id`), so an agent sees one model for its whole episode."""
    if share <= 0 or not agent_id:
        return False
    bucket = int.from_bytes(hashlib.sha256(agent_id.encode()).digest()[:8], "big") % 10_000
    return bucket < share * 10_000


class ModelSlot:
    """`identity` (an EncoderIdentity): the critics are loaded without an encoder of their own
    (the encoder deployment embeds for them) and each must have been trained with that encoder:
    at startup a mismatch is an error, after an alias move the old version keeps serving."""

    def __init__(self, uri: str, identity=None, cache_size: int = 50_000):
        self.uri, self.identity, self.cache_size = uri, identity, cache_size
        self.critic = self._load()
        self._lock = threading.Lock()

    def _load(self):
        from harnessrl.critic import Critic

        critic = Critic.load(self.uri, with_encoder=self.identity is None)
        critic.lru.size = self.cache_size
        if self.identity is not None:
            critic.card.check_encoder(self.identity, f"model {self.uri} (version {critic.version}) served with "
                                       "the encoder deployment (serve.encoder)")
        return critic

    @property
    def ref(self) -> ModelRef:
        return ModelRef(name=self.critic.name, version=self.critic.version)

    def refresh(self) -> bool:
        """Reload when the alias points at another version; True when it swapped."""
        from harnessrl import registry
        from harnessrl.errors import ModelError

        with self._lock:
            try:
                current = registry.current_version(self.uri)
            except Exception as exc:  # registry briefly unreachable: keep serving what we have
                log.warning("model %s: cannot check the alias (%s); keeping version %s", self.uri, exc,
                            self.critic.version)
                return False
            if current is None or current == self.critic.version:
                return False
            try:
                fresh = self._load()
            except ModelError as exc:
                log.error("model %s: the alias moved to version %s but it cannot be served here (%s); keeping "
                          "version %s", self.uri, current, exc, self.critic.version)
                return False
            log.info("model %s: alias moved %s -> %s", self.uri, self.critic.version, fresh.version)
            self.critic = fresh
            return True
