"""One gRPC call on the native server: its stream's state (what arrived, what the call took,
what waits to be sent) and the ``context`` its handler sees (the part of
``grpc.aio.ServicerContext`` that servicers use). Messages are cut out by ``framing.Reader``.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from inferd.protocols.transport.h2grpc.framing import CallError, Reader

__all__ = ["CallError", "Context", "Stream", "metadata_pairs", "parse_timeout", "percent_encode"]

_RESERVED = {b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"}
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_timeout(value: str) -> float | None:
    """Seconds from a ``grpc-timeout`` header (e.g. ``100m``); None when malformed."""
    if len(value) < 2 or value[-1] not in _TIMEOUT_UNITS or not value[:-1].isdecimal():
        return None
    return int(value[:-1]) * _TIMEOUT_UNITS[value[-1]]


def percent_encode(text: str) -> bytes:
    """grpc-message encoding: printable ASCII but '%' as is, every other byte as %XX."""
    out = bytearray()
    for byte in text.encode("utf-8", "replace"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def metadata_pairs(metadata: Sequence[Any]) -> list[tuple[bytes, bytes]]:
    """Trailing or initial metadata as header pairs (``-bin`` values base64, unpadded)."""
    pairs = []
    for key, value in metadata:
        name = str(key).lower().encode("ascii")
        if name.endswith(b"-bin"):
            raw = value if isinstance(value, bytes) else str(value).encode()
            pairs.append((name, base64.b64encode(raw).rstrip(b"=")))
        else:
            pairs.append((name, str(value).encode("ascii", "replace")))
    return pairs


class Stream:
    """The state of one HTTP/2 stream carrying one call."""

    __slots__ = (
        "buffered",
        "call",
        "cancelled",
        "deadline",
        "deadline_hit",
        "ended",
        "eof",
        "fields",
        "handler",
        "header_bytes",
        "headers",
        "headers_complete",
        "held",
        "incoming",
        "messages",
        "out",
        "out_offset",
        "path",
        "pending",
        "reader",
        "responded",
        "seen",
        "sid",
        "started",
        "trailers",
        "unsent",
        "waiting_end",
        "wake",
    )

    def __init__(self, sid: int, limit: int, now: float) -> None:
        self.sid = sid
        self.headers: list[tuple[bytes, bytes]] = []
        self.header_bytes = 0  # the header list's size as HTTP/2 counts it (32 per field)
        self.headers_complete = False
        self.fields: dict[bytes, bytes] = {}  # the header block by name, once complete
        self.path = ""
        self.handler: Any = None  # found once the headers are complete
        self.cancelled = False  # the client reset the stream
        self.reader = Reader(limit)
        self.messages: list[tuple[bool, bytes | bytearray]] = []  # received, not yet handed on
        self.pending = 0  # complete messages the call has not taken yet
        self.buffered = 0  # bytes received into messages the call has not taken yet
        self.held = 0  # bytes received whose window is not reopened yet
        self.seen = now  # when bytes last arrived (the server's coarse clock)
        self.ended = False  # the client half-closed (END_STREAM)
        self.started = False
        self.waiting_end = False  # a unary-request call waits for the whole request
        self.call: asyncio.Task[None] | None = None
        self.incoming: asyncio.Queue[tuple[bool, bytes | bytearray] | None] | None = None
        self.responded = False  # response headers submitted
        self.out: deque[bytes] = deque()  # framed messages not yet handed to nghttp2
        self.out_offset = 0
        self.unsent = 0  # bytes in ``out`` not yet handed to nghttp2
        self.eof = False  # no more messages: trailers follow the last one
        self.trailers: list[tuple[bytes, bytes]] = []
        self.wake: asyncio.Event | None = None  # set when queued output drained
        self.deadline: asyncio.TimerHandle | None = None
        self.deadline_hit = False

    def header(self, name: bytes) -> str:
        """A field of the (complete) header block; "" when absent."""
        return self.fields.get(name, b"").decode("latin-1")

    def waits_on_client(self) -> bool:
        """Whether the request is unfinished in a way the client must finish: a header block,
        a message cut short, or a unary call's end."""
        return not self.eof and (
            not self.headers_complete or self.reader.partial or self.waiting_end
        )


class Context:
    """What a servicer sees of its call (a subset of grpc.aio.ServicerContext)."""

    __slots__ = (
        "_code",
        "_deadline",
        "_details",
        "_done_callbacks",
        "_initial",
        "_metadata",
        "_peer",
        "_read",
        "_stream",
        "_trailing",
        "_write",
        "cancelled_by_client",
        "finished",
    )

    def __init__(self, stream: Stream, peer: str, timeout_s: float | None) -> None:
        self._stream = stream
        self._peer = peer
        self._deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailing: Sequence[Any] = ()
        self._metadata: tuple[tuple[str, str | bytes], ...] | None = None
        self._done_callbacks: list[Callable[[Context], None]] = []
        self._write: Callable[[Any], Any] | None = None
        self._read: Callable[[], Any] | None = None
        self._initial: Callable[[Sequence[Any]], None] | None = None
        self.cancelled_by_client = False
        self.finished = False

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> None:
        raise CallError(code, details, trailing_metadata or ())

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_details(self, details: str) -> None:
        self._details = details

    def details(self) -> str:
        return self._details

    def set_trailing_metadata(self, trailing_metadata: Sequence[Any]) -> None:
        self._trailing = trailing_metadata

    def trailing_metadata(self) -> Sequence[Any]:
        return self._trailing

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        if self._metadata is None:
            pairs: list[tuple[str, str | bytes]] = []
            for name, value in self._stream.headers:
                if name.startswith(b":") or name in _RESERVED:
                    continue
                key = name.decode("latin-1")
                if key.endswith("-bin"):
                    pairs.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
                else:
                    pairs.append((key, value.decode("latin-1")))
            self._metadata = tuple(pairs)
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def peer_identities(self) -> None:
        return None

    def peer_identity_key(self) -> None:
        return None

    def auth_context(self) -> dict[str, Any]:
        return {}

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def cancelled(self) -> bool:
        return self.cancelled_by_client

    def done(self) -> bool:
        return self.finished

    def add_done_callback(self, callback: Callable[[Context], None]) -> None:
        self._done_callbacks.append(callback)

    def run_done_callbacks(self) -> None:
        self.finished = True
        for callback in self._done_callbacks:
            callback(self)

    def set_compression(self, compression: Any) -> None:
        """Responses are sent uncompressed."""

    def disable_next_message_compression(self) -> None:
        """Responses are sent uncompressed."""

    async def send_initial_metadata(self, initial_metadata: Sequence[Any]) -> None:
        if self._initial is not None:
            self._initial(initial_metadata)

    async def write(self, message: Any) -> None:
        if self._write is None:
            raise RuntimeError("write() is for calls that stream responses")
        await self._write(message)

    async def read(self) -> Any:
        if self._read is None:
            raise RuntimeError("read() is for calls that stream requests")
        return await self._read()
