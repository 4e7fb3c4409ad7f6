"""harnessrl: offline-RL critics for LLM agents, learned from the agents' own logs, on Ray.

The core package (this folder) holds the concepts; `harnessrl.pipelines`, `harnessrl.jobs`
and `harnessrl.serving` are separate top-level folders mapped into this import root.
"""

__version__ = "0.1.0"
__all__ = ["Critic", "__version__"]


def __getattr__(name: str):
    # Lazy: `import harnessrl` must stay cheap (no torch, no encoder) for the CLI and workers.
    if name == "Critic":
        from harnessrl.critic import Critic

        return Critic
    raise AttributeError(f"module 'harnessrl' has no attribute {name!r}")
