"""A critic on disk: `weights.safetensors` + `critic.json`. Nothing on this path unpickles.

`critic.json` holds everything needed to score: the head (`frozen`, or `cross` with the fine-tuned
trunk's config.json and tokeniser files under `trunk/`), the network config, the encoder identity
the embeddings came from, the renderer settings, the reward scale and the fallback threshold.
A critic trained on data that calls several tools also has the discrete tool head
(`tool_head.safetensors`, its config under `tool_head` and the vocabulary under `tool_vocab`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harnessrl.errors import ModelError

FORMAT_VERSION = 1
WEIGHTS = "weights.safetensors"
TOOL_WEIGHTS = "tool_head.safetensors"
OOD_REFERENCE = "ood_reference.safetensors"
CONFIG = "critic.json"


def _save_weights(net, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}, str(path))


def save_critic(directory: str | Path, net, meta: dict[str, Any], tool_head: tuple[Any, dict] | None = None) -> Path:
    """Write the bare network's weights and `meta` (which must hold `iql` and `encoder`);
    `tool_head` is (network, its DiscreteConfig dict) when there is one."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if meta.get("head") == "cross":  # a CrossScorer: the network, and the trunk's config and tokeniser beside it
        from harnessrl.algorithms.cross import save_trunk_files

        save_trunk_files(directory, net.net.trunk, net.tokenizer)
        net = net.net
    _save_weights(net, directory / WEIGHTS)
    meta = {**meta, "tool_head": None}
    if tool_head is not None:
        _save_weights(tool_head[0], directory / TOOL_WEIGHTS)
        meta["tool_head"] = tool_head[1]
    (directory / CONFIG).write_text(json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=2, sort_keys=True))
    return directory


def save_ood_reference(directory: str | Path, reference) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"states": torch.from_numpy(reference).to(torch.float16).contiguous()},
              str(Path(directory) / OOD_REFERENCE))


def load_ood_reference(directory: str | Path, meta: dict[str, Any]):
    """(reference states, threshold), or None for a critic saved without one."""
    from safetensors.torch import load_file

    path = Path(directory) / OOD_REFERENCE
    if not meta.get("ood") or not path.is_file():
        return None
    return load_file(str(path))["states"].float().numpy(), float(meta["ood"]["threshold"])


def load_tool_head(directory: str | Path, meta: dict[str, Any]):
    """The discrete tool head in eval mode, or None when the critic has none."""
    from safetensors.torch import load_file

    from harnessrl.algorithms.discrete import DiscreteConfig, DiscreteNetwork

    if not meta.get("tool_head"):
        return None
    path = Path(directory) / TOOL_WEIGHTS
    if not path.is_file():
        raise ModelError(f"{directory}: critic.json names a tool head but {TOOL_WEIGHTS} is missing")
    net = DiscreteNetwork(DiscreteConfig(**meta["tool_head"]))
    net.load_state_dict(load_file(str(path)))
    return net.eval()


def load_critic_files(directory: str | Path, device: str | None = None):
    """(network in eval mode, meta) from a critic folder; for a cross head the network is a CrossScorer
    whose trunk goes to `device` (default: a GPU when one is visible; the frozen head's MLP stays on the CPU)."""
    from safetensors.torch import load_file

    from harnessrl.algorithms.iql import IQLConfig, IQLNetwork

    directory = Path(directory)
    if not (directory / CONFIG).is_file() or not (directory / WEIGHTS).is_file():
        raise ModelError(f"{directory} is not a critic folder (needs {CONFIG} and {WEIGHTS})")
    try:
        meta = json.loads((directory / CONFIG).read_text())
    except (ValueError, OSError) as exc:
        raise ModelError(f"{directory / CONFIG} is not readable JSON: {exc}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise ModelError(f"{directory}: critic format {meta.get('format_version')} is not {FORMAT_VERSION}")
    if meta.get("head") == "cross":
        from harnessrl.algorithms.cross import CrossConfig, load_cross_network

        return load_cross_network(directory, CrossConfig(**meta["iql"]), load_file(str(directory / WEIGHTS)),
                                  device), meta
    net = IQLNetwork(IQLConfig(**meta["iql"]))
    net.load_state_dict(load_file(str(directory / WEIGHTS)))
    net.eval()
    return net, meta
