"""Critic heads (`train.head`): one module each, one protocol (harnessrl.heads.base)."""

from __future__ import annotations

from harnessrl.errors import ConfigError, ModelError
from harnessrl.heads.base import Head


def _heads() -> dict[str, type[Head]]:
    from harnessrl.heads.cross import CrossHead
    from harnessrl.heads.frozen import FrozenHead
    from harnessrl.heads.reader import ReaderHead

    return {h.kind: h for h in (FrozenHead, CrossHead, ReaderHead)}


def head(kind: str, for_model: bool = False) -> Head:
    """The head of this kind; an unknown kind is a ConfigError (a ModelError for a saved model's)."""
    heads = _heads()
    if kind not in heads:
        error = ModelError if for_model else ConfigError
        raise error(f"unknown critic head {kind!r}; this version has: {', '.join(sorted(heads))}")
    return heads[kind]()


def kinds() -> tuple[str, ...]:
    return tuple(sorted(_heads()))
