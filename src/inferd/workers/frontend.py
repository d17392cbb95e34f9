"""The repository API of a frontend worker: every change is the model host's to make.

A frontend loads no model, so a load, unload, upload or routing change it receives is asked of
the host (worker 0) over the workers' sockets, and answered once the host has made it and every
frontend has the host's new table. An upload is spooled into the run folder as it arrives and
handed to the host by path. The index's listing of the stores, and the repository's status,
are the host's too. Shared-memory registrations and settings are shared as on every worker.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from inferd.plane.registry import ModelRecord, Registry
from inferd.plane.routing import RoutingPolicy
from inferd.repository import routing_file
from inferd.repository.control import RepositoryView
from inferd.repository.manager import ModelManager, RepositoryStatus
from inferd.repository.upload import spool
from inferd.workers.control import MODEL_CHANGES, UPLOADS_DIR, SharedControl
from inferd.workers.forward import HostLink, host_gone
from inferd.workers.peers import PeerError, Peers

HOST = 0  # the model host's worker index


class FrontendControl(SharedControl):
    def __init__(
        self,
        manager: ModelManager,
        registry: Registry,
        peers: Peers,
        max_upload_bytes: int,
        link: HostLink,
    ) -> None:
        super().__init__(manager, registry, peers, max_upload_bytes)
        self.link = link

    async def _ask(self, message: dict[str, Any]) -> Any:
        """The host's answer to a repository call (its error, as the same class)."""
        try:
            return await self.peers.ask(HOST, message, None)
        except PeerError as exc:
            raise exc.error() from None
        except (OSError, asyncio.IncompleteReadError):
            raise host_gone(self.peers.role.index) from None

    def _record(self, name: str) -> ModelRecord:
        return self.registry.record(name)

    async def load(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> ModelRecord:
        encoded = {path: base64.b64encode(data).decode() for path, data in (files or {}).items()}
        await self._ask({"op": "host_load", "name": name, "config": config_json, "files": encoded})
        return self._record(name)

    async def unload(self, name: str, unload_dependents: bool = False) -> list[str]:
        message = {"op": "host_unload", "name": name, "dependents": unload_dependents}
        order: list[str] = await self._ask(message)
        return order

    async def upload(self, name: str, archive: bytes | AsyncIterator[bytes]) -> ModelRecord:
        folder = self.peers.role.run_dir / UPLOADS_DIR
        await asyncio.to_thread(folder.mkdir, exist_ok=True)
        path = folder / f"{uuid.uuid4().hex}.archive"
        try:
            if isinstance(archive, bytes):
                await asyncio.to_thread(path.write_bytes, archive)
            else:
                await spool(archive, path)
            await self._ask({"op": "host_upload", "name": name, "path": str(path)})
        finally:
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(path.unlink)
        return self._record(name)

    async def persist_routing(self, name: str, policy: RoutingPolicy, keys: set[str]) -> bool:
        doc = routing_file.document(policy, keys)
        written: bool = await self._ask({"op": "host_routing", "name": name, "doc": doc})
        return written

    async def view(self) -> RepositoryView:
        doc = await self._ask({"op": "host_view"})
        return RepositoryView(list(doc["names"]), dict(doc["notes"]), doc["synced"])

    def status(self) -> RepositoryStatus:
        return self.link.status

    def replays(self, op: str) -> bool:
        return op not in MODEL_CHANGES  # the models come with the host's table
