"""Shared-memory arenas: blocks are reused once released, arenas grow and retire, and an array
read in place keeps its block until the last view of it is gone."""

from __future__ import annotations

import gc
import os

import numpy as np

from inferd.scheduling import shm, wire
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


def test_a_large_element_leaves_shared_memory_as_a_bytearray_chunk_by_chunk() -> None:
    """A BYTES element read out as a bytearray (TorchServe's bodies) is copied once, in chunks,
    and this end's mapping lets go of each chunk's pages as it goes: the contents stay."""
    writer, reader = Arenas(), Mapped()
    element = bytes(range(256)) * ((2 * wire.READ_CHUNK_BYTES + 12345) // 256)
    parts, size = wire.bytes_parts(np.array([b"ab", element], dtype=object))
    ref = writer.put_parts(parts, size)
    _connect(writer, reader)
    seen: list[tuple[int, int]] = []

    def read(start: int, end: int) -> None:
        seen.append((start, end))
        reader.drop_pages(ref, start, end)

    with reader.view(ref) as view:
        found = wire.deserialize_bytes(view, (2,), bytearray, read)
    assert [type(x) for x in found] == [bytearray, bytearray]
    assert found[0] == b"ab" and found[1] == element
    assert len(seen) == 3 and seen[0][0] == 10 and seen[-1][1] == size
    with reader.view(ref) as view:  # the block's bytes are still there for its owner
        assert wire.deserialize_bytes(view, (2,))[1] == element
    writer.close()


def test_an_idle_writer_gives_back_its_free_space_once_per_idle_spell() -> None:
    """``trim``: the free space's pages go back (they read as zeros), a live block keeps its
    bytes, and nothing is done again until something was written."""
    writer, reader = Arenas(), Mapped()
    live = writer.put_bytes(b"k" * (1 << 20))
    gone = writer.put_bytes(b"g" * (2 << 20))
    _connect(writer, reader)
    writer.release([gone])
    assert not writer.trim(idle_s=60)  # written just now
    assert writer.trim(idle_s=0)
    assert not writer.trim(idle_s=0)  # nothing written since
    assert reader.read(live) == b"k" * (1 << 20)
    with reader.view(gone) as view:
        assert bytes(view[4096:8192]) == bytes(4096)  # its pages were given back
    writer.put_bytes(b"n")
    assert writer.trim(idle_s=0)
    writer.close()
