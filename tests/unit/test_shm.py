"""Shared-memory arenas: blocks are reused once released, arenas grow and retire, and an array
read in place keeps its block until the last view of it is gone."""

from __future__ import annotations

import gc
import os

import numpy as np

from inferd.scheduling import shm
from inferd.scheduling.shm import Arenas, Mapped


def _connect(writer: Arenas, reader: Mapped) -> None:
    new, fds, retired = writer.announcements()
    dup = [os.dup(fd) for fd in fds]
    writer.sent(fds)
    reader.add(new, dup)
    reader.retire(retired)


def test_an_array_is_read_in_place_and_its_block_reused_once_released() -> None:
    writer, reader = Arenas(), Mapped()
    data = np.arange(1000, dtype=np.float32).reshape(10, 100)
    ref = writer.put(data)
    _connect(writer, reader)
    seen = reader.array(ref, np.dtype(np.float32), (10, 100))
    assert np.array_equal(seen, data)
    view = seen[2:4]
    del seen
    gc.collect()
    assert reader.releases() == []  # a view still reads the block
    del view
    released = reader.releases()
    assert released == [ref]
    assert writer.in_use() == 1
    writer.release(released)
    assert writer.in_use() == 0
    assert writer.put(data) == ref  # the same space again
    writer.close()


def test_a_full_arena_is_replaced_by_a_larger_one_and_retired_when_empty() -> None:
    writer, reader = Arenas(), Mapped()
    big = np.zeros(int(shm.ARENA_MIN_BYTES * 0.4) // 8, dtype=np.float64)
    first, second = writer.put(big), writer.put(big)
    third = writer.put(big)  # no room left: a new, larger arena
    assert first[0] == second[0] != third[0]
    _connect(writer, reader)
    writer.release([first, second])  # the old arena's last blocks: unmapped, the peer told
    new, fds, retired = writer.announcements()
    assert (new, fds, retired) == ([], [], [first[0]])
    writer.close()


def test_bytes_are_copied_out_and_released_at_once() -> None:
    writer, reader = Arenas(), Mapped()
    ref = writer.put_bytes(b"\x00hello\xff")
    _connect(writer, reader)
    assert reader.read(ref) == b"\x00hello\xff"
    assert reader.releases() == [ref]


def test_large_bytes_and_parts_arrive_whole() -> None:
    # Copies of 1 MiB or more go through numpy (the GIL let go): every byte where it belongs.
    writer, reader = Arenas(), Mapped()
    rng = np.random.default_rng(0)
    one = rng.integers(0, 256, 3_000_001, dtype=np.uint8).tobytes()
    parts: list[bytes | bytearray] = [b"ab", bytearray(one), b"", one[:1_500_000], b"z"]
    size = sum(len(p) for p in parts)
    whole, joined = writer.put_bytes(memoryview(one)), writer.put_parts(parts, size)
    _connect(writer, reader)
    assert reader.read(whole) == one
    assert reader.read(joined) == b"".join(parts)
    writer.close()
