"""`harnessrl lineage`, `submit` and `jobs`: where a model came from, and pipelines run as Ray jobs."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommands (filled in below as they land)."""
