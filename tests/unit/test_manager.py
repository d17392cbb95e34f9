"""The repository manager in-process on a real local repository of tiny ONNX models:
unchanged versions are kept, changed ones reloaded, poll mode follows what it should, and a
repository that cannot be read keeps its models serving."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from inferd.registry import Registry
from inferd.repository.manager import ControlMode, ModelManager
from inferd.repository.poller import Poller
from tests.e2e.lifecycle_support import HALF_PLUS_THREE, write_version


def _manager(root: Path, mode: ControlMode = ControlMode.NONE) -> tuple[ModelManager, Registry]:
    registry = Registry()
    manager = ModelManager(
        [root], registry, mode=mode, poll_interval_s=3600, files_dir=root.parent / "files"
    )
    return manager, registry


def test_unchanged_versions_are_kept_and_changed_ones_reloaded(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_version(root / "m", 1)
    write_version(root / "m", 2)
    (root / "m" / "config.pbtxt").write_text("version_policy { all {} }\n")

    async def run() -> None:
        manager, registry = _manager(root)
        await manager.load_all()
        first, second = registry.get("m", "1"), registry.get("m", "2")
        write_version(root / "m", 3, HALF_PLUS_THREE)
        await manager.load_model("m")
        assert registry.get("m", "1") is first and registry.get("m", "2") is second
        assert sorted(registry.record("m").versions) == [1, 2, 3]
        (root / "m" / "2" / "model.onnx").write_bytes(HALF_PLUS_THREE)
        await manager.load_model("m")
        assert registry.get("m", "1") is first
        assert registry.get("m", "2") is not second
        assert second.state.value == "UNAVAILABLE"  # retired and closed
        await manager.close()

    asyncio.run(run())


def test_poll_mode_with_load_model_follows_only_those(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_version(root / "a", 1)
    write_version(root / "b", 1)

    async def run() -> None:
        manager, registry = _manager(root, ControlMode.POLL)
        await manager.start(["a"])
        assert registry.names() == ["a"]
        poller = Poller(manager.scan, manager.apply, 3600)
        write_version(root / "a", 2)
        write_version(root / "c", 1)
        await poller.poll_once()
        assert registry.names() == ["a"]
        assert registry.get("a").version == 2
        await manager.close()

    asyncio.run(run())


def test_an_unreadable_repository_keeps_its_models(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "models"
    write_version(root / "m", 1)

    async def run() -> None:
        manager, registry = _manager(root, ControlMode.POLL)
        await manager.start()
        poller = Poller(manager.scan, manager.apply, 3600)
        os.rename(root, tmp_path / "away")
        for _ in range(3):
            await poller.poll_once()
        assert registry.is_ready("m")
        os.rename(tmp_path / "away", root)
        write_version(root / "n", 1)
        await poller.poll_once()
        assert registry.names() == ["m", "n"]
        await manager.close()

    with caplog.at_level(logging.INFO, logger="inferd.repository"):
        asyncio.run(run())
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "is not a directory" in errors[0]
    assert any("answers again" in r.getMessage() for r in caplog.records)
