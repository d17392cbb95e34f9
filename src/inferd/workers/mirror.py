"""A frontend worker's registry, kept equal to the model host's from its table messages.

Each version the host serves becomes a stand-in that forwards its requests to the host, or a
copy of its own when the host says it is small and simple enough (``workers.copies``); a copy
is loaded on a worker thread before the record that holds it is applied, and falls back to a
stand-in when it does not load. A version object is kept while the host keeps its own (same
serial), so its statistics go on; one the host retired stops taking requests (they route
again) and is closed once its queued requests are done.

When the host goes away, stand-ins stop serving (their models show why) while copies go on;
the new host's first table then replaces every version.
"""

from __future__ import annotations

import asyncio
import logging

from inferd.plane.model import ModelState, ModelVersion
from inferd.plane.registry import ModelRecord, Registry, VersionStatus
from inferd.plane.routing import RoutingPolicy
from inferd.repository import routing_file
from inferd.workers.copies import load_copy
from inferd.workers.table import Doc, SchedulerFactory, config_of, stand_in

log = logging.getLogger("inferd.workers")


class Mirror:
    def __init__(self, registry: Registry, schedulers: SchedulerFactory, worker: int) -> None:
        self.registry = registry
        self.schedulers = schedulers
        self.worker = worker
        self._known: dict[tuple[str, int], tuple[int, ModelVersion]] = {}  # by (name, number)
        self._stale = False  # the host went away: the next table's serials are a new host's
        self._closing: set[asyncio.Task[None]] = set()

    async def apply(self, docs: list[Doc], gone: list[str], full: bool) -> None:
        """Records as the host sent them; ``full``: these are all of them."""
        if full and self._stale:
            self._stale = False
            for _, version in self._known.values():
                self._retire(version)
            self._known.clear()
        names = {doc["name"] for doc in docs}
        if full:
            gone = [n for n in self.registry.names() if n not in names]
        for doc in docs:
            await self._put(doc)
        for name in gone:
            self.registry.forget(name)
            for key in [k for k in self._known if k[0] == name]:
                self._retire(self._known.pop(key)[1])

    async def _version(self, name: str, doc: Doc) -> ModelVersion:
        folder = doc["copy"]
        if folder:
            config, number = config_of(doc["config"]), int(doc["version"])
            try:
                return await asyncio.to_thread(load_copy, name, number, config, folder, self.worker)
            except Exception as exc:
                why = getattr(exc, "message", None) or str(exc)
                log.warning(
                    "worker %d: forwarding model '%s' version %d to the model host: a copy "
                    "did not load here (%s)",
                    self.worker,
                    name,
                    number,
                    why,
                )
        return stand_in(name, doc, self.schedulers)

    async def _put(self, doc: Doc) -> None:
        name = doc["name"]
        versions: dict[int, ModelVersion] = {}
        retired: list[ModelVersion] = []
        for vdoc in doc["versions"]:
            number, serial = int(vdoc["version"]), int(vdoc["serial"])
            known = self._known.get((name, number))
            if known is not None and known[0] == serial:
                version = known[1]
                version.state = ModelState(vdoc["state"])
            else:
                version = await self._version(name, vdoc)
                if known is not None:
                    retired.append(known[1])
                self._known[(name, number)] = (serial, version)
            versions[number] = version
        for key in [k for k in self._known if k[0] == name and k[1] not in versions]:
            retired.append(self._known.pop(key)[1])
        status = {
            int(v): VersionStatus(int(v), ModelState(state), reason)
            for v, state, reason in doc["status"]
        }
        config = config_of(doc["config"]) if doc["config"] is not None else None
        state = ModelState(doc["state"])
        self.registry.put(ModelRecord(name, versions, status, state, doc["reason"], config))
        for version in retired:
            self._retire(version)
        if doc["routing"] is not None:
            routing = self.registry.routing(name)
            policy = routing_file.overlay(RoutingPolicy(), doc["routing"], "routing")
            if policy != routing.policy:
                routing.set(policy)

    def _retire(self, version: ModelVersion) -> None:
        """A version the host no longer serves: a request routed to it routes again; a copy
        closes once its queued requests are done."""
        version.state = ModelState.UNAVAILABLE
        if version.folder:  # a copy: it has instances of its own
            task = asyncio.get_running_loop().create_task(version.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def lost(self, reason: str) -> None:
        """The host is gone: its models show UNAVAILABLE with ``reason`` (requests fail at
        once, readiness says why), but for the copies, which go on, until a new host's table
        replaces every version."""
        self._stale = True
        for record in self.registry.records():
            copies = {n: v for n, v in record.versions.items() if v.folder}
            status = {
                v: s if v in copies else VersionStatus(v, ModelState.UNAVAILABLE, reason)
                for v, s in record.status.items()
            }
            state = ModelState.READY if copies else ModelState.UNAVAILABLE
            self.registry.put(
                ModelRecord(record.name, copies, status, state, reason, record.config)
            )

    async def close(self) -> None:
        """Wait for the copies being closed."""
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
