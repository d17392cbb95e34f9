"""The scheduler of a frontend worker's stand-in model version: it runs no request itself but
hands each to the link to the model host (``workers.forward``), which runs it there."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, Protocol

from inferd.backends.work import Work
from inferd.core.errors import Unavailable
from inferd.core.types import Tensors, Timings
from inferd.workers.queues import QueueView


class Link(Protocol):
    """What a ``RemoteScheduler`` needs of its link to the host (``workers.forward.HostLink``)."""

    queues: QueueView

    def run(
        self, scheduler: RemoteScheduler, work: Work, timings: Timings
    ) -> Coroutine[Any, Any, Tensors]: ...


class RemoteScheduler:
    """The scheduler of a frontend's stand-in version: the host runs the request.
    ``rows``: how many rows of compatible requests may travel as one (``workers.rows``);
    ``queue``: [the byte that says the host's queue is full, the host's answer then]
    (``workers.queues``), for a queue-limited version."""

    __slots__ = ("link", "name", "queue", "rows", "version")

    def __init__(
        self,
        link: Link,
        name: str,
        version: int,
        rows: int = 0,
        queue: list[Any] | None = None,
    ) -> None:
        self.link = link
        self.name = name
        self.version = version
        self.rows = rows
        self.queue = queue

    @property
    def queue_limited(self) -> bool:
        return self.queue is not None

    def queue_full(self) -> Unavailable | None:
        """The host's answer, at once, while the host's queue for the version is full."""
        queue = self.queue
        if queue is None or not self.link.queues.full(queue[0]):
            return None
        return Unavailable(queue[1])

    def run(self, work: Work, timings: Timings) -> Coroutine[Any, Any, Tensors]:
        return self.link.run(self, work, timings)  # the link's coroutine: no frame of ours

    async def close(self) -> None:
        return None  # the host closes the version itself
