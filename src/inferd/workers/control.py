"""The repository API of one worker among several: each change is made here, written to the
run folder's journal, then made by every other worker before the call answers.

Uploads and routing changes still go through the model's store, as they do for replicas
(``routing.json``, the uploaded files); the other workers are told to follow it: an upload
makes them load the model from its store, a routing change applies the same routing document.
Explicit loads and unloads, which are a server's own choice, are repeated as they were asked;
so are shared-memory registrations (a client's next request may reach any worker) and trace
and log settings changed at run time.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator
from typing import Any

from inferd.core.errors import InferdError, InternalError
from inferd.core.registry import ModelRecord, Registry
from inferd.core.routing import RoutingPolicy
from inferd.core.shared_memory import SystemSharedMemory
from inferd.observability.log_settings import LogSettings
from inferd.observability.trace_settings import TraceSettings
from inferd.repository import routing_file
from inferd.repository.control import RepositoryControl
from inferd.repository.manager import ModelManager
from inferd.workers.peers import PeerError, Peers

log = logging.getLogger("inferd.workers")

CHANGES = (
    "load",
    "unload",
    "sync",
    "routing",
    "shm_register",
    "shm_unregister",
    "trace_settings",
    "log_settings",
)


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

    def share_regions(self, regions: SystemSharedMemory) -> None:
        """Shared-memory registrations reach every worker and are journaled like models."""
        self.regions = regions
        regions.share = self._share

    def share_settings(self, trace: TraceSettings, logs: LogSettings) -> None:
        """Trace and log settings changed at run time reach every worker (journaled too)."""
        self.trace, self.logs = trace, logs
        trace.share = logs.share = self._share

    async def _share(self, change: dict[str, Any]) -> None:
        """Journal a change made here, then have every other worker make it."""
        self.peers.role.journal.append(change)
        try:
            await self.peers.ask_all(change)
        except PeerError as exc:
            raise InternalError(
                f"'{change['name']}': done by worker {self.peers.role.index}, but {exc}"
            ) from None

    async def load(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> ModelRecord:
        record = await super().load(name, config_json, files)
        encoded = {path: base64.b64encode(data).decode() for path, data in (files or {}).items()}
        await self._share({"op": "load", "name": name, "config": config_json, "files": encoded})
        return record

    async def unload(self, name: str, unload_dependents: bool = False) -> list[str]:
        order = await super().unload(name, unload_dependents)
        await self._share({"op": "unload", "name": name, "dependents": unload_dependents})
        return order

    async def upload(self, name: str, archive: bytes | AsyncIterator[bytes]) -> ModelRecord:
        record = await super().upload(name, archive)
        await self._share({"op": "sync", "name": name})
        return record

    async def persist_routing(self, name: str, policy: RoutingPolicy, keys: set[str]) -> bool:
        written = await super().persist_routing(name, policy, keys)
        doc = routing_file.document(policy, keys)
        await self._share({"op": "routing", "name": name, "doc": doc})
        return written

    async def apply(self, change: dict[str, Any]) -> None:
        """Make a change another worker made (or one from the journal), here only."""
        op, name = change["op"], change["name"]
        if op == "load":
            files = {path: base64.b64decode(text) for path, text in change["files"].items()}
            await RepositoryControl.load(self, name, change["config"], files or None)
        elif op == "unload":
            await RepositoryControl.unload(self, name, bool(change["dependents"]))
        elif op == "sync":  # an upload another worker wrote into the model's store
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
            self.trace.update(change["changes"], change["model"])
        elif op == "log_settings" and self.logs is not None:
            self.logs.update(change["changes"])
        else:
            raise InternalError(f"unknown repository change '{op}'")

    async def replay(self) -> None:
        """Make every journaled change, in order (a worker that starts after others)."""
        for change in self.peers.role.journal.entries():
            try:
                await self.apply(change)
            except Exception as exc:
                why = exc.message if isinstance(exc, InferdError) else repr(exc)
                log.warning("replaying %s of model '%s': %s", change["op"], change["name"], why)
