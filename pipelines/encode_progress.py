"""The encode stage's progress line: counters kept by a Ray actor, logged from a driver thread
while the texts are encoded (the stage's long phase: minutes to hours on a large corpus)."""

from __future__ import annotations

import logging
import threading
import time

from harnessrl import console

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 30.0  # between progress lines while texts are encoded


class _Progress:
    """The run's counters for the driver's progress line (a Ray actor, no CPU reserved): input
    files scanned and texts encoded so far."""

    def __init__(self):
        self.files, self.texts = 0, 0

    def scanned(self) -> None:
        self.files += 1

    def encoded(self, n: int) -> None:
        self.texts += n

    def snapshot(self) -> tuple[int, int]:
        return self.files, self.texts


def progress_line(encoded: int, to_encode: int, files_done: int, files: int, seconds: float) -> str:
    """What the stage has done so far. Until every file is scanned the total is not known yet,
    so there is no share and no time left."""
    rate = encoded / seconds if seconds > 0 else 0.0
    if files_done < files:
        return (f"encode: {encoded:,} texts encoded of {to_encode:,} found so far (scanned {files_done}/{files} "
                f"files), {rate:.0f} texts/s")
    left = max(to_encode - encoded, 0)
    eta = f", about {_duration(left / rate)} left" if rate > 0 and left else ""
    return (f"encode: {encoded:,} of {to_encode:,} texts encoded ({encoded / max(to_encode, 1):.0%}), "
            f"{rate:.0f} texts/s{eta}")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class _ProgressLog:
    """Logs `progress_line` every `every` seconds from a driver thread while the texts are
    encoded (the stage's long phase: minutes to hours on a large corpus)."""

    def __init__(self, progress, registries: list, files: int, every: float | None):
        self.progress, self.registries, self.files, self.every = progress, registries, files, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="encode-progress")
        self._start = time.time()

    def _run(self) -> None:
        import ray

        every = min(self.every, 2.0) if console.bars_on() else self.every  # a bar moves more often than a line
        while not self._stop.wait(every):
            try:
                files_done, encoded = ray.get(self.progress.snapshot.remote(), timeout=10)
                counts = ray.get([r.counts.remote() for r in self.registries], timeout=10)
            except Exception:  # a late or failed poll only skips a line
                continue
            to_encode = sum(d - c for d, c in counts)
            total = to_encode if files_done >= self.files else None  # known once every file is scanned
            log.info("%s", progress_line(encoded, to_encode, files_done, self.files, time.time() - self._start),
                     extra=console.progress("encode", encoded, total, "texts"))

    def __enter__(self):
        if self.progress is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
