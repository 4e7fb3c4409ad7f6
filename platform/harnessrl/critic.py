"""The public critic: load a trained model, score candidate actions for a state.

    critic = Critic.load("harnessrl-critic@champion")   # or NAME/VERSION, models:/..., a critic folder
    critic.score("Task: ...\\nNow: ...", ["open door", "go north"])  # -> [q0, q1]

Scores are Q(s, a) in reward units (higher is better). `decide` adds the best index and the
fallback flag: the best score below the model's threshold means "no candidate is good enough".
Send the state as `{task, history, observation}` rather than rendered text when you can: the
history features (how often a candidate was already tried, ...) are computed from it.
`select_tool` gives the tool head's policy over the tool vocabulary, when the model has one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from harnessrl import registry
from harnessrl.config import PRIOR_WEIGHT
from harnessrl.embedding_lru import EmbeddingLRU
from harnessrl.encoders import load_encoder
from harnessrl.errors import ModelError
from harnessrl.features import repeats_here
from harnessrl.model_card import ModelCard
from harnessrl.model_files import load_critic_files, load_ood_reference, load_tool_head
from harnessrl.ood import is_ood
from harnessrl.render import Renderer, RequestState

State = str | dict[str, Any]


@dataclass
class ToolChoice:
    tools: list[str]
    probabilities: list[float]
    choice: str


@dataclass
class Prepared:
    """Requests parsed once: the rendered states and every distinct text to embed (states first)."""

    requests: list[tuple[State, Sequence[str]]]
    parsed: list[RequestState]
    texts: list[str]


@dataclass
class Decision:
    scores: list[float]
    best_index: int
    fallback: bool
    reason: str | None
    ood: bool | None = None  # state far from every training state (None: the model keeps no reference)
    repeats: list[int] | None = None  # candidates passed over as repeats (None: the rule was off)
    ranking: list[float] | None = None  # what ranked when not the scores: score + w * log pi (a prior blended)


class Critic:
    """A trained critic: its model card, its head's scorer, the renderer and the encoder it was
    trained with, the LRU of embeddings, the tool head and the OOD reference when it has them."""

    def __init__(self, scorer, card: ModelCard, name: str | None = None, version: str | None = None, encoder=None,
                 tool_head=None, cache_size: int = 50_000, ood_reference=None):
        import torch

        self.scorer, self.card, self.tool_head, self.ood_reference = scorer, card, tool_head, ood_reference
        self.renderer = Renderer(card.render)
        self.tool_vocab: list[str] = list(card.tool_vocab)
        self.uses_features = card.uses_features
        self.name = name or card.model_name or "local"
        self.version = version
        self.identity = card.identity
        self.threshold = card.fallback_threshold
        self.reward_scale = float(card.reward_scale)
        self._torch = torch
        self._encoder = encoder
        self.lru = EmbeddingLRU(cache_size)  # by text
        self._lock = threading.Lock()  # one encoder call at a time: the service's worker threads share it

    @classmethod
    def load(cls, uri: str | Path, device: str | None = None, with_encoder: bool = True) -> "Critic":
        """From a registry model (`NAME@ALIAS`, `NAME/VERSION`, `models:/...`) or a local critic
        folder (`registry.resolve`); `device` (e.g. "cuda") is where the encoder and a head's
        trunk run (default: a GPU when one is visible).

        `with_encoder=False` loads no sentence encoder: every embedding must then be given to
        `encode` (the service's encoder deployment computes them)."""
        found = registry.resolve(uri)
        uri, path, name, version = found.uri, found.path, found.name, found.version
        scorer, card = load_critic_files(path, device)
        encoder = None
        if with_encoder:
            ident = card.identity
            encoder, identity = load_encoder(ident.model_name, device, ident.max_seq_length, ident.precision)
            card.check_encoder(identity, f"critic {uri}")
        return cls(scorer, card, name=name, version=version, encoder=encoder, tool_head=load_tool_head(path, card),
                   ood_reference=load_ood_reference(path, card))

    def encode(self, texts: Sequence[str], given: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Embeddings of `texts`; repeated texts (agents resend the same task, states and candidates)
        come from the LRU (`lru`, `cache_size` entries) instead of the encoder. `given` holds
        embeddings computed elsewhere (the service's encoder deployment): they fill the misses
        they cover and enter the cache like freshly encoded ones."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.identity.dim), np.float32)
        with self._lock:
            found = self.lru.get_many(texts)
            missing = [t for t in dict.fromkeys(texts) if t not in found]
            if missing:
                new = {t: given[t] for t in missing if given and t in given}
                rest = [t for t in missing if t not in new]
                if rest:
                    if self._encoder is None:
                        raise ModelError(f"critic {self.name}: {len(rest)} text(s) neither cached nor given, and "
                                         "no encoder loaded here")
                    fresh = self._encoder.encode(rest, convert_to_numpy=True, show_progress_bar=False, batch_size=64)
                    new.update(zip(rest, fresh))
                self.lru.put_many(new)
                found.update(new)
        return np.stack([found[t] for t in texts])

    def uncached(self, texts: Sequence[str]) -> list[str]:
        """The distinct texts of `texts` the LRU does not hold (those it holds become the most
        recent, so that they are still there when `encode` runs next)."""
        return self.lru.uncached(texts)

    def parse_state(self, state: State) -> RequestState:
        return self.renderer.parse(state)

    def render_state(self, state: State) -> str:
        return self.parse_state(state).text

    def state_text(self, state: State) -> str:
        """The text whose embedding stands for the state (the OOD check's and the tool head's)."""
        return self.scorer.state_text(self.parse_state(state))

    def prepare(self, requests: Sequence[tuple[State, Sequence[str]]]) -> Prepared:
        """Render every state once and list the distinct texts a scoring of `requests` embeds (the
        head's, then the states' for the OOD check)."""
        requests = list(requests)
        parsed = [self.parse_state(s) for s, _ in requests]
        texts = self.scorer.embed_texts(parsed, [cands for _, cands in requests])
        if self.ood_reference is not None:
            texts = list(dict.fromkeys([*texts, *(self.scorer.state_text(p) for p in parsed)]))
        return Prepared(requests, parsed, texts)

    def score_prepared(self, prep: Prepared, features: Sequence[Sequence[Sequence[float]]] | None = None,
                       given: dict[str, np.ndarray] | None = None, ood: bool = False
                       ) -> tuple[list[list[float]], list[bool | None]]:
        """(scores per request, OOD flag per state (None: not asked, or no reference)): one encode
        of the distinct texts, one forward pass; the OOD check reuses the states' embeddings."""
        requests, parsed = prep.requests, prep.parsed
        flags: list[bool | None] = [None] * len(requests)
        if not any(cands for _, cands in requests):
            return [[] for _ in requests], flags
        ood = ood and self.ood_reference is not None
        texts = prep.texts if ood else self.scorer.embed_texts(parsed, [cands for _, cands in requests])
        emb = dict(zip(texts, self.encode(texts, given))) if texts else {}
        if ood:
            reference, threshold = self.ood_reference
            flags = [bool(x) for x in is_ood(np.stack([emb[self.scorer.state_text(p)] for p in parsed]), reference,
                                             threshold)]
        f = None
        if self.uses_features:
            if features is None:
                features = [self.renderer.features(p.history, p.observation, cands)
                            for p, (_, cands) in zip(parsed, requests)]
            f = np.asarray([row for per_request in features for row in per_request], np.float32)
        q_raw = self.scorer.q(parsed, [cands for _, cands in requests], f,
                              lambda texts: np.stack([emb[t] for t in texts]) if texts else np.zeros((0, 0)))
        q = (np.asarray(q_raw, np.float64) / self.reward_scale).tolist()
        out, pos = [], 0
        for _, cands in requests:
            out.append(q[pos: pos + len(cands)])
            pos += len(cands)
        return out, flags

    @property
    def has_prior(self) -> bool:
        """Whether the model holds a behaviour prior (harnessrl.behaviour_prior) to rank with."""
        return bool(getattr(self.scorer, "has_prior", False))

    def prior_logprobs(self, prep: Prepared, given: dict[str, np.ndarray] | None = None) -> list[list[float]] | None:
        """log pi_beta(candidate | state) per request under the model's behaviour prior (None: it has none);
        the texts it reads are the head's own, so after `score_prepared` they come from the LRU."""
        if not self.has_prior:
            return None
        requests, parsed = prep.requests, prep.parsed
        texts = self.scorer.embed_texts(parsed, [cands for _, cands in requests])
        emb = dict(zip(texts, self.encode(texts, given))) if texts else {}
        return self.scorer.prior_logprobs(parsed, [list(cands) for _, cands in requests],
                                          lambda ts: np.stack([emb[t] for t in ts]) if ts else np.zeros((0, 0)))

    def values(self, states: Sequence[State], actions: list[str], next_states: Sequence[State], features=None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q(s, a), V(s), V(s') in reward units (offline evaluation) of states given as rendered text or
        parsed (`RequestState`, with the segments a reader head reads); `features` (n, d) are the
        actions' history features when the model uses them."""
        q, v, v2 = self.scorer.values([self.parse_state(s) for s in states], actions,
                                      [self.parse_state(s) for s in next_states], features, self.encode)
        return tuple(np.asarray(x, np.float64) / self.reward_scale for x in (q, v, v2))

    def score_batch(self, requests: Sequence[tuple[State, Sequence[str]]],
                    features: Sequence[Sequence[Sequence[float]]] | None = None) -> list[list[float]]:
        """Many (state, candidates) at once: each distinct text is encoded once, one forward pass.

        `features` (per request, per candidate) replaces the history features computed from the
        request: evaluation reads them from transition rows."""
        return self.score_prepared(self.prepare(requests), features)[0]

    def select_tool_batch(self, states: Sequence[State], given: dict[str, np.ndarray] | None = None
                          ) -> list[ToolChoice]:
        """The tool head's policy pi(tool | s) over the vocabulary, for many states at once
        (`given`: embeddings computed elsewhere, as in `encode`)."""
        if self.tool_head is None:
            raise ModelError(f"critic {self.name} has no tool head (its training data called fewer than two tools)")
        texts = [self.state_text(s) for s in states]
        if not texts:
            return []
        emb = self._torch.from_numpy(self.encode(texts, given)).float()
        with self._torch.no_grad():
            probs = self._torch.softmax(self.tool_head.pi(emb), dim=1).numpy()
        return [ToolChoice(self.tool_vocab, [float(x) for x in p], self.tool_vocab[int(np.argmax(p))]) for p in probs]

    def select_tool(self, state: State) -> ToolChoice:
        return self.select_tool_batch([state])[0]

    def score(self, state: State, candidates: Sequence[str]) -> list[float]:
        return self.score_batch([(state, candidates)])[0]

    def out_of_distribution(self, states: Sequence[State]) -> list[bool | None]:
        """Per state: farther than the model's threshold from every training state it keeps."""
        if self.ood_reference is None or not states:
            return [None] * len(states)
        reference, threshold = self.ood_reference
        texts = [self.state_text(s) for s in states]
        return [bool(x) for x in is_ood(self.encode(texts), reference, threshold)]

    def decide_scores(self, scores: list[float], ood: bool | None = None, repeats: list[int] | None = None,
                      ranking: list[float] | None = None) -> Decision:
        """The best candidate by `ranking` (default: `scores`), passing over the `repeats` unless
        every candidate is one; the fallback threshold is checked against its critic score."""
        if not scores:
            return Decision([], -1, True, "no candidates", ood, repeats)
        best = best_allowed(scores if ranking is None else ranking, repeats or ())
        if self.threshold is not None and scores[best] < self.threshold:
            return Decision(scores, best, True, f"critic score {scores[best]:.3f} of the chosen candidate below "
                            f"threshold {self.threshold:.3f}", ood, repeats, ranking)
        return Decision(scores, best, False, None, ood, repeats, ranking)

    def decide(self, state: State, candidates: Sequence[str], avoid_repeats: bool = False,
               prior_weight: float = PRIOR_WEIGHT) -> Decision:
        """Score, OOD check and the avoid_repeats rule from one parse and one encode of the state; with
        `prior_weight` w > 0 and a behaviour prior, the ranking is score + w * log pi_beta (as the
        service ranks by default; 0: the scores alone)."""
        prep = self.prepare([(state, candidates)])
        (scores,), (far,) = self.score_prepared(prep, ood=True)
        parsed = prep.parsed[0]
        priors = self.prior_logprobs(prep) if prior_weight > 0 else None
        ranking = blend(scores, priors[0] if priors else None, prior_weight)
        return self.decide_scores(scores, far, repeats_here(parsed.history, parsed.observation, candidates)
                                  if avoid_repeats else None, ranking)


def blend(scores: Sequence[float], logprobs: Sequence[float] | None, weight: float) -> list[float] | None:
    """score + weight * logprob per candidate; None when off (weight 0) or there are no logprobs."""
    if weight <= 0 or logprobs is None:
        return None
    return [s + weight * lp for s, lp in zip(scores, logprobs)]


def best_allowed(ranking: Sequence[float], avoid: Sequence[int] = ()) -> int:
    """argmax of `ranking` over the indices not in `avoid` (over all of them when none is left)."""
    skip = set(avoid)
    allowed = [i for i in range(len(ranking)) if i not in skip] or list(range(len(ranking)))
    return max(allowed, key=lambda i: ranking[i])
