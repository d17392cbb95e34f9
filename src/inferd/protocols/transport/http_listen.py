"""One RSGI app served by granian on one port, on the running event loop: started once its
socket is bound (a port that cannot be bound is a ConfigError naming it), stopped once it has
finished the requests it holds."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from granian.constants import Interfaces
from granian.server.embed import Server as GranianServer

from inferd.core.errors import ConfigError

log = logging.getLogger("inferd.http")


@dataclass(slots=True)
class Listener:
    """granian's server for one port, and the task serving it."""

    server: Any  # granian's embedded Server
    task: asyncio.Task[None]
    address: str  # host:port
    what: str  # "HTTP", "the dashboard"... for messages

    def stop(self) -> None:
        """Ask it to stop (it finishes its requests); ``stopped`` waits."""
        self.server.stop()

    async def stopped(self) -> None:
        """Wait until it has stopped, logging (not raising) an error that stopped it."""
        try:
            await self.task
        except Exception:
            log.exception("%s on %s stopped with an error", self.what, self.address)


async def listen(
    app: Any,
    address: str,
    port: int,
    options: dict[str, Any],
    *,
    what: str,
    backlog: int = 2048,
) -> Listener:
    """Serve ``app`` on ``address``:``port`` with granian's ``options`` (TLS...), once bound."""
    server = GranianServer(
        app,
        address=address,
        port=port,
        interface=Interfaces.RSGI,
        runtime_threads=1,
        backlog=backlog,
        log_enabled=False,
        **options,
    )
    bound = asyncio.Event()
    server.on_startup(bound.set)  # granian calls this once its socket is bound
    loop = asyncio.get_running_loop()
    task = loop.create_task(server.serve(), name=f"{what} {address}:{port}")
    binding = loop.create_task(bound.wait())
    await asyncio.wait({task, binding}, return_when=asyncio.FIRST_COMPLETED)
    if not bound.is_set():
        binding.cancel()
        exc = task.exception() if task.done() else None
        raise ConfigError(f"cannot serve {what} on {address}:{port}: {exc}")
    return Listener(server, task, f"{address}:{port}", what)
