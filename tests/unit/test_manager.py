"""The repository manager in-process on a real local repository of tiny ONNX models:
unchanged versions are kept, changed ones reloaded, poll mode follows what it should, and a
repository that cannot be read keeps its models serving."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from inferd.plane.registry import Registry
from inferd.repository.manager import ControlMode, ModelManager
from inferd.repository.poller import Poller
from tests.e2e.lifecycle_support import HALF_PLUS_THREE, write_version
from tests.echo_support import BATCHED as ECHO


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


# --------------------------------------------------------------------------- echo models


def _echo(root: Path, name: str, extra: str = "") -> None:
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{ECHO}{extra}')


def _needs(*names: str) -> str:
    value = ",".join(names)
    return f'parameters {{ key: "depends_on" value: {{ string_value: "{value}" }} }}\n'


def test_a_load_brings_up_what_the_model_needs_first(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for name in ("a", "b", "c"):
        _echo(root, name)
    _echo(root, "ens", _needs("a", "b"))
    _echo(root, "top", _needs("ens"))

    async def run() -> None:
        manager, registry = _manager(root, ControlMode.EXPLICIT)
        await manager.start()
        assert registry.names() == []
        await manager.load_model("top")
        assert registry.names() == ["a", "b", "ens", "top"]
        assert all(registry.is_ready(n) for n in registry.names())
        assert manager.wanted == {"a", "b", "ens", "top"} and manager.ready()
        assert await manager.unload_model("b") == ["top", "ens", "b"]  # users go first
        assert [n for n in registry.names() if registry.is_ready(n)] == ["a"]
        await manager.load_model("top")
        assert await manager.unload_model("top", unload_dependents=True) == [
            "top",
            "ens",
            "b",
            "a",
        ]
        assert not any(registry.is_ready(n) for n in registry.names())
        await manager.close()

    asyncio.run(run())


def test_a_model_whose_need_cannot_load_is_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "models"
    _echo(root, "ens", _needs("missing"))
    _echo(root, "loop", _needs("loop"))

    async def run() -> None:
        manager, registry = _manager(root, ControlMode.EXPLICIT)
        await manager.start()
        outcome = await manager.load("ens")
        assert not outcome.ok
        assert "needs model 'missing', which cannot load: unknown model" in outcome.reason
        assert not (await manager.load("loop")).ok
        assert "depends on itself" in registry.record("loop").reason
        assert manager.ready()  # failed explicit loads are not models that should serve
        await manager.close()

    asyncio.run(run())


def test_strict_readiness_counts_every_model_that_should_load(tmp_path: Path) -> None:
    root = tmp_path / "models"
    _echo(root, "good")
    (root / "bad" / "1").mkdir(parents=True)
    (root / "bad" / "config.pbtxt").write_text('backend: "echo"\n')  # no inputs: fails

    async def run() -> None:
        manager, registry = _manager(root, ControlMode.POLL)
        await manager.start()
        assert registry.is_ready("good") and not manager.ready()
        poller = Poller(manager.scan, manager.apply, 3600)
        (root / "bad" / "config.pbtxt").unlink()
        (root / "bad" / "1").rmdir()
        (root / "bad").rmdir()
        await poller.poll_once()
        assert registry.names() == ["good"] and manager.ready()
        await manager.close()

    asyncio.run(run())


class _Clock:
    now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_an_emptied_repository_keeps_serving_for_the_grace(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for name in ("a", "b", "c"):
        _echo(root, name)

    async def run() -> None:
        manager, registry = _manager(root, ControlMode.POLL)
        clock = _Clock()
        manager.guard.clock = clock
        await manager.start()
        poller = Poller(manager.scan, manager.apply, 3600)
        root.rename(tmp_path / "away")
        root.mkdir()  # the store answers, and lists nothing
        await poller.poll_once()
        assert all(registry.is_ready(n) for n in ("a", "b", "c")) and manager.ready()
        assert "serving on as a store fault" in manager.notes()["a"]
        assert manager.status().faults == 1 and len(manager.status().held) == 3
        clock.now_s += 30
        (tmp_path / "away" / "a").rename(root / "a")  # one comes back
        await poller.poll_once()
        assert set(manager.notes()) == {"b", "c"}
        clock.now_s += 31
        await poller.poll_once()
        assert registry.names() == ["a"] and manager.ready()
        assert manager.status().held == ()
        await manager.close()

    asyncio.run(run())


def test_replicas_on_one_folder_converge_on_routing_and_uploads(tmp_path: Path) -> None:
    root = tmp_path / "models"
    _echo(root, "m")
    (root / "m" / "2").mkdir()
    (root / "m" / "config.pbtxt").write_text(f'name: "m"\n{ECHO}version_policy {{ all {{}} }}\n')

    async def run() -> None:
        (one, first), (two, second) = (
            _manager(root, ControlMode.POLL),
            _manager(root, ControlMode.POLL),
        )
        for manager in (one, two):
            await manager.start()
        assert await one.persist_routing("m", {"labels": {"stable": 1}})
        assert await one.persist_routing("m", {"traffic_split": {"stable": 100}})
        await Poller(two.scan, two.apply, 3600).poll_once()
        policy = second.routing("m").policy
        assert policy.labels == {"stable": 1} and policy.split == (("stable", 100.0),)
        staged = root / ".upload-test" / "fresh"
        _echo(root / ".upload-test", "fresh")
        storage = one.storages[0]
        async with one.locked("fresh"):
            assert (await one.publish("fresh", storage, staged)).ok
        assert first.is_ready("fresh") and (root / "fresh" / "config.pbtxt").is_file()
        await Poller(two.scan, two.apply, 3600).poll_once()
        assert second.is_ready("fresh")
        for manager in (one, two):
            await manager.close()

    asyncio.run(run())
