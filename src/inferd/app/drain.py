"""Graceful shutdown on SIGTERM: stop being ready, let the requests in flight finish, then stop.

A balancer (Envoy's health check, a Kubernetes readiness probe) sees ``/v2/health/ready`` and
gRPC health turn false at once and stops sending; the server keeps answering whatever still
arrives meanwhile. It stops when no request has been inside a model (running or queued) and
none has arrived for ``QUIET_S``, or when ``--drain-timeout-s`` runs out; requests still
running then get ``STOP_GRACE_S`` more while the server stops, after which the process exits
anyway. A second SIGTERM stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from inferd.plane.dataplane import DataPlane
from inferd.plane.registry import Registry

log = logging.getLogger("inferd.server")

QUIET_S = 1.0  # no request for this long after the last one finished: the balancer has noticed
POLL_S = 0.05
STOP_GRACE_S = 3.0  # after a drain timeout, the stop itself gets this long before a hard exit


class Drain:
    """Started by the first SIGTERM; calls ``stop`` once the server is idle or out of time."""

    def __init__(
        self,
        plane: DataPlane,
        registry: Registry,
        timeout_s: float,
        stop: Callable[[], None],
        quiet_s: float = QUIET_S,
    ) -> None:
        self.plane = plane
        self.registry = registry
        self.timeout_s = timeout_s
        self.stop = stop
        self.quiet_s = quiet_s
        # Requests other processes hand this one (the model host of several workers): how
        # many are in flight, and a count that grows with each that arrives.
        self.forwarded: Callable[[], tuple[int, int]] = _nothing_forwarded
        self._task: asyncio.Task[None] | None = None
        self.exit_timer: asyncio.TimerHandle | None = None  # set by a drain timeout

    @property
    def started(self) -> bool:
        return self._task is not None

    def begin(self) -> None:
        """The signal handler: the first call drains, a second one stops now."""
        if self._task is not None:
            log.warning("second stop signal: stopping now, %d request(s) in flight", self.pending())
            self.stop()
            return
        self.plane.draining = True
        self._task = asyncio.get_running_loop().create_task(self._run(), name="drain")

    def pending(self) -> int:
        """Requests inside a model now (running or queued)."""
        own = sum(
            v.stats.pending for record in self.registry.records() for v in record.versions.values()
        )
        return own + self.forwarded()[0]

    def _arrivals(self) -> int:
        """A number that grows with every request a model receives."""
        own = sum(
            v.stats.success.count + v.stats.fail.count + v.stats.pending
            for record in self.registry.records()
            for v in record.versions.values()
        )
        return own + self.forwarded()[1]

    async def _run(self) -> None:
        start = time.monotonic()
        deadline = start + self.timeout_s
        log.info(
            "draining: not ready any more; %d request(s) in flight, waiting at most %g s",
            self.pending(),
            self.timeout_s,
        )
        seen = self._arrivals()
        quiet_since = start
        while True:
            now = time.monotonic()
            pending = self.pending()
            arrivals = self._arrivals()
            if pending or arrivals != seen:
                seen, quiet_since = arrivals, now
            elif now - quiet_since >= self.quiet_s:
                log.info("drained in %.1f s: stopping", now - start)
                break
            if now >= deadline:
                log.warning(
                    "drain timeout (%g s, --drain-timeout-s): "
                    "stopping with %d request(s) in flight",
                    self.timeout_s,
                    pending,
                )
                loop = asyncio.get_running_loop()
                self.exit_timer = loop.call_later(STOP_GRACE_S, self._exit_now)
                break
            await asyncio.sleep(POLL_S)
        self.stop()

    def _exit_now(self) -> None:
        """The stop outlived its grace after a drain timeout: the requests left are dropped."""
        log.warning(
            "%d request(s) still running %g s after the drain timeout: exiting now",
            self.pending(),
            STOP_GRACE_S,
        )
        logging.shutdown()
        os._exit(0)


def _nothing_forwarded() -> tuple[int, int]:
    return 0, 0
