"""The lifecycle in-process: unchanged versions are kept, changed ones swapped in and the old
retired; an all-or-nothing reload (an upload) swaps nothing unless every version loads; a
failed reload keeps what serves; an unload drains. Tiny ONNX models, files on local disk."""

from __future__ import annotations

import asyncio
from pathlib import Path

from inferd.plane.model import ModelState
from inferd.plane.registry import Registry
from inferd.repository.lifecycle import Lifecycle
from inferd.repository.loader import LoadOptions, plan
from inferd.repository.local import LocalStorage
from tests.e2e.lifecycle_support import HALF_PLUS_THREE, write_version

ALL = "version_policy { all {} }\n"


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_version(root / "m", 1)
    write_version(root / "m", 2)
    (root / "m" / "config.pbtxt").write_text(ALL)
    return root


async def _reload(life: Lifecycle, root: Path, all_or_nothing: bool = False) -> bool:
    model_plan = plan("m", root / "m")
    files = LocalStorage(root).scan_model("m") or {}
    outcome = await life.reload("m", model_plan, files, str(root), all_or_nothing=all_or_nothing)
    return outcome.ok


def test_only_changed_versions_are_swapped(tmp_path: Path) -> None:
    root = _repo(tmp_path)

    async def run() -> None:
        registry = Registry()
        life = Lifecycle(registry, LoadOptions())
        assert await _reload(life, root)
        one, two = registry.get("m", "1"), registry.get("m", "2")
        (root / "m" / "routing.json").write_text('{"labels": {"stable": 1}}')
        assert await _reload(life, root)  # a routing change alone reloads nothing
        assert registry.get("m", "1") is one and registry.get("m", "2") is two
        assert registry.routing("m").policy.labels == {"stable": 1}
        (root / "m" / "2" / "model.onnx").write_bytes(HALF_PLUS_THREE)
        assert await _reload(life, root)
        assert registry.get("m", "1") is one and registry.get("m", "2") is not two
        assert two.state is ModelState.UNAVAILABLE  # retired, drained and closed
        await life.close()

    asyncio.run(run())


def test_all_or_nothing_keeps_the_old_record_when_a_version_fails(tmp_path: Path) -> None:
    root = _repo(tmp_path)

    async def run() -> None:
        registry = Registry()
        life = Lifecycle(registry, LoadOptions())
        assert await _reload(life, root)
        before = registry.record("m")
        write_version(root / "m", 3)
        write_version(root / "m", 4)
        (root / "m" / "4" / "model.onnx").write_bytes(b"not onnx")
        assert not await _reload(life, root, all_or_nothing=True)
        assert registry.record("m") is before  # version 3 loaded, then closed again
        assert not await _reload(life, root)  # the ordinary reload takes what came up
        record = registry.record("m")
        assert sorted(record.versions) == [1, 2, 3]
        assert record.status[4].state is ModelState.UNAVAILABLE
        await life.close()

    asyncio.run(run())


def test_a_new_model_that_fails_all_or_nothing_leaves_no_record(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_version(root / "m", 1)
    (root / "m" / "1" / "model.onnx").write_bytes(b"junk")

    async def run() -> None:
        registry = Registry()
        life = Lifecycle(registry, LoadOptions())
        assert not await _reload(life, root, all_or_nothing=True)
        assert registry.names() == []
        assert not await _reload(life, root)
        assert registry.record("m").state is ModelState.UNAVAILABLE

    asyncio.run(run())


def test_fail_keeps_serving_and_unload_drains(tmp_path: Path) -> None:
    root = _repo(tmp_path)

    async def run() -> None:
        registry = Registry()
        life = Lifecycle(registry, LoadOptions())
        await _reload(life, root)
        outcome = life.fail("m", "config.pbtxt: bad")
        assert not outcome.ok and not outcome.took_over
        record = registry.record("m")
        assert record.state is ModelState.READY and "bad" in record.reason
        assert life.serving() == {"m"}
        life.rekey("m", "elsewhere", LocalStorage(root).scan_model("m") or {})
        one = registry.get("m", "1")
        await _reload(life, root)  # the keys name another origin: every version reloads
        assert registry.get("m", "1") is not one
        await life.unload("m")
        assert registry.record("m").reason == "unloaded" and life.serving() == set()
        await life.unload("m", forget=True)  # it left the repository: the record goes too
        assert registry.names() == []

    asyncio.run(run())
