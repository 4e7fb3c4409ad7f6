"""The critic head protocol: what the training loop, `Critic` and the service ask of a head.

A head is the part of a critic that differs between its kinds: what a training worker holds of
its shard and how it samples a batch, the network and its learner (losses through the shared IQL
objective, `harnessrl.algorithms.iql.iql_objective`), how the trained network is exported and
loaded, and how it scores at run time. Everything else (Ray Train, checkpoints, validation's
best-step tracking, the fallback threshold's quantile, the OOD reference, the model card, the
service) is the same for every head, so a new head is one module of `harnessrl.heads`.

Pure torch/numpy/pyarrow: no Ray here (the Ray Train loop in jobs/train.py hands each head its
shard as pyarrow batches).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Sequence

import numpy as np

Embed = Callable[[Sequence[str]], np.ndarray]  # texts -> (n, d) embeddings (the critic's encoder and LRU)


@dataclass
class DriverData:
    """What the train job's driver knows of the encoded dataset when it configures a head and
    exports it: the dataset (a Ray dataset, read by the head's own methods), its size, the history
    features' statistics, the reward scale and the encoder the embeddings came from."""

    ds: Any
    n_rows: int
    feature_dim: int
    feature_stats: list | None
    reward_scale: float
    encoder_name: str
    seed: int = 0
    stats: Any = None  # harnessrl.encoded_data.DataStats: one streaming pass's counts, tools, state sample
    vectors: np.ndarray | None = None  # the distinct-text table the rows' references point into (None: copies)
    encoded_dir: str = ""  # the encoded dataset (its `_texts` table: every distinct text's embedding)
    calibration: Any = None  # held-out rows (task groups kept out of training): the thresholds are set on them
    train: Any = None  # the rows trained on when some are held out (None: all of `ds`)
    train_rows: int = 0  # their number

    @property
    def training(self) -> tuple[Any, int]:
        """(rows trained on, their number): the OOD reference is drawn from these, never from the held-out
        rows its threshold is set on (a probe that finds itself in the reference is at distance 0)."""
        return (self.train, self.train_rows) if self.train is not None else (self.ds, self.n_rows)

    @property
    def calibration_rows(self):
        """The rows the fallback threshold is set on: the held-out ones, else the training data."""
        return self.calibration if self.calibration is not None else self.ds

    @property
    def calibration_n(self) -> int:
        """How many `calibration_rows` there are: the rows not trained on, else all of them."""
        return self.n_rows - self.train_rows if self.calibration is not None else self.n_rows

    def calibration_arrays(self):
        """The calibration rows as training arrays (vectors gathered), a batch at a time."""
        from harnessrl.encoded_data import load_arrays

        for b in self.calibration_rows.iter_batches(batch_size=8192, batch_format="pyarrow"):
            yield load_arrays([b], candidates=False, vectors=self.vectors)

    def sample(self, ds, n_rows: int, limit: int, columns: list[str] | None = None):
        """A keyed sample (`encoded_data.sampled`) of about `limit` of the `n_rows` rows of `ds`, a
        batch at a time: bounded, whatever the corpus; `columns`: those only (and the row keys)."""
        from harnessrl.encoded_data import sampled

        share = limit / max(n_rows, 1)
        if columns is not None:
            ds = ds.select_columns(["episode_id", "step_idx", *columns])
        for b in ds.iter_batches(batch_size=8192, batch_format="pyarrow"):
            yield sampled(b, share, self.seed)

    def held_out_states(self) -> np.ndarray | None:
        """A seeded sample of the held-out rows' state vectors (the OOD threshold's probes); None
        without held-out rows or rendered-state vectors."""
        from harnessrl.encoded_data import HELD_OUT_STATES

        if self.calibration is None:
            return None
        return self._state_vectors(self.calibration, self.calibration_n, HELD_OUT_STATES)

    def training_states(self) -> np.ndarray | None:
        """A seeded sample of the training split's state vectors (the OOD reference) when rows are held
        out; None otherwise (then every row is trained on and DataStats' sample of them serves)."""
        from harnessrl.encoded_data import SAMPLE_STATES

        return self._state_vectors(*self.training, SAMPLE_STATES) if self.train is not None else None

    def _state_vectors(self, ds, n_rows: int, limit: int) -> np.ndarray | None:
        from harnessrl.encoded_data import vectors_of

        parts = []
        for b in self.sample(ds, n_rows, limit):
            v = vectors_of(b, "state_emb", self.vectors)
            if v is None:
                return None
            parts.append(v)
        return np.concatenate(parts) if parts else None


class Shard:
    """A training worker's part of a dataset: `iter_batches` is its reader's (Ray Train's
    DataIterator.iter_batches), `vectors` the table its references point into. Iterated, it yields
    its pyarrow batches once (heads that hold their rows); `tables` yields batches of exactly
    `batch_size` rows for ever, epoch after epoch through a local shuffle buffer (`stream`: the same
    as training arrays), so a worker holds a buffer of rows, never its whole shard."""

    def __init__(self, iter_batches: Callable, vectors: np.ndarray | None = None):
        self.iter_batches, self.vectors = iter_batches, vectors

    def __iter__(self):
        return iter(self.iter_batches(batch_size=4096, batch_format="pyarrow"))

    def sample(self, batch_size: int, seed: int, candidates: bool = True):
        """Training arrays of `batch_size` rows drawn uniformly (with replacement) from the whole
        shard, gathered into memory once (`train.replay: memory`)."""
        from harnessrl.encoded_data import load_arrays

        rows = load_arrays(self, candidates, self.vectors)
        n, rng = shard_size(rows), np.random.default_rng(seed)
        while True:
            idx = rng.integers(0, n, batch_size)
            yield {k: v[idx] for k, v in rows.items()}

    def stream(self, batch_size: int, seed: int, shuffle_buffer: int, candidates: bool = True):
        """Training arrays (vectors gathered) of each `tables` batch."""
        from harnessrl.encoded_data import load_arrays

        for table in self.tables(batch_size, seed, shuffle_buffer):
            yield load_arrays([table], candidates, self.vectors)

    def tables(self, batch_size: int, seed: int, shuffle_buffer: int):
        """pyarrow batches of exactly `batch_size` rows for ever, epoch after epoch through a local
        shuffle buffer of `shuffle_buffer` rows (0: in stored order)."""
        import pyarrow as pa

        pending, epoch = None, 0
        while True:
            shuffle = {"local_shuffle_buffer_size": shuffle_buffer, "local_shuffle_seed": seed + epoch} \
                if shuffle_buffer else {}
            rows = 0
            for b in self.iter_batches(batch_size=batch_size, batch_format="pyarrow", prefetch_batches=2, **shuffle):
                rows += b.num_rows
                pending = b if pending is None else pa.concat_tables([pending, b])
                while pending.num_rows >= batch_size:  # a shard smaller than a batch fills it over epochs
                    yield pending.slice(0, batch_size)
                    pending = pending.slice(batch_size)
            if rows == 0:
                raise RuntimeError("a training worker got an empty shard")
            epoch += 1


class Learners:
    """The learners a worker steps and checkpoints: the critic and, for heads that have one, the tool
    head. Each learner has `core` (the bare network), `target_q` (or None) and `opt`."""

    def __init__(self, critic, tools=None):
        self.critic, self.tools = critic, tools

    @classmethod
    def with_tool_head(cls, critic, config: dict, wrap) -> "Learners":
        """The critic and, when the loop config names one (`tool_head`), the tool head's learner."""
        from harnessrl.algorithms.discrete import DiscreteConfig, DiscreteLearner, DiscreteNetwork

        if not config.get("tool_head"):
            return cls(critic)
        tool_cfg = DiscreteConfig(**config["tool_head"])
        return cls(critic, DiscreteLearner(tool_cfg, wrap(DiscreteNetwork(tool_cfg))))

    def update_tools(self, vocab: Sequence[str], s, tools: Sequence[str], r, s2, done) -> dict[str, float]:
        """One step of the tool head (if any) on state vectors `s`, `s2` and the tools called, weighted
        by the critic's advantage of the taken action in the batch it just stepped on."""
        if self.tools is None:
            return {}
        import torch

        from harnessrl.features import tool_ids

        tool = torch.tensor(tool_ids(vocab, list(tools)), device=s.device)
        return {f"tool_{k}": v for k, v in self.tools.update(s, tool, r, s2, done, adv=self.critic.advantage).items()}

    def parts(self):
        yield "state", self.critic
        if self.tools is not None:
            yield "tools", self.tools

    def save(self, directory: str, step: int, extra: dict) -> None:
        from harnessrl.training_state import save_training_state

        for name, lr in self.parts():
            save_training_state(directory, lr.core, lr.target_q, lr.opt, step, extra, name=name)

    def load(self, directory: str) -> int:
        from harnessrl.training_state import load_training_state

        return min(load_training_state(directory, lr.core, lr.target_q, lr.opt, name=name)["step"]
                   for name, lr in self.parts())


class Validation(ABC):
    """Held-out task groups scored every `log_every` steps: the critic's TD error on transitions of
    tasks it never trained on, |Q(s, a) - (r + gamma (1 - done) V(s'))| in scaled reward units.
    Every rank scores the same data with the same (DDP-synchronised) weights, so all ranks agree
    on the best step and on stopping early without talking to each other. Heads say how to score."""

    def __init__(self):
        self.reset_best()

    @abstractmethod
    def score(self, learners: Learners) -> float:
        """The held-out TD error of the learners' current critic."""

    def reset_best(self) -> None:
        self.best_value, self.best_step, self.since_best = float("inf"), 0, 0
        self.best: dict[str, dict] = {}  # learner name -> state dict copy of the best weights

    def observe(self, step: int, value: float, learners: Learners) -> None:
        if value < self.best_value:
            self.best_value, self.best_step, self.since_best = value, step, 0
            self.best = {name: {k: v.detach().clone() for k, v in lr.core.state_dict().items()}
                         for name, lr in learners.parts()}
        else:
            self.since_best += 1

    def save(self, directory: str) -> dict[str, Any]:
        from harnessrl.training_state import save_network_weights

        for name, weights in self.best.items():
            save_network_weights(directory, weights, f"best-{name}")
        return {"best_step": self.best_step, "best_value": self.best_value, "since_best": self.since_best}

    def restore(self, directory: str, state: dict[str, Any] | None, learners: Learners) -> None:
        from safetensors.torch import load_file

        if not state or not state.get("best_step"):
            return
        self.best_value, self.best_step, self.since_best = state["best_value"], state["best_step"], state["since_best"]
        self.best = {name: {k[4:]: v for k, v in load_file(os.path.join(directory, f"best-{name}.safetensors")).items()}
                     for name, _ in learners.parts()}


@dataclass
class WorkerSetup:
    """What a training worker runs: the learners, one gradient step (`step(generator) -> metrics`)
    and the held-out validation (None without validation data)."""

    learners: Learners
    step: Callable[[Any], dict[str, float]]
    validation: Validation | None


def exported_tool_head(checkpoint_dir, config: dict, prefix: str) -> tuple[Any, dict] | None:
    """The tool head's trained network and config from a checkpoint (None when the loop had none)."""
    if not config.get("tool_head"):
        return None
    from harnessrl.algorithms.discrete import DiscreteConfig, DiscreteNetwork
    from harnessrl.training_state import load_network_weights

    net = DiscreteNetwork(DiscreteConfig(**config["tool_head"]))
    load_network_weights(checkpoint_dir, net, name=f"{prefix}tools")
    return net, config["tool_head"]


@dataclass
class Exported:
    """A trained head after training: its scorer (the chosen weights), the raw Q values of a sample
    of steps of successful episodes (held-out ones when there are: the fallback threshold is their
    low quantile), the tool head (network, DiscreteConfig dict) when the head trained one, and the
    state embeddings the OOD check keeps (training states) and is calibrated on (held-out states)."""

    scorer: "Scorer"
    success_q: np.ndarray
    tool_head: tuple[Any, dict] | None = None
    ood_states: np.ndarray | None = None  # embeddings of training states for the OOD reference (None: the state_emb)
    ood_held_out: np.ndarray | None = None  # the same for held-out states, to calibrate its threshold


class Scorer(ABC):
    """A head at run time. States come parsed (`harnessrl.render.RequestState`: the rendered text,
    and the turns the history features were computed from); values are raw (in the scaled reward
    units training used; `Critic` divides by the reward scale)."""

    uses_features: bool = False

    def state_text(self, state) -> str:
        """The one text of a parsed state whose embedding stands for it: what the OOD check compares
        with its reference and the tool head reads."""
        return state.text

    @abstractmethod
    def embed_texts(self, states: Sequence[Any], candidates: Sequence[Sequence[str]]) -> list[str]:
        """The texts whose sentence embeddings `q` reads (`Critic` encodes them once, through its LRU)."""

    @abstractmethod
    def q(self, states: Sequence[Any], candidates: Sequence[Sequence[str]], features, embed: Embed) -> np.ndarray:
        """min twin Q of every (state, candidate) pair, flattened in request order. `features`:
        (n_pairs, d_f) float32 array of history features, or None when the head uses none."""

    @abstractmethod
    def values(self, states: Sequence[Any], actions: list[str], next_states: Sequence[Any], features, embed: Embed
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q(s, a), V(s), V(s') of parsed states (offline evaluation)."""


class Head(ABC):
    """One kind of critic head (`train.head`)."""

    kind: ClassVar[str]

    @abstractmethod
    def loop_config(self, cfg, data: DriverData) -> dict[str, Any]:
        """The head's entries of the train loop's config (JSON-able): at least `network`, its
        network configuration, which the model card saves as `head_config`."""

    @abstractmethod
    def worker(self, config: dict[str, Any], shard: Iterable, val: Iterable | None, world: int, device,
               wrap: Callable | None = None) -> WorkerSetup:
        """Inside a Ray Train worker: `shard` / `val` are the worker's data (a `Shard`, or any iterable
        of pyarrow batches for heads that hold their rows); `wrap` puts a network on the worker's
        device and wraps it for DDP (the train loop's; default: to `device`)."""

    @abstractmethod
    def export(self, checkpoint_dir: str, config: dict[str, Any], prefix: str, data: DriverData) -> Exported:
        """The trained head from a finished run's checkpoint (`prefix` "best-" for the weights of
        the best validation, "" for the last)."""

    @abstractmethod
    def save(self, directory: str, scorer: Scorer) -> None:
        """The scorer's weights (safetensors) and any file it needs besides the card."""

    @abstractmethod
    def load(self, directory: str, card, device: str | None) -> Scorer:
        """A saved head (card: its ModelCard), in eval mode."""


def successful_mask(outcome_success: np.ndarray) -> np.ndarray:
    """Rows of successful episodes; all rows when no episode succeeded."""
    return outcome_success if outcome_success.any() else np.ones(len(outcome_success), bool)


def shard_size(rows: dict) -> int:
    """The rows in a worker's shard; a shard with none is a bug of the split, said as one."""
    n = len(rows["reward"])
    if n == 0:
        raise RuntimeError("a training worker got an empty shard")
    return n


def tool_head_config(cfg, tools: Iterable[str] | Counter, state_dim: int, defined: Sequence[str] = ()
                     ) -> tuple[dict | None, list[str]]:
    """The tool head's DiscreteConfig (as a dict) and vocabulary (tools called, then tools defined
    but never called, capped at `max_tools`), or (None, vocab) when there is nothing to choose
    between (fewer than two tools) or it is switched off."""
    from harnessrl.algorithms.discrete import DiscreteConfig
    from harnessrl.features import tool_vocabulary

    vocab = tool_vocabulary(Counter(tools), cfg.max_tools, defined)
    if cfg.tool_head == "none" or len(vocab) < 2:
        return None, vocab
    head = DiscreteConfig(state_dim=state_dim, n_actions=len(vocab), hidden_dim=cfg.hidden_dim, gamma=cfg.gamma,
                          expectile=cfg.expectile, polyak=cfg.polyak, lr=cfg.lr, method=cfg.tool_head,
                          awr_beta=cfg.awr_beta, bf16=cfg.precision == "bfloat16")
    return head.to_dict(), vocab
