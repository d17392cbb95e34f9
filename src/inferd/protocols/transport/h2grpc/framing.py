"""gRPC's message framing on the native server: each message is a 1-byte compressed flag, a
4-byte big-endian length and the bytes.

``Reader`` cuts messages out of a stream's DATA chunks as nghttp2 hands them over, copying each
chunk once, straight into the message's own buffer. That buffer grows with the bytes that
arrived (doubling, up to the declared length), never to a length a prefix merely declares: a
5-byte prefix claiming 128 MiB costs what its client actually sent.
"""

from __future__ import annotations

import ctypes
import struct
import zlib
from collections.abc import Sequence
from typing import Any

import grpc

from inferd.protocols.transport.h2grpc import nghttp2

_PREFIX = struct.Struct(">BI")
_string_at = nghttp2.bytes_at
SMALL_MESSAGE_BYTES = 64 * 1024  # smaller messages are handed over as bytes
FIRST_BUFFER_BYTES = 64 * 1024  # a large message's buffer starts at most this far ahead

# Resizes a bytearray in place (realloc: large buffers move by remapping, not copying).
_resize = ctypes.pythonapi.PyByteArray_Resize
_resize.argtypes = [ctypes.py_object, ctypes.c_ssize_t]
_resize.restype = ctypes.c_int


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


def _too_large(size: int, limit: int) -> CallError:
    return CallError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"Received message larger than max ({size} vs. {limit})",
    )


class Reader:
    """Splits a stream's DATA into gRPC messages, enforcing the size limit."""

    __slots__ = ("_addr", "_body", "_compressed", "_filled", "_head", "_keep", "_size", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._head = b""
        self._body: bytearray | None = None
        self._keep: Any = None  # the ctypes view that pins ``_body`` while it fills
        self._addr = 0
        self._filled = 0
        self._size = 0  # the declared length of the message being filled
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
                    raise _too_large(size, self.limit)
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
                    raise _too_large(size, self.limit)
                self._compressed = bool(flag)
                if size == 0:
                    out.append((self._compressed, b""))
                    continue
                body = self._body = bytearray(min(size, max(length, FIRST_BUFFER_BYTES)))
                self._pin(body)
                self._size = size
                self._filled = 0
            take = min(self._size - self._filled, length)
            if self._filled + take > len(body):
                self._grow(body, self._filled + take)
            ctypes.memmove(self._addr + self._filled, pointer, take)
            self._filled += take
            pointer += take
            length -= take
            if self._filled == self._size:
                self._keep = None
                self._body = None
                out.append(
                    (self._compressed, bytes(body) if len(body) <= SMALL_MESSAGE_BYTES else body)
                )

    def _pin(self, body: bytearray) -> None:
        self._keep = (ctypes.c_char * len(body)).from_buffer(body)
        self._addr = ctypes.addressof(self._keep)

    def _grow(self, body: bytearray, needed: int) -> None:
        self._keep = None  # a pinned bytearray cannot be resized
        _resize(body, min(self._size, max(needed, 2 * len(body))))
        self._pin(body)

    @property
    def partial(self) -> bool:
        return bool(self._head) or self._body is not None


def decompress(encoding: str, data: bytes | bytearray, limit: int) -> bytes:
    """A message sent with the compressed flag, in the call's ``grpc-encoding``."""
    if not encoding or encoding == "identity":
        # The gRPC spec: a compressed message on a call with no encoding is INTERNAL.
        raise CallError(
            grpc.StatusCode.INTERNAL,
            "a message has the compressed flag set but the call names no grpc-encoding",
        )
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
        del out  # the error's traceback keeps this frame alive, not the inflated bytes
        raise CallError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"Received message larger than max after decompression (limit {limit})",
        )
    return out
