"""inferd.protocols.h2grpc.framing.Reader: gRPC messages cut out of DATA chunks however the
chunks split them (whole small messages in one chunk take the one-copy path)."""

from __future__ import annotations

import ctypes
import struct

import grpc
import pytest

from inferd.protocols.h2grpc.framing import SMALL_MESSAGE_BYTES, CallError, Reader


def _framed(payload: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", int(compressed), len(payload)) + payload


def _feed(reader: Reader, chunks: list[bytes]) -> list[tuple[bool, bytes]]:
    out: list[tuple[bool, bytes | bytearray]] = []
    for chunk in chunks:
        buffer = ctypes.create_string_buffer(chunk, len(chunk))
        reader.feed(ctypes.addressof(buffer), len(chunk), out)
    return [(flag, bytes(data)) for flag, data in out]


def test_whole_messages_in_one_chunk() -> None:
    data = _framed(b"first") + _framed(b"") + _framed(b"\x00zip", compressed=True)
    reader = Reader(1 << 20)
    assert _feed(reader, [data]) == [(False, b"first"), (False, b""), (True, b"\x00zip")]
    assert not reader.partial


@pytest.mark.parametrize("cut", [1, 3, 5, 7, 12, 14])
def test_messages_split_anywhere_across_chunks(cut: int) -> None:
    data = _framed(b"hello") + _framed(b"second message")
    reader = Reader(1 << 20)
    first = _feed(reader, [data[:cut]])
    assert reader.partial or first == [(False, b"hello")]
    rest = _feed(reader, [data[cut:]])
    assert first + rest == [(False, b"hello"), (False, b"second message")]
    assert not reader.partial


def test_a_big_message_over_many_chunks() -> None:
    payload = bytes(range(256)) * (3 * SMALL_MESSAGE_BYTES // 256)
    data = _framed(payload) + _framed(b"tail")
    reader = Reader(1 << 24)
    chunks = [data[i : i + 16384] for i in range(0, len(data), 16384)]
    assert _feed(reader, chunks) == [(False, payload), (False, b"tail")]


def test_a_message_over_the_limit_is_refused() -> None:
    reader = Reader(8)
    with pytest.raises(CallError) as info:
        _feed(reader, [_framed(b"123456789")])
    assert info.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max (9 vs. 8)" in info.value.details
