"""One gRPC call on the native server: its stream's state, the framing of its messages, and the
``context`` its handler sees (the part of ``grpc.aio.ServicerContext`` that servicers use).

gRPC frames each message as a 1-byte compressed flag, a 4-byte big-endian length and the bytes.
``Reader`` cuts messages out of a stream's DATA chunks as nghttp2 hands them over, copying each
chunk once, straight into the message's own buffer.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from inferd.protocols.h2grpc import nghttp2

_PREFIX = struct.Struct(">BI")
_string_at = nghttp2.bytes_at
SMALL_MESSAGE_BYTES = 64 * 1024  # smaller messages are handed over as bytes
_RESERVED = {b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"}
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


class CallError(Exception):
    """Ends a call with a gRPC status (raised by ``context.abort`` and by the server itself)."""

    def __init__(
        self, code: grpc.StatusCode, details: str = "", trailing: Sequence[Any] = ()
    ) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailing = trailing


def frame(message: bytes) -> bytes:
    """One uncompressed gRPC message with its 5-byte prefix."""
    return _PREFIX.pack(0, len(message)) + message


class Reader:
    """Splits a stream's DATA into gRPC messages, enforcing the size limit."""

    __slots__ = ("_addr", "_body", "_compressed", "_filled", "_head", "_keep", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._head = b""
        self._body: bytearray | None = None
        self._keep: Any = None  # the ctypes view that pins ``_body`` while it fills
        self._addr = 0
        self._filled = 0
        self._compressed = False

    def feed(self, pointer: int, length: int, out: list[tuple[bool, bytes | bytearray]]) -> None:
        """Consume ``length`` bytes at ``pointer``; complete messages go to ``out``."""
        if self._body is None and not self._head and 5 <= length <= SMALL_MESSAGE_BYTES:
            # The usual chunk: whole small messages. One copy out of nghttp2's buffer.
            data = _string_at(pointer, length)
            pos = 0
            while length - pos >= 5:
                flag, size = _PREFIX.unpack_from(data, pos)
                if size > self.limit:
                    raise CallError(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"Received message larger than max ({size} vs. {self.limit})",
                    )
                end = pos + 5 + size
                if end > length:
                    break
                out.append((bool(flag), data[pos + 5 : end]))
                pos = end
            pointer += pos
            length -= pos
        while length:
            body = self._body
            if body is None:
                take = min(5 - len(self._head), length)
                self._head += _string_at(pointer, take)
                pointer += take
                length -= take
                if len(self._head) < 5:
                    return
                flag, size = _PREFIX.unpack(self._head)
                self._head = b""
                if size > self.limit:
                    raise CallError(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"Received message larger than max ({size} vs. {self.limit})",
                    )
                self._compressed = bool(flag)
                if size == 0:
                    out.append((self._compressed, b""))
                    continue
                body = self._body = bytearray(size)
                self._keep = (ctypes.c_char * size).from_buffer(body)
                self._addr = ctypes.addressof(self._keep)
                self._filled = 0
            take = min(len(body) - self._filled, length)
            ctypes.memmove(self._addr + self._filled, pointer, take)
            self._filled += take
            pointer += take
            length -= take
            if self._filled == len(body):
                self._keep = None
                self._body = None
                out.append(
                    (self._compressed, bytes(body) if len(body) <= SMALL_MESSAGE_BYTES else body)
                )

    @property
    def partial(self) -> bool:
        return bool(self._head) or self._body is not None


def decompress(encoding: str, data: bytes | bytearray, limit: int) -> bytes:
    """A message sent with the compressed flag, in the call's ``grpc-encoding``."""
    if encoding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise CallError(
            grpc.StatusCode.UNIMPLEMENTED,
            f"Compression algorithm '{encoding}' is not supported (identity, gzip, deflate)",
        )
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise CallError(grpc.StatusCode.INTERNAL, f"cannot decompress the message: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise CallError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"Received message larger than max after decompression (limit {limit})",
        )
    return out


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
        "call",
        "cancelled",
        "deadline",
        "deadline_hit",
        "ended",
        "eof",
        "fields",
        "headers",
        "headers_complete",
        "incoming",
        "messages",
        "out",
        "out_offset",
        "path",
        "reader",
        "responded",
        "sid",
        "started",
        "trailers",
        "waiting_end",
        "wake",
    )

    def __init__(self, sid: int, limit: int) -> None:
        self.sid = sid
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_complete = False
        self.fields: dict[bytes, bytes] = {}  # the header block by name, once complete
        self.path = ""
        self.cancelled = False  # the client reset the stream
        self.reader = Reader(limit)
        self.messages: list[tuple[bool, bytes | bytearray]] = []  # received, not yet handed on
        self.ended = False  # the client half-closed (END_STREAM)
        self.started = False
        self.waiting_end = False  # a unary-request call waits for the whole request
        self.call: asyncio.Task[None] | None = None
        self.incoming: asyncio.Queue[tuple[bool, bytes | bytearray] | None] | None = None
        self.responded = False  # response headers submitted
        self.out: deque[bytes] = deque()  # framed messages not yet handed to nghttp2
        self.out_offset = 0
        self.eof = False  # no more messages: trailers follow the last one
        self.trailers: list[tuple[bytes, bytes]] = []
        self.wake: asyncio.Event | None = None  # set when queued output drained
        self.deadline: asyncio.TimerHandle | None = None
        self.deadline_hit = False

    def header(self, name: bytes) -> str:
        """A field of the (complete) header block; "" when absent."""
        return self.fields.get(name, b"").decode("latin-1")

    def out_bytes(self) -> int:
        return sum(len(c) for c in self.out) - self.out_offset


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
