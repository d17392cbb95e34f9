"""System shared-memory regions: windows checked against the region, the object checked on
every use (removed or shrunk), registration errors named."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from inferd.core.errors import InvalidInput, NotFound, Unavailable
from inferd.plane.shared_memory import SHM_DIR, RegionStatus, SystemSharedMemory


@pytest.fixture
def key() -> Iterator[str]:
    name = f"inferd_unit_{os.getpid()}"
    path = os.path.join(SHM_DIR, name)
    with open(path, "wb") as f:
        f.write(np.arange(2048, dtype=np.float32).tobytes())  # 8 KiB: windows cross a page
    yield "/" + name
    if os.path.exists(path):
        os.unlink(path)


def test_windows_view_the_object_in_place(key: str) -> None:
    regions = SystemSharedMemory()
    regions.register("r", key, offset=4092, byte_size=16)  # not page aligned
    view = regions.window("r", 4, 8, "x")
    assert np.frombuffer(view, dtype=np.float32).tolist() == [1024.0, 1025.0]
    view[:4] = np.float32(-1).tobytes()  # written through to the object
    with open(os.path.join(SHM_DIR, key[1:]), "rb") as f:
        f.seek(4096)
        assert np.frombuffer(f.read(4), dtype=np.float32).tolist() == [-1.0]
    assert regions.status() == [RegionStatus("r", key, 4092, 16)]
    with pytest.raises(InvalidInput, match="offset 12 \\+ byte_size 8 is outside"):
        regions.window("r", 12, 8, "x")
    regions.unregister("r")
    assert bytes(view[:4]) == np.float32(-1).tobytes()  # a view in use outlives it
    with pytest.raises(NotFound):
        regions.status("r")


def test_a_removed_or_shrunk_object_fails_its_requests(key: str) -> None:
    regions = SystemSharedMemory()
    regions.register("r", key, offset=0, byte_size=8192)
    os.truncate(os.path.join(SHM_DIR, key[1:]), 100)
    with pytest.raises(Unavailable, match="shrank"):
        regions.window("r", 0, 8, "x")
    os.unlink(os.path.join(SHM_DIR, key[1:]))
    with pytest.raises(Unavailable, match="no longer exists"):
        regions.window("r", 0, 8, "x")
    regions.close()


def test_registration_errors(key: str) -> None:
    regions = SystemSharedMemory()
    for args, fragment in (
        (("r", "/a/b", 0, 8), "not a POSIX shared memory name"),
        (("r", "/inferd_absent_key", 0, 8), "cannot open key"),
        (("r", key, 8190, 8), "exceeds the 8192 bytes"),
        (("r", key, -1, 8), "'offset' must be >= 0"),
        (("", key, 0, 8), "needs a name"),
    ):
        with pytest.raises(InvalidInput, match=fragment):
            regions.register(*args)
    regions.register("r", key, 0, 8)
    with pytest.raises(InvalidInput, match="already registered"):
        regions.register("r", key, 0, 8)
    with pytest.raises(InvalidInput, match="'s' is not registered"):
        regions.window("s", 0, 8, "x")
    regions.unregister("unknown")  # no error, as in Triton
    regions.unregister()
    assert regions.status() == []
