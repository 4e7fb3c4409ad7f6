"""Resumable training state (weights, target, optimiser, step) as safetensors + JSON, never pickle."""

from __future__ import annotations

import json
from pathlib import Path

import torch

STATE = "state.safetensors"
META = "state.json"


def _files(name: str) -> tuple[str, str]:
    """A checkpoint can hold several learners (critic, tool head), each as `name.safetensors/.json`."""
    return (STATE, META) if name == "state" else (f"{name}.safetensors", f"{name}.json")


def save_training_state(directory: str | Path, net: torch.nn.Module, target: torch.nn.Module | None,
                        opt: torch.optim.Optimizer, step: int, extra: dict | None = None, name: str = "state") -> None:
    from safetensors.torch import save_file

    directory = Path(directory)
    state_file, meta_file = _files(name)
    tensors = {f"net.{k}": v for k, v in net.state_dict().items()}
    if target is not None:  # the cross-encoder head keeps no target copy
        tensors.update({f"target.{k}": v for k, v in target.state_dict().items()})
    opt_state = opt.state_dict()
    scalars: dict[str, dict[str, float]] = {}
    for idx, st in opt_state["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value) and value.dim() > 0:
                tensors[f"opt.{idx}.{key}"] = value
            else:
                scalars.setdefault(str(idx), {})[key] = float(value)
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(directory / state_file))
    meta = {"step": step, "param_groups": opt_state["param_groups"], "opt_scalars": scalars, **(extra or {})}
    (directory / meta_file).write_text(json.dumps(meta, sort_keys=True))


def load_training_state(directory: str | Path, net: torch.nn.Module, target: torch.nn.Module | None,
                        opt: torch.optim.Optimizer, name: str = "state") -> dict:
    """Restore in place; returns the JSON meta (with `step`)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    state_file, meta_file = _files(name)
    tensors = load_file(str(directory / state_file))
    meta = json.loads((directory / meta_file).read_text())
    net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
    if target is not None:
        target.load_state_dict({k[7:]: v for k, v in tensors.items() if k.startswith("target.")})
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
    for idx, scalars in meta["opt_scalars"].items():
        for name, value in scalars.items():
            state.setdefault(int(idx), {})[name] = torch.tensor(value)
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return meta


def load_network_weights(directory: str | Path, net: torch.nn.Module, name: str = "state") -> None:
    """Only the network from a training checkpoint (for export, not for resuming)."""
    from safetensors.torch import load_file

    tensors = load_file(str(Path(directory) / _files(name)[0]))
    net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})


def save_network_weights(directory: str | Path, weights: dict[str, torch.Tensor], name: str) -> None:
    """A network's state dict alone, readable by load_network_weights (e.g. the best-so-far weights
    a checkpoint carries beside the resumable state)."""
    from safetensors.torch import save_file

    save_file({f"net.{k}": v.detach().cpu().contiguous() for k, v in weights.items()},
              str(Path(directory) / _files(name)[0]))
