"""Starting a call's coroutine at once, on the protocol callback's stack: a call that finishes
without waiting (a fast model run inline) needs no Task, and a Task carries on the others
(``inferd.scheduling.eager``). A call's own failure in that first step is logged here, as a
Task would have reported it, never raised into nghttp2's callback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from inferd.scheduling.eager import run_eagerly

log = logging.getLogger("inferd.grpc")


def start(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None], name: str
) -> asyncio.Task[None] | None:
    """Run ``coro`` until it first waits; None if it finished, else the Task carrying it on."""
    try:
        return run_eagerly(coro, name, loop)
    except asyncio.CancelledError:
        return None  # cancelled itself: as a Task, it would just end cancelled
    except Exception:
        log.exception("unhandled error in a gRPC call %s", name)
        return None
