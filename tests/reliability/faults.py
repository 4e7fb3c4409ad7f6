"""Fault injection helpers for the reliability suite: find this session's Ray worker processes
by what they are running (Ray sets a worker's process title to `ray::<task or actor>`) and kill
them with SIGKILL. Only children of this session's own raylet are considered, never another
Ray on the machine."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable


def _raylet_pid() -> int:
    import ray

    node = ray._private.worker._global_node
    return node.all_processes["raylet"][0].process.pid


def _children(ppid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == ppid:
            out.append(int(entry.name))
    return out


def title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def workers_running(prefix: str) -> list[int]:
    """PIDs of this session's Ray workers whose process title starts with `ray::<prefix>`."""
    return [pid for pid in _children(_raylet_pid()) if title(pid).startswith(f"ray::{prefix}")]


class Killer(threading.Thread):
    """Waits until `ready()` holds and a worker titled `ray::<prefix>...` exists, then SIGKILLs
    it (once). Bounded: gives up after `timeout_s` and records that it did not fire."""

    def __init__(self, prefix: str, ready: Callable[[], bool], timeout_s: float = 300.0):
        super().__init__(daemon=True)
        self.prefix, self.ready, self.timeout_s = prefix, ready, timeout_s
        self.killed: list[tuple[int, str, float]] = []  # (pid, title, time)
        self._halt = threading.Event()

    def run(self) -> None:
        deadline = time.time() + self.timeout_s
        while not self._halt.is_set() and time.time() < deadline:
            if self.ready():
                for pid in workers_running(self.prefix):
                    name = title(pid)
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    self.killed.append((pid, name, time.time()))
                    return
            time.sleep(0.01)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
