"""The catalog: listing several stores, what each last said, finding a model, change keys,
and a background rescan that never holds its caller longer than it asked."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from inferd.core.errors import NotFound
from inferd.repository.catalog import Catalog, version_keys
from inferd.repository.local import LocalStorage
from inferd.repository.storage import WRITING_MARKER, ModelFiles, StorageError
from tests.e2e.lifecycle_support import write_version


class HangingStore(LocalStorage):
    """A local folder whose listing blocks until ``release`` is set (a store that hangs)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.release = threading.Event()

    def scan(self) -> dict[str, ModelFiles]:
        self.release.wait(10)
        return super().scan()


class WritingStore(LocalStorage):
    """A local folder that reports model 'busy' as being written by another server."""

    def scan(self) -> dict[str, ModelFiles]:
        return {**super().scan(), "busy": {WRITING_MARKER: (0, "writing")}}

    def scan_model(self, name: str) -> ModelFiles | None:
        return {WRITING_MARKER: (0, "writing")} if name == "busy" else super().scan_model(name)


def test_several_stores_first_one_wins(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    write_version(one / "a", 1)
    write_version(two / "a", 1)
    write_version(two / "b", 1)
    catalog = Catalog([LocalStorage(one), LocalStorage(two)])
    for _ in range(2):
        listing, failures = asyncio.run(catalog.scan())
    assert failures == {}
    assert listing.found["a"][0].uri == str(one) and listing.found["b"][0].uri == str(two)
    assert listing.listed == {str(one): {"a"}, str(two): {"a", "b"}}
    assert catalog.names == {"a", "b"} and catalog.synced_unix_s is not None
    assert caplog.text.count("is in two repositories") == 1


def test_a_store_that_fails_keeps_what_it_listed_before(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    write_version(one / "a", 1)
    write_version(two / "b", 1)
    catalog = Catalog([LocalStorage(one), LocalStorage(two)])
    asyncio.run(catalog.scan())
    synced = catalog.synced_unix_s
    two.rename(tmp_path / "away")
    listing, failures = asyncio.run(catalog.scan())
    assert set(failures) == {str(two)} and "is not a directory" in failures[str(two)].message
    assert set(listing.found) == {"a"} and catalog.names == {"a", "b"}
    assert catalog.synced_unix_s == synced  # not every store answered
    state = catalog.stores[str(two)]
    assert not state.ok and state.last_ok_unix_s == synced and "not a directory" in state.error
    assert catalog.stores[str(one)].ok


def test_find_and_models_being_written(tmp_path: Path) -> None:
    write_version(tmp_path / "a", 1)
    catalog = Catalog([WritingStore(tmp_path)])
    listing, _ = asyncio.run(catalog.scan())
    assert set(listing.found) == {"a"} and listing.writing == {"busy"}
    assert catalog.names == {"a", "busy"}
    storage, files = asyncio.run(catalog.find("a"))
    assert storage.uri == str(tmp_path) and set(files) == {"1/model.onnx"}
    with pytest.raises(StorageError, match="being written"):
        asyncio.run(catalog.find("busy"))
    with pytest.raises(NotFound, match="unknown model 'nope'"):
        asyncio.run(catalog.find("nope"))


def test_routing_json_is_not_part_of_a_version_key() -> None:
    files: ModelFiles = {"config.pbtxt": (1, "a"), "1/m.onnx": (2, "b"), "2/m.onnx": (3, "c")}
    keys = version_keys([1, 2], "store", files, None)
    with_routing = version_keys([1, 2], "store", {**files, "routing.json": (9, "z")}, None)
    assert keys == with_routing
    changed = version_keys([1, 2], "store", {**files, "2/m.onnx": (3, "d")}, None)
    assert changed[1] == keys[1] and changed[2] != keys[2]
    assert version_keys([1], "elsewhere", files, None)[1] != keys[1]


def test_a_refresh_waits_no_longer_than_asked(tmp_path: Path) -> None:
    write_version(tmp_path / "a", 1)
    store = HangingStore(tmp_path)
    catalog = Catalog([store])

    async def run() -> None:
        store.release.set()
        await catalog.scan()
        store.release.clear()
        write_version(tmp_path / "b", 1)
        await catalog.refresh(0.05)  # the store hangs: the last listing stands
        assert catalog.names == {"a"}
        await catalog.refresh(5)  # a scan still runs: no second one, and no wait
        assert catalog.names == {"a"}
        store.release.set()
        for _ in range(100):
            if catalog.names == {"a", "b"}:
                break
            await asyncio.sleep(0.01)
        assert catalog.names == {"a", "b"}
        write_version(tmp_path / "c", 1)
        await catalog.refresh(5)
        assert catalog.names == {"a", "b", "c"}

    asyncio.run(run())


class SlowFailingStore(LocalStorage):
    """The first listing blocks until ``release`` is set and then fails (a store call that
    began during an outage and answers late); later ones answer at once."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.release = threading.Event()
        self.calls = 0

    def scan(self) -> dict[str, ModelFiles]:
        self.calls += 1
        if self.calls == 1:
            self.release.wait(10)
            raise StorageError("model repository: NoSuchBucket")
        return super().scan()


def test_a_late_failing_scan_does_not_overwrite_a_later_answer(tmp_path: Path) -> None:
    write_version(tmp_path / "a", 1)
    store = SlowFailingStore(tmp_path)
    catalog = Catalog([store])

    async def overlap() -> tuple[set[str], set[str]]:
        early = asyncio.create_task(catalog.scan())
        while store.calls == 0:
            await asyncio.sleep(0.01)
        later, _ = await catalog.scan()  # begins after, answers first
        store.release.set()
        _, failed = await early
        return set(later.found), set(failed)

    found, failed = asyncio.run(overlap())
    assert found == {"a"} and failed == {str(tmp_path)}  # each caller gets its own answer
    state = catalog.stores[str(tmp_path)]
    assert state.ok and state.error == ""  # the newer answer stands
    assert catalog.names == {"a"} and catalog.synced_unix_s is not None
