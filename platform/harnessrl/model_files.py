"""A critic on disk: `weights.safetensors` + `critic.json`. Nothing on this path unpickles.

`critic.json` holds everything needed to score: the network config, the encoder identity
the embeddings came from, the renderer settings, the reward scale and the fallback threshold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harnessrl.errors import ModelError

FORMAT_VERSION = 1
WEIGHTS = "weights.safetensors"
CONFIG = "critic.json"


def save_critic(directory: str | Path, net, meta: dict[str, Any]) -> Path:
    """Write the bare network's weights and `meta` (which must hold `iql` and `encoder`)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    save_file(state, str(directory / WEIGHTS))
    (directory / CONFIG).write_text(json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=2, sort_keys=True))
    return directory


def load_critic_files(directory: str | Path):
    """(network in eval mode, meta) from a critic folder."""
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
    net = IQLNetwork(IQLConfig(**meta["iql"]))
    net.load_state_dict(load_file(str(directory / WEIGHTS)))
    net.eval()
    return net, meta
