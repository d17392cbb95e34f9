"""The model table between the host and a frontend: the records as documents, the frontend's
stand-ins built from them (same config, spec, labels, routing), kept while the host keeps its
version, retired when it does not, and what changed since the last table."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from inferd.backends.work import Work
from inferd.core.types import Tensors, Timings
from inferd.plane.model import ModelState
from inferd.plane.registry import Registry
from inferd.plane.routing import RoutingPolicy
from inferd.workers.mirror import Mirror
from inferd.workers.queues import QueueBoard, QueueView
from inferd.workers.table import Fingerprints, Serials
from tests.echo_support import BATCHED, echo_version, registry_with


class _Forwarded:
    """The scheduler a stand-in gets: records what it was built for."""

    def __init__(self, name: str, version: int, rows: int, queue: list[Any] | None = None) -> None:
        self.name, self.version, self.rows, self.queue = name, version, rows, queue

    async def run(self, work: Work, timings: Timings) -> Tensors:
        return work.inputs

    async def close(self) -> None:
        return None


def _mirror() -> tuple[Registry, Mirror]:
    registry = Registry()
    return registry, Mirror(registry, _Forwarded, worker=1)


def test_a_frontend_knows_a_model_as_the_host_does(tmp_path: Path) -> None:
    batched = BATCHED + "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
    host_version = echo_version(tmp_path, batched, name="m")
    host = registry_with(host_version)
    host.routing("m").set(RoutingPolicy(labels={"stable": 1}))
    serials, marks = Serials(), Fingerprints()
    docs, gone = marks.changes(host, serials)
    assert [d["name"] for d in docs] == ["m"] and gone == []
    registry, mirror = _mirror()
    asyncio.run(mirror.apply(docs, gone, True))
    stand_in = registry.get("m")
    assert stand_in.config == host_version.config and stand_in.spec == host_version.spec
    assert isinstance(stand_in.scheduler, _Forwarded)
    # A dynamically batched batch runtime: up to max_batch_size rows may travel as one.
    scheduler = stand_in.scheduler
    assert (scheduler.name, scheduler.version, scheduler.rows) == ("m", 1, 8)
    assert registry.routing("m").label_version("stable") == 1
    assert registry.record("m").state is ModelState.READY
    # Nothing changed: nothing to send; the same version again keeps the stand-in.
    assert marks.changes(host, serials) == ([], [])
    asyncio.run(mirror.apply([docs[0]], [], False))
    assert registry.get("m") is stand_in
    asyncio.run(host_version.close())


def test_a_reloaded_version_replaces_the_stand_in_and_a_gone_model_leaves(
    tmp_path: Path,
) -> None:
    first = echo_version(tmp_path, name="m")
    host = registry_with(first)
    serials, marks = Serials(), Fingerprints()
    registry, mirror = _mirror()
    asyncio.run(mirror.apply(*marks.changes(host, serials), True))
    old = registry.get("m")
    second = echo_version(tmp_path / "again", name="m")
    record = host.record("m")
    host.put(replace(record, versions={1: second}))
    docs, gone = marks.changes(host, serials)
    asyncio.run(mirror.apply(docs, gone, False))
    new = registry.get("m")
    assert new is not old and old.state is ModelState.UNAVAILABLE  # routed again if used
    host.forget("m")
    docs, gone = marks.changes(host, serials)
    assert (docs, gone) == ([], ["m"])
    asyncio.run(mirror.apply(docs, gone, False))
    assert registry.names() == []
    for version in (first, second):
        asyncio.run(version.close())


def test_while_the_host_is_away_its_models_say_why(tmp_path: Path) -> None:
    version = echo_version(tmp_path, name="m")
    registry, mirror = _mirror()
    asyncio.run(mirror.apply(*Fingerprints().changes(registry_with(version), Serials()), True))
    mirror.lost("the model host is restarting")
    record = registry.record("m")
    assert record.versions == {} and record.state is ModelState.UNAVAILABLE
    assert record.status[1].reason == "the model host is restarting"
    asyncio.run(version.close())


def test_a_queue_limited_version_names_the_byte_that_says_its_queue_is_full(
    tmp_path: Path,
) -> None:
    limited = BATCHED + "dynamic_batching { default_queue_policy { max_queue_size: 1 } }\n"
    version = echo_version(tmp_path / "m", limited, name="m")
    plain = echo_version(tmp_path / "p", name="p")
    board, view = QueueBoard(tmp_path), QueueView(tmp_path)
    docs, _ = Fingerprints().changes(registry_with(version, plain), Serials(board.slot))
    queues = {d["name"]: d["versions"][0]["queue"] for d in docs}
    assert queues["p"] is None
    slot, message = queues["m"]
    assert (
        message == "the queue of model 'm/1' is full (max_queue_size 1, priority level 1); "
        "retry later"
    )
    scheduler: Any = version.scheduler
    assert not view.full(slot)
    scheduler.on_queue(True)  # as the batcher calls it when its queue fills
    assert view.full(slot)
    scheduler.on_queue(False)
    assert not view.full(slot)
    asyncio.run(version.close())
    asyncio.run(plain.close())
