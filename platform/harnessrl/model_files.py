"""A critic on disk: its model card (`critic.json`, harnessrl.model_card) beside safetensors weights.
Nothing on this path unpickles.

- `weights.safetensors`: the head's network (`cross` adds `trunk/`: the trunk's config.json and
  tokeniser files; the head module says what else it needs);
- `tool_head.safetensors`: the tool head, when the card names one (`tool_head`, `tool_vocab`);
- `ood_reference.safetensors`: a sample of training states for the OOD check (float16).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harnessrl.errors import ModelError
from harnessrl.model_card import CARD_FILE, CARD_VERSION, ModelCard

FORMAT_VERSION = CARD_VERSION
WEIGHTS = "weights.safetensors"
TOOL_WEIGHTS = "tool_head.safetensors"
OOD_REFERENCE = "ood_reference.safetensors"
CONFIG = CARD_FILE


def save_weights(net, path: str | Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}, str(path))


def load_weights(net, path: str | Path) -> None:
    """Weights from safetensors into `net` (eval mode)."""
    from safetensors.torch import load_file

    try:
        net.load_state_dict(load_file(str(path)))
    except (OSError, RuntimeError) as exc:
        raise ModelError(f"{path}: cannot load the critic's weights ({exc})") from None
    net.eval()


def save_critic(directory: str | Path, scorer, card: ModelCard, tool_head: tuple[Any, dict] | None = None) -> Path:
    """The head's files (weights and what it needs), the tool head when there is one (network, its
    DiscreteConfig dict) and the card, written last."""
    from harnessrl import heads

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    heads.head(card.head).save(str(directory), scorer)
    card = card.model_copy(update={"tool_head": None})
    if tool_head is not None:
        save_weights(tool_head[0], directory / TOOL_WEIGHTS)
        card = card.model_copy(update={"tool_head": tool_head[1]})
    card.save(directory)
    return directory


def load_critic_files(directory: str | Path, device: str | None = None):
    """(scorer in eval mode, card) from a critic folder; the cross and reader heads' networks go to
    `device` (default: a GPU when one is visible); the frozen head's small MLP stays on the CPU."""
    from harnessrl import heads

    directory = Path(directory)
    if not (directory / CONFIG).is_file() or not (directory / WEIGHTS).is_file():
        raise ModelError(f"{directory} is not a critic folder (needs {CONFIG} and {WEIGHTS})")
    card = ModelCard.read(directory)
    return heads.head(card.head, for_model=True).load(str(directory), card, device), card


def save_ood_reference(directory: str | Path, reference) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"states": torch.from_numpy(reference).to(torch.float16).contiguous()},
              str(Path(directory) / OOD_REFERENCE))


def load_ood_reference(directory: str | Path, card: ModelCard):
    """(reference states, threshold), or None for a critic saved without one."""
    from safetensors.torch import load_file

    path = Path(directory) / OOD_REFERENCE
    if card.ood is None or not path.is_file():
        return None
    return load_file(str(path))["states"].float().numpy(), float(card.ood.threshold)


def load_tool_head(directory: str | Path, card: ModelCard):
    """The discrete tool head in eval mode, or None when the critic has none."""
    from harnessrl.algorithms.discrete import DiscreteConfig, DiscreteNetwork

    if not card.tool_head:
        return None
    path = Path(directory) / TOOL_WEIGHTS
    if not path.is_file():
        raise ModelError(f"{directory}: {CONFIG} names a tool head but {TOOL_WEIGHTS} is missing")
    net = DiscreteNetwork(DiscreteConfig(**card.tool_head))
    load_weights(net, path)
    return net
