"""What a connection of the native gRPC server needs from the server that accepted it: the limits
it enforces, the budget of request bytes shared by every connection, and the calls' handlers.

``Host`` is a Protocol, so ``connection`` depends on this module and never on ``server``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from inferd.protocols.transport.h2grpc.calls import Context, Stream


@dataclass(frozen=True, slots=True)
class Limits:
    """Every limit and timeout of one server's connections (``docs/security/limits.md``)."""

    max_message_bytes: int = 128 * 1024 * 1024
    max_concurrent_streams: int = 100  # advertised; nghttp2 refuses the streams past it
    max_header_list_bytes: int = 16 * 1024  # advertised and enforced as fields arrive
    # How far a client may send ahead of what the calls took: each stream's window, and the
    # connection's (the sum of every stream's bytes held unread).
    stream_window_bytes: int = 1024 * 1024
    connection_window_bytes: int = 4 * 1024 * 1024
    # Answers a connection's client has not read yet: past this its streaming calls wait to
    # write and its new calls wait to start.
    connection_unsent_bytes: int = 4 * 1024 * 1024
    max_buffered_bytes: int = 1 << 30  # request bytes held by every connection together
    header_timeout_s: float = 10.0  # the preface, and each header block, must arrive within
    body_timeout_s: float = 60.0  # a request paused mid-message (or before its end) this long
    idle_timeout_s: float = 300.0  # a connection with no call for this long is closed
    keepalive_time_s: float = 7200.0  # silent this long: the server pings
    keepalive_timeout_s: float = 20.0  # a ping unanswered this long closes the connection
    keepalive_permit_without_calls: bool = False
    min_ping_interval_s: float = 300.0  # client pings closer than this (with no data) strike
    max_ping_strikes: int = 2  # strikes past this: GOAWAY (ENHANCE_YOUR_CALM) and close

    def sweep_s(self) -> float:
        """How often one sweep checks every connection's timeouts."""
        shortest = min(
            self.header_timeout_s,
            self.body_timeout_s,
            self.idle_timeout_s,
            self.keepalive_time_s,
            self.keepalive_timeout_s,
        )
        return max(0.01, min(1.0, shortest / 4))


class Budget:
    """Request bytes received and not yet taken by their calls, over every connection. Past
    ``limit`` no window is opened for more (HTTP/2 flow control throttles the senders) until
    calls take what they were sent; the streams left waiting are reopened then, oldest first."""

    __slots__ = ("buffered", "limit", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffered = 0
        # stream -> the function that opens its window; dicts keep insertion order.
        self.waiting: dict[Stream, Callable[[], None]] = {}

    def room(self) -> bool:
        return self.buffered < self.limit

    def release(self, size: int) -> None:
        self.buffered -= size
        if self.waiting and self.buffered < self.limit:
            waiting = self.waiting
            while waiting and self.buffered < self.limit:
                stream = next(iter(waiting))
                waiting.pop(stream)()


class Host(Protocol):
    """The server side of a connection (``NativeGrpcServer``)."""

    lib: Any
    limits: Limits
    budget: Budget
    interceptors: list[Any]
    max_concurrent_rpcs: int
    active_calls: int
    clock: float  # the loop's time at the last sweep: when a stream last made progress
    # Decides a call on its method and token alone, before any of its body is read: None
    # when no interceptor can (else a status code and message, or None to let it in).
    refusal: Callable[[str, str | None], tuple[Any, str] | None] | None

    def handler_for(self, path: str, stream: Stream) -> Any: ...

    def intercepts(self, path: str) -> bool: ...

    async def intercepted(self, handler: Any, stream: Stream, context: Context) -> Any: ...

    def opened(self, connection: asyncio.Protocol) -> None: ...

    def closed(self, connection: asyncio.Protocol) -> None: ...
