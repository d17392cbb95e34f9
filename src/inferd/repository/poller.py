"""Poll mode: rescan the repositories every ``--repository-poll-secs`` and apply the changes.

A store that does not answer is one outage: its first failure is logged as an error, later
ones only at debug level, and its return once; meanwhile its models keep serving as loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from inferd.repository.storage import StorageError

Found = TypeVar("Found")
# A scan: what the repositories hold now, and the stores that did not answer (uri -> error).
Scan = Callable[[], Awaitable[tuple[Found, dict[str, StorageError]]]]
# Applying a scan: bring the loaded models in line with it; the named stores did not answer.
Apply = Callable[[Found, set[str]], Awaitable[None]]

log = logging.getLogger("inferd.repository")


class Poller(Generic[Found]):
    """Runs ``scan`` then ``apply`` every ``interval_s`` seconds, reporting store outages."""

    def __init__(self, scan: Scan[Found], apply: Apply[Found], interval_s: float) -> None:
        self.scan = scan
        self.apply = apply
        self.interval_s = interval_s
        self._down_since: dict[str, float] = {}  # store uri -> monotonic time of its outage
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="repository-poll")
        log.info("polling the model repository every %g s", self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll_once()
            except Exception:
                log.exception("polling the model repository failed")

    async def poll_once(self) -> None:
        found, failures = await self.scan()
        self._report(failures)
        await self.apply(found, set(failures))

    def _report(self, failures: dict[str, StorageError]) -> None:
        now = time.monotonic()
        for uri, error in failures.items():
            since = self._down_since.get(uri)
            if since is None:
                self._down_since[uri] = now
                log.error("%s; the loaded models keep serving until it answers", error.message)
            else:
                log.debug("model repository '%s' still down after %.0f s", uri, now - since)
        for uri in [u for u in self._down_since if u not in failures]:
            since = self._down_since.pop(uri)
            log.info("model repository '%s' answers again after %.0f s", uri, now - since)
