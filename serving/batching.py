"""Merging of `@serve.batch` batches that wait while the model is busy.

`@serve.batch` cuts a batch every `batch_wait_timeout_s` whether or not the previous one has
finished; with one batch at a time the next ones queue behind it, each as small as what arrived
in its few milliseconds (we measured 3-5 requests per batch with 64 agents waiting). The
replica's batch functions therefore run with many concurrent batches allowed and hand their
requests to a `Coalescer`, which runs one model call at a time over everything that arrived
meanwhile (at most `max_items`): under load the calls grow to `max_items`, and an idle replica
still answers after one batch wait.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

# Batches allowed into a batch function at once: they only queue in the Coalescer, so this is
# not a limit on parallel work (Serve's warning that it exceeds max_ongoing_requests is filtered).
CONCURRENT_BATCHES = 1024


class Coalescer:
    def __init__(self, fn: Callable[[list], Awaitable[list]], max_items: int):
        self.fn, self.max_items = fn, max_items
        self._pending: list[tuple[Any, asyncio.Future]] = []
        self._worker: asyncio.Task | None = None

    async def submit(self, items: list) -> list:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        self._pending.extend(zip(items, futures))
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        return list(await asyncio.gather(*futures))

    async def _drain(self) -> None:
        while self._pending:
            take, self._pending = self._pending[: self.max_items], self._pending[self.max_items:]
            take = [(item, f) for item, f in take if not f.cancelled()]
            if not take:
                continue
            try:
                results = await self.fn([item for item, _ in take])
            except Exception as exc:  # every caller of this call gets the error, the next call runs
                for _, f in take:
                    if not f.done():
                        f.set_exception(exc)
                continue
            for (_, f), result in zip(take, results):
                if not f.done():
                    f.set_result(result)


class _NoConcurrencyWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "max_concurrent_batches" not in record.getMessage()


def quiet_serve_batch_warning() -> None:
    """Serve warns when max_batch_size x max_concurrent_batches > max_ongoing_requests; with a
    Coalescer behind the batch function the concurrent batches are merged, not run in parallel."""
    logger = logging.getLogger("ray.serve")
    if not any(isinstance(f, _NoConcurrencyWarning) for f in logger.filters):
        logger.addFilter(_NoConcurrencyWarning())
