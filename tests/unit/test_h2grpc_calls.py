"""inferd.protocols.transport.h2grpc.framing.Reader: gRPC messages cut out of DATA chunks
however the chunks split them (whole small messages in one chunk take the one-copy path)."""

from __future__ import annotations

import ctypes
import struct

import grpc
import pytest

from inferd.protocols.transport.h2grpc.framing import (
    FIRST_BUFFER_BYTES,
    SMALL_MESSAGE_BYTES,
    CallError,
    Reader,
    decompress,
)


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


def test_a_declared_length_allocates_only_what_arrived() -> None:
    """A prefix declaring 128 MiB and 10 bytes of it: a buffer of at most 64 KiB, grown as
    the bytes come (doubling, never past the declared length), and the message whole."""
    reader = Reader(1 << 30)
    declared = 128 * 1024 * 1024
    out: list[tuple[bool, bytes | bytearray]] = []
    head = ctypes.create_string_buffer(struct.pack(">BI", 0, declared) + b"x" * 10, 15)
    reader.feed(ctypes.addressof(head), 15, out)
    assert not out and reader.partial
    assert len(reader._body or b"") <= FIRST_BUFFER_BYTES
    chunk = ctypes.create_string_buffer(b"y" * (1 << 20), 1 << 20)
    sent = 10
    while sent + (1 << 20) <= declared:
        reader.feed(ctypes.addressof(chunk), 1 << 20, out)
        sent += 1 << 20
        body = reader._body
        assert body is None or len(body) <= max(2 * sent, FIRST_BUFFER_BYTES)
    rest = declared - sent
    reader.feed(ctypes.addressof(chunk), rest, out)
    assert len(out) == 1 and len(out[0][1]) == declared and not reader.partial
    assert bytes(out[0][1][:12]) == b"x" * 10 + b"yy"


@pytest.mark.parametrize("encoding", ["", "identity"])
def test_a_compressed_message_with_no_encoding_is_internal(encoding: str) -> None:
    with pytest.raises(CallError) as info:
        decompress(encoding, b"\x1f\x8b", 1 << 20)
    assert info.value.code is grpc.StatusCode.INTERNAL
    with pytest.raises(CallError) as info:
        decompress("snappy", b"x", 1 << 20)
    assert info.value.code is grpc.StatusCode.UNIMPLEMENTED
