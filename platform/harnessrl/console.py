"""The console of a command that runs Ray work (`run`, `train`, `ingest`, `evaluate`): harnessrl's
own lines, a progress bar per long stage, then the result; everything else goes to the run's
log file (`$HARNESSRL_HOME/logs/<command>-<name>-<time>.log`).

"Everything else" is Ray's and MLflow's own output: their Python loggers and warnings, what the
Ray core prints from C++ (the driver's `E core_worker ...` lines), what Ray forwards from its
workers and daemons (Ray Train's reports and tracebacks, raylet warnings) and the workers'
prints. The run's file descriptors 1 and 2 point at the log file while the command runs (so
native code and child processes land there too); the console writes to duplicates of the
original ones. Lines Ray forwards from workers are read off Ray's log stream (a handler of
`ray._private.worker.global_worker_stdstream_dispatcher` in place of Ray's printer): all go to
the file, and the training loop's `train: step S/T, ...` lines also move the train bar.

Bars are tqdm's, on a terminal only; elsewhere (a pipe, CI, a captured log) the progress comes
as the plain lines it always was. `harnessrl -v` keeps everything on the console as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Iterator

_current: "Console | None" = None
TRAIN_LINE = re.compile(r"^train: step (\d+)/(\d+)\b")


def progress(stage: str, done: float, total: float | None, unit: str = "") -> dict[str, Any]:
    """`extra=` for a log record that reports a stage's progress: a bar moves on a terminal;
    elsewhere the record prints as a line."""
    return {"progress": (stage, done, total, unit)}


class _Bars:
    def __init__(self, stream: IO[str]):
        from tqdm import tqdm

        self._tqdm, self.stream = tqdm, stream
        self.enabled = stream.isatty()
        self.bars: dict[str, Any] = {}
        self._lock = threading.Lock()

    def update(self, stage: str, done: float, total: float | None, unit: str, timer: bool = False) -> bool:
        """Moves the stage's bar (`timer`: a stage without progress of its own, shown by the time it
        has taken, and cleared when it ends); False when bars are off (print the line instead)."""
        if not self.enabled:
            return False
        with self._lock:
            bar = self.bars.get(stage)
            if bar is None:
                sized = _columns(self.stream) > 0  # a terminal that reports no width gets 100 columns
                style = {"bar_format": "{desc}: {elapsed}", "leave": False} if timer else {"leave": True}
                # `initial`: the rate counts from here (a bar first seen at step 100 did not do 100 in 0 s)
                bar = self.bars[stage] = self._tqdm(
                    total=total, initial=done, desc=stage, unit=f" {unit}" if unit else "it", file=self.stream,
                    dynamic_ncols=sized, ncols=None if sized else 100, mininterval=0.5, smoothing=0.3, **style)
            if total is not None and bar.total != total:
                bar.total = total
            bar.update(done - bar.n)
            bar.refresh()
            if total is not None and done >= total:
                self._close(stage)
        return True

    def write(self, line: str) -> None:
        if self.enabled:
            self._tqdm.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def finish(self, stage: str) -> None:
        """The stage has ended (its summary line is next): its bar closes full, not where the last
        progress report left it."""
        with self._lock:
            bar = self.bars.get(stage)
            if bar is not None and bar.total is not None:
                bar.n = bar.total
                bar.refresh()
            self._close(stage)

    def _close(self, stage: str) -> None:
        bar = self.bars.pop(stage, None)
        if bar is not None:
            bar.close()

    def close(self, stage: str | None = None) -> None:
        with self._lock:
            for name in ([stage] if stage else list(self.bars)):
                self._close(name)


def _columns(stream: IO[str]) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        return 0


class _ConsoleHandler(logging.Handler):
    """harnessrl's log records on the console: a progress record moves its bar; the rest print."""

    def __init__(self, bars: _Bars, fmt: logging.Formatter):
        super().__init__()
        self.bars = bars
        self.setFormatter(fmt)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            p = getattr(record, "progress", None)
            if p is not None and self.bars.update(*p):
                return
            self.bars.finish(record.getMessage().split(":", 1)[0])  # "encode: N texts ... in 376 s": done
            self.bars.write(self.format(record))
        except Exception:  # never let the console break the run
            self.handleError(record)


class _EveryThirtySeconds(logging.Filter):
    """The log file gets a stage's progress line at most every 30 s (the bar moves more often)."""

    def __init__(self):
        super().__init__()
        self.last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        p = getattr(record, "progress", None)
        if p is None:
            return True
        now = time.monotonic()
        if now - self.last.get(p[0], -1e9) < 30:
            return False
        self.last[p[0]] = now
        return True


class Console:
    """Use as a context manager around a command's Ray work (see the module docstring)."""

    def __init__(self, log_path: Path, logger: logging.Logger):
        self.path, self.logger = log_path, logger
        self._ray_printers: list | None = None  # Ray's own handlers of its worker-log stream, while replaced

    def __enter__(self) -> "Console":
        global _current
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a", buffering=1, encoding="utf-8", errors="replace")
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self._saved = {fd: os.dup(fd) for fd in (1, 2)}
        self.err = os.fdopen(os.dup(self._saved[2]), "w", buffering=1, encoding="utf-8", errors="replace")
        for fd in (1, 2):
            os.dup2(self.file.fileno(), fd)
        self.bars = _Bars(self.err)
        fmt = next((h.formatter for h in self.logger.handlers if h.formatter), None) or logging.Formatter()
        self._handlers = list(self.logger.handlers)
        file_handler = logging.StreamHandler(self.file)
        file_handler.setFormatter(fmt)
        file_handler.addFilter(_EveryThirtySeconds())
        self.logger.handlers = [_ConsoleHandler(self.bars, fmt), file_handler]
        _current = self
        self.logger.info("console: harnessrl's lines; Ray's and MLflow's own output goes to %s", self.path)
        return self

    def attach_ray(self) -> None:
        """Read what Ray forwards from its workers (after ray.init): all of it into the file,
        training progress also onto the train bar."""
        try:
            from ray._private import worker
        except ImportError:
            return
        dispatcher = getattr(worker, "global_worker_stdstream_dispatcher", None)
        if dispatcher is None or self._ray_printers is not None:
            return
        self._dispatcher = dispatcher
        self._ray_printers = [pair for pair in dispatcher.handlers if pair[0] == "ray_print_logs"]
        dispatcher.remove_handler("ray_print_logs")
        dispatcher.add_handler("harnessrl_console", self._worker_lines)

    def _detach_ray(self) -> None:
        """Ray's own printer back (Ray outlives the console in a process that goes on)."""
        if self._ray_printers is None:
            return
        self._dispatcher.remove_handler("harnessrl_console")
        for name, handler in self._ray_printers:
            self._dispatcher.add_handler(name, handler)
        self._ray_printers = None

    def _worker_lines(self, data: dict) -> None:
        lines = data.get("lines", [])
        if data.get("pid") == "autoscaler":  # its status table every few seconds: events only, as Ray prints
            from ray._private.worker import filter_autoscaler_events

            lines = list(filter_autoscaler_events(lines))
        who = f"({data.get('actor_name') or data.get('task_name') or data.get('pid')} pid={data.get('pid')}) "
        for line in lines:
            self.file.write(who + line + "\n")
            m = TRAIN_LINE.match(line)
            if m:
                done, total = int(m[1]), int(m[2])
                if not self.bars.update("train", done, total, "steps"):
                    self.bars.write(line)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """A bar for a stage that reports no progress of its own: it shows the time it has taken."""
        if not self.bars.enabled:
            yield
            return
        stop = threading.Event()
        start = time.time()

        def tick() -> None:
            while True:
                self.bars.update(name, int(time.time() - start), None, "s", timer=True)
                if stop.wait(1.0):
                    return

        thread = threading.Thread(target=tick, daemon=True, name=f"console-{name}")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=2)
            self.bars.close(name)

    def __exit__(self, *exc) -> None:
        global _current
        _current = None
        self._detach_ray()
        self.bars.close()
        self.logger.handlers = self._handlers
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        self.err.close()
        self.file.close()


def bars_on() -> bool:
    """Whether progress bars are shown (a console on a terminal): stages may report more often."""
    return _current is not None and _current.bars.enabled


def stage(name: str):
    """`with console.stage("ingest"):` a timer bar when a console is active, else nothing."""
    return _current.stage(name) if _current is not None else contextlib.nullcontext()


def attach_ray() -> None:
    if _current is not None:
        _current.attach_ray()


def log_path(command: str, name: str) -> Path:
    from harnessrl import settings

    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or command
    return settings.home() / "logs" / f"{command}-{safe}-{time.strftime('%Y%m%d-%H%M%S')}.log"
