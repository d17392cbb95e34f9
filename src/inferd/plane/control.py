"""The repository API as the data plane sees it: load, unload, upload, routing written to the
stores, the stores' listing and status. An interface the plane owns (as ``OnDemand`` in
``inferd.plane.demand``), so the plane never imports the repository that fills it.

``inferd.repository.control.RepositoryControl`` implements it for a server's own manager; the
serving processes' ``SharedControl`` and ``FrontendControl`` (``inferd.workers``) extend that
one. ``RepositoryStatus`` is what ``inferd.repository.manager.RepositoryStatus`` holds, as read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from inferd.plane.registry import ModelRecord
from inferd.plane.routing import RoutingPolicy


class StoreStatus(Protocol):
    """How one store answered its last listing."""

    @property
    def uri(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def last_ok_unix_s(self) -> float | None: ...  # None: never answered
    @property
    def error(self) -> str: ...


class HeldModel(Protocol):
    """A model kept serving although its store's listing lost it."""

    @property
    def name(self) -> str: ...
    @property
    def store(self) -> str: ...
    @property
    def since_unix_s(self) -> float: ...
    @property
    def unload_at_unix_s(self) -> float: ...


class RepositoryStatus(Protocol):
    """What the index, the status route and the metrics say about the stores."""

    @property
    def synced_unix_s(self) -> float | None: ...  # the last listing every store answered
    @property
    def stores(self) -> Sequence[StoreStatus]: ...
    @property
    def held(self) -> Sequence[HeldModel]: ...
    @property
    def faults(self) -> int: ...  # listings judged a store fault since start


class RepositoryListing(Protocol):
    """The names in the stores, a note for each model that serves on in spite of its store,
    and when the stores were last listed."""

    @property
    def names(self) -> list[str]: ...
    @property
    def notes(self) -> dict[str, str]: ...
    @property
    def synced_unix_s(self) -> float | None: ...


class RepositoryControl(Protocol):
    async def view(self) -> RepositoryListing:
        """The last listing of the stores (never waits on a store)."""
        ...

    def status(self) -> RepositoryStatus: ...

    async def load(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> ModelRecord:
        """Triton's RepositoryModelLoad: from the repository, or from the files given."""
        ...

    async def unload(self, name: str, unload_dependents: bool = False) -> list[str]:
        """Triton's RepositoryModelUnload; the models unloaded, in order."""
        ...

    async def upload(self, name: str, archive: bytes | AsyncIterator[bytes]) -> ModelRecord:
        """Load a model archive and, once it serves, write it into its store."""
        ...

    async def persist_routing(self, name: str, policy: RoutingPolicy, keys: set[str]) -> bool:
        """Write ``keys`` of a routing policy into the model's store (False: it has none)."""
        ...
