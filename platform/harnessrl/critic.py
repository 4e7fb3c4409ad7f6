"""The public critic: load a trained model, score candidate actions for a state.

    critic = Critic.load("models:/harnessrl-critic@champion")   # or a local critic folder
    critic.score("Task: ...\\nNow: ...", ["open door", "go north"])  # -> [q0, q1]

Scores are Q(s, a) in reward units (higher is better). `decide` adds the best index and the
fallback flag: the best score below the model's threshold means "no candidate is good enough".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from harnessrl.encoders import EncoderIdentity, load_encoder
from harnessrl.errors import ModelError
from harnessrl.model_files import load_critic_files
from harnessrl.render import state_from_request

State = str | dict[str, Any]


@dataclass
class Decision:
    scores: list[float]
    best_index: int
    fallback: bool
    reason: str | None


class Critic:
    def __init__(self, net, meta: dict[str, Any], name: str | None = None, version: str | None = None, encoder=None):
        import torch

        self.net, self.meta = net, meta
        self.name = name or meta.get("model_name") or "local"
        self.version = version
        self.identity = EncoderIdentity.from_json(meta["encoder"])
        self.threshold = meta.get("fallback_threshold")
        self.reward_scale = float(meta.get("reward_scale", 1.0))
        self.render = meta.get("render", {"window": 4, "max_chars": 2000})
        self._torch = torch
        self._encoder = encoder

    @classmethod
    def load(cls, uri: str | Path, device: str | None = None) -> "Critic":
        """From `models:/NAME@ALIAS`, `models:/NAME/VERSION` or a local critic folder."""
        name = version = None
        uri = str(uri)
        if uri.startswith("models:/"):
            from harnessrl import registry

            found = registry.resolve(uri)
            path, name, version = found["path"], found["name"], found["version"]
        else:
            path = uri
            if not Path(path).exists():
                raise ModelError(f"no critic at {path}")
        net, meta = load_critic_files(path)
        encoder, identity = load_encoder(meta["encoder"]["model_name"], device, meta["encoder"]["max_seq_length"])
        EncoderIdentity.from_json(meta["encoder"]).check_same(identity, f"critic {uri}")
        return cls(net, meta, name=name, version=version, encoder=encoder)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self._encoder.encode(list(texts), convert_to_numpy=True, show_progress_bar=False, batch_size=64)

    def render_state(self, state: State) -> str:
        return state_from_request(state, self.render["window"], self.render["max_chars"])

    def score_batch(self, requests: Sequence[tuple[State, Sequence[str]]]) -> list[list[float]]:
        """Many (state, candidates) at once: each distinct text is encoded once, one forward pass."""
        states = [self.render_state(s) for s, _ in requests]
        texts = list(dict.fromkeys([*states, *(c for _, cands in requests for c in cands)]))
        if not texts:
            return [[] for _ in requests]
        index = {t: i for i, t in enumerate(texts)}
        emb = self._torch.from_numpy(self.encode(texts)).float()
        s_idx = [index[states[i]] for i, (_, cands) in enumerate(requests) for _ in cands]
        a_idx = [index[c] for _, cands in requests for c in cands]
        if not a_idx:
            return [[] for _ in requests]
        with self._torch.no_grad():
            q = self.net.q.min_q(emb[s_idx], emb[a_idx]).numpy() / self.reward_scale
        out, pos = [], 0
        for _, cands in requests:
            out.append([float(x) for x in q[pos: pos + len(cands)]])
            pos += len(cands)
        return out

    def score(self, state: State, candidates: Sequence[str]) -> list[float]:
        return self.score_batch([(state, candidates)])[0]

    def decide_scores(self, scores: list[float]) -> Decision:
        if not scores:
            return Decision([], -1, True, "no candidates")
        best = int(np.argmax(scores))
        if self.threshold is not None and scores[best] < self.threshold:
            return Decision(scores, best, True, f"best score {scores[best]:.3f} below threshold {self.threshold:.3f}")
        return Decision(scores, best, False, None)

    def decide(self, state: State, candidates: Sequence[str]) -> Decision:
        return self.decide_scores(self.score(state, candidates))
