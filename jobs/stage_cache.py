"""Skip a stage whose output already exists for the same input and configuration.

Each finished stage leaves `<output_dir>/_stages/<stage>.json`: a key over its input's content
digest (or the key of the stage before it), its configuration and this package's version, and
its result. A rerun with the same key reuses the output and says so; any difference in input
or configuration, or `--force`, reruns the stage. The marker is removed before a stage starts,
so an interrupted run never leaves an old marker beside half-rewritten output. Training always
runs: a new model version is what a rerun asks for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from harnessrl import __version__, storage

log = logging.getLogger("harnessrl")
T = TypeVar("T")


def stage_key(stage: str, *parts: Any) -> str:
    blob = json.dumps([stage, __version__, *parts], sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def _marker(out: str, stage: str) -> str:
    return storage.join(out, "_stages", f"{stage}.json")


def run_stage(out: str, stage: str, key: str, force: bool, result_type: type[T], run: Callable[[], T],
              skipped: list[str]) -> T:
    """`run()` unless `out` holds this stage's output for `key`; appends the stage to `skipped` when reused."""
    fs, path = storage.filesystem(_marker(out, stage))
    if not force:
        try:
            with fs.open_input_stream(path) as fh:
                marker = json.loads(fh.read())
        except (FileNotFoundError, OSError, ValueError):
            marker = None
        if marker and marker.get("key") == key:
            log.info("%s: skipped, its output for the same input and configuration exists (%s); --force reruns it",
                     stage, key[:19])
            skipped.append(stage)
            return result_type(**marker["result"])
    try:
        fs.delete_file(path)
    except (FileNotFoundError, OSError):
        pass
    result = run()
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as fh:
        fh.write(json.dumps({"stage": stage, "key": key, "result": dataclasses.asdict(result)}).encode())
    return result
