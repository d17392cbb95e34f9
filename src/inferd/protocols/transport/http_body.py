"""Bodies on the HTTP port: the limits on requests' (``Limits``), how long one may take,
decompression within a limit, and answers streamed chunk by chunk.

A body's buffer grows with the bytes that arrived (doubling, up to its Content-Length), and
only those bytes count against ``--max-inflight-bytes``: a head declaring 100 MB costs what
its client actually sent, however slowly it sends the rest.

A body may pause at most ``--http-body-timeout-s`` between chunks, and must arrive at an
average of ``--http-min-body-rate-bytes`` per second after a grace of
``--http-header-timeout-s``: a client dripping a byte now and then (with a Content-Length or
chunked) is cut instead of holding its request slot for as long as it keeps dripping.
"""

from __future__ import annotations

import ctypes
import logging
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd.core.errors import InvalidInput, PayloadTooLarge

log = logging.getLogger("inferd.http")

DEFAULT_MAX_BODY_BYTES = 128 * 1024 * 1024
FIRST_BUFFER_BYTES = 1 << 20  # a large body's buffer starts at most this far ahead

# Resizes a bytearray in place without writing to it (realloc: a large buffer grows by
# remapping, not copying, and the pages it has not filled yet take no memory).
_resize = ctypes.pythonapi.PyByteArray_Resize
_resize.argtypes = [ctypes.py_object, ctypes.c_ssize_t]
_resize.restype = ctypes.c_int


def fill(buffer: bytearray, size: int, chunk: bytes, most: int) -> int:
    """Copy ``chunk`` into ``buffer`` at ``size`` (its bytes so far), growing the buffer by
    doubling up to ``most`` bytes (0: no bound); returns the new size. The buffer is longer
    than its bytes until the body is complete: ``finish`` trims it."""
    end = size + len(chunk)
    if end > len(buffer):
        grown = max(end, 2 * len(buffer), min(FIRST_BUFFER_BYTES, most or FIRST_BUFFER_BYTES))
        _resize(buffer, min(grown, most) if most else grown)
    buffer[size:end] = chunk
    return end


def finish(buffer: bytearray, size: int) -> bytearray:
    """The buffer cut to its ``size`` bytes."""
    if len(buffer) > size:
        del buffer[size:]
    return buffer


@dataclass(frozen=True, slots=True)
class BodyRate:
    """The slowest a body may arrive: ``grace_s``, then one second per ``min_bytes_per_s``."""

    grace_s: float = 10.0
    min_bytes_per_s: int = 1024  # 0: no minimum

    def deadline(self, started: float, received: int) -> float | None:
        """When a body that began at ``started`` (monotonic) and has ``received`` bytes so far
        must have more; None without a minimum rate."""
        if not self.min_bytes_per_s:
            return None
        return started + self.grace_s + received / self.min_bytes_per_s

    def describe(self) -> str:
        return (
            f"the request body arrived slower than {self.min_bytes_per_s} bytes/s "
            f"(--http-min-body-rate-bytes, after {self.grace_s:g} s)"
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """What the HTTP port lets one request and all of them together take."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = 60.0  # a body may pause this long between chunks
    body_rate: BodyRate = field(default_factory=lambda: BodyRate(min_bytes_per_s=0))
    # Requests in progress, inference and admin each (health and metrics never count), from
    # when their body is in (uploads: from their head); 0: no limit. Uploads and admin calls
    # have their own count, so they never use up inference's.
    max_inflight_requests: int = 0
    max_inflight_bytes: int = 0  # body bytes of requests in progress; 0: no limit


def too_large(size: int, limit: int, flag: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body of {size} bytes exceeds the limit of {limit} bytes ({flag})"
    )


def decompress(encoding: str, body: bytes, limit: int) -> bytes:
    """A body sent with Content-Encoding gzip or deflate, refused past ``limit`` bytes."""
    name = encoding.strip().lower()
    if name == "identity":
        return body
    if name == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif name == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise InvalidInput(f"unsupported Content-Encoding '{encoding}'; use gzip or deflate")
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"request body is not valid {name}: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise PayloadTooLarge(f"decompressed request body exceeds the limit of {limit} bytes")
    return out


async def send_stream(
    protocol: Any, status: int, headers: Sequence[tuple[str, str]], chunks: AsyncIterator[bytes]
) -> int:
    """Answer chunk by chunk (RSGI); returns the body bytes sent."""
    transport = protocol.response_stream(status, list(headers))
    sent = 0
    try:
        async for chunk in chunks:
            await transport.send_bytes(chunk)
            sent += len(chunk)
    except Exception as exc:  # the client left mid-stream: stop producing for it
        log.debug("stream to the client ended early: %s", exc)
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
    return sent
