"""The repository API of the model host (worker 0 of several), and what every worker shares.

Models live in the host alone: a load, unload, upload or routing change is made there (asked
by a frontend worker, ``workers.frontend``, or received by the host itself), written to the run
folder's journal, and answered once every frontend has the host's new table (``published``).
Uploads and routing changes still go through the model's store, as they do for replicas
(``routing.json``, the uploaded files). A host that is restarted replays the journal: the same
loads, unloads and routing, so the models come back as they were.

Shared-memory registrations (a client's next request may reach any worker), and trace and log
settings changed at run time, are per process: whichever worker receives one makes it, then
has every other worker make it too (and journals it, for a replacement of any worker). A
limited trace count is kept once for the server, in the run folder (``workers.counts``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from inferd.core.errors import InferdError, InternalError, InvalidInput
from inferd.observability.log_settings import LogSettings
from inferd.observability.trace_settings import TraceSettings
from inferd.plane.registry import ModelRecord, Registry
from inferd.plane.routing import RoutingPolicy
from inferd.plane.shared_memory import SystemSharedMemory
from inferd.repository import routing_file
from inferd.repository.control import RepositoryControl
from inferd.repository.manager import ModelManager
from inferd.workers.counts import SharedCounts
from inferd.workers.peers import PeerError, Peers

log = logging.getLogger("inferd.workers")

MODEL_CHANGES = ("load", "unload", "sync", "routing")  # the host's alone
SHARED_CHANGES = ("shm_register", "shm_unregister", "trace_settings", "log_settings")
CHANGES = MODEL_CHANGES + SHARED_CHANGES
UPLOADS_DIR = "uploads"  # in the run folder: archives a frontend received, for the host
CHUNK_BYTES = 4 << 20


async def _nothing() -> None:
    return None


class SharedControl(RepositoryControl):
    def __init__(
        self, manager: ModelManager, registry: Registry, peers: Peers, max_upload_bytes: int
    ) -> None:
        super().__init__(manager, max_upload_bytes)
        self.registry = registry
        self.peers = peers
        self.regions: SystemSharedMemory | None = None  # the data plane's, once it exists
        self.trace: TraceSettings | None = None
        self.logs: LogSettings | None = None
        # Waits until every frontend has the host's table after a change (ModelHost.sync).
        self.published: Callable[[], Awaitable[None]] = _nothing

    def share_regions(self, regions: SystemSharedMemory) -> None:
        """Shared-memory registrations reach every worker and are journaled like models."""
        self.regions = regions
        regions.share = self._share

    def share_settings(self, trace: TraceSettings, logs: LogSettings) -> None:
        """Trace and log settings changed at run time reach every worker (journaled too); a
        limited trace count is the server's (``workers.counts``)."""
        self.trace, self.logs = trace, logs
        trace.share = logs.share = self._share
        trace.counts = SharedCounts(self.peers.role.run_dir)

    async def _share(self, change: dict[str, Any]) -> None:
        """Journal a change made here, then have every other worker make it."""
        self.peers.role.journal.append(change)
        try:
            await self.peers.ask_all(change)
        except PeerError as exc:
            raise InternalError(
                f"'{change['name']}': done by worker {self.peers.role.index}, but {exc}"
            ) from None

    async def _made(self, change: dict[str, Any]) -> None:
        """A model change made here: journaled, then published to the frontends."""
        self.peers.role.journal.append(change)
        await self.published()

    # ------------------------------------------------------------------ the host's changes

    async def load(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> ModelRecord:
        try:
            record = await super().load(name, config_json, files)
        except BaseException:
            await self.published()  # a failed load shows why on every worker too
            raise
        encoded = {path: base64.b64encode(data).decode() for path, data in (files or {}).items()}
        await self._made({"op": "load", "name": name, "config": config_json, "files": encoded})
        return record

    async def unload(self, name: str, unload_dependents: bool = False) -> list[str]:
        order = await super().unload(name, unload_dependents)
        await self._made({"op": "unload", "name": name, "dependents": unload_dependents})
        return order

    async def upload(self, name: str, archive: bytes | AsyncIterator[bytes]) -> ModelRecord:
        try:
            record = await super().upload(name, archive)
        except BaseException:
            await self.published()
            raise
        await self._made({"op": "sync", "name": name})
        return record

    async def persist_routing(self, name: str, policy: RoutingPolicy, keys: set[str]) -> bool:
        written = await super().persist_routing(name, policy, keys)
        self.registry.routing(name).set(policy)  # now, so that the frontends get it
        doc = routing_file.document(policy, keys)
        await self._made({"op": "routing", "name": name, "doc": doc})
        return written

    async def on_behalf(self, message: dict[str, Any]) -> Any:
        """A repository call a frontend received, made here (``workers.frontend``)."""
        op, name = message["op"], message.get("name", "")
        if op == "host_load":
            files = {path: base64.b64decode(text) for path, text in message["files"].items()}
            await self.load(name, message["config"], files or None)
            return None
        if op == "host_unload":
            return await self.unload(name, bool(message["dependents"]))
        if op == "host_upload":
            path = self._spooled(message["path"])
            await self.upload(name, _chunks(path))
            return None
        if op == "host_routing":
            routing = self.registry.routing(name)
            doc = message["doc"]
            policy = routing_file.overlay(routing.policy, doc, "routing")
            return await self.persist_routing(name, policy, set(doc))
        if op == "host_view":
            view = await self.view()
            return {"names": view.names, "notes": view.notes, "synced": view.synced_unix_s}
        raise InternalError(f"unknown repository call '{op}'")

    def _spooled(self, text: str) -> Path:
        """An archive a frontend spooled: only ever inside the run folder's uploads."""
        folder = (self.peers.role.run_dir / UPLOADS_DIR).resolve()
        path = Path(text).resolve()
        if path.parent != folder:
            raise InvalidInput("an upload must be spooled in the run folder")
        return path

    # ------------------------------------------------------------------ replaying

    async def apply(self, change: dict[str, Any]) -> None:
        """Make a change another worker made (or one from the journal), here only."""
        op, name = change["op"], change["name"]
        if op == "load":
            files = {path: base64.b64decode(text) for path, text in change["files"].items()}
            await RepositoryControl.load(self, name, change["config"], files or None)
        elif op == "unload":
            await RepositoryControl.unload(self, name, bool(change["dependents"]))
        elif op == "sync":  # an upload written into the model's store
            outcome = await self.manager.load(name)
            if not outcome.ok:
                raise InternalError(f"uploaded model '{name}' did not load: {outcome.reason}")
        elif op == "routing":
            routing = self.registry.routing(name)
            routing.set(routing_file.overlay(routing.policy, change["doc"], "routing"))
        elif op == "shm_register" and self.regions is not None:
            self.regions.register(name, change["key"], change["offset"], change["byte_size"])
        elif op == "shm_unregister" and self.regions is not None:
            self.regions.unregister(name)
        elif op == "trace_settings" and self.trace is not None:
            self.trace.update(change["changes"], change["model"], received=False)
        elif op == "log_settings" and self.logs is not None:
            self.logs.update(change["changes"])
        else:
            raise InternalError(f"unknown repository change '{op}'")

    def replays(self, op: str) -> bool:
        """Whether a replacement of this worker replays journal entries of ``op``."""
        return op in CHANGES

    async def replay(self) -> None:
        """Make every journaled change, in order (a worker that starts after others)."""
        for change in self.peers.role.journal.entries():
            if not self.replays(change["op"]):
                continue
            try:
                await self.apply(change)
            except Exception as exc:
                why = exc.message if isinstance(exc, InferdError) else repr(exc)
                log.warning("replaying %s of model '%s': %s", change["op"], change["name"], why)


async def _chunks(path: Path) -> AsyncIterator[bytes]:
    with open(path, "rb") as f:
        while True:
            chunk = await asyncio.to_thread(f.read, CHUNK_BYTES)
            if not chunk:
                return
            yield chunk
