"""The repository side of the control plane: what the stores hold, and what changed.

It lists every store (each on a worker thread, with the store's own short timeouts), keeps the
last listing and when each store last answered, finds and fetches one model, and stamps each
version with what it was built from, so a reload keeps every version whose files did not
change. Nothing here runs on a request path: the index answers from the last listing. It also
remembers each model's files as they were at start, which the code policy trusts more than
files that arrive later (``inferd.security.trust``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import NotFound
from inferd.repository.routing_file import ROUTING_FILE
from inferd.repository.storage import (
    WRITING_MARKER,
    ModelFiles,
    Stamp,
    Storage,
    StorageError,
    describe,
    version_files,
)
from inferd.repository.upload import check_model_name
from inferd.security.trust import Origin

log = logging.getLogger("inferd.repository")


@dataclass(frozen=True, slots=True)
class Key:
    """What a loaded version was built from: equal keys mean nothing of it changed."""

    origin: str  # the store's uri, or the folder of a load call's files
    shared: tuple[tuple[str, Stamp], ...]  # the model's files outside version folders
    override: bytes  # the config given in the load call, serialized
    files: tuple[tuple[str, Stamp], ...]  # the version folder's files


def version_keys(
    versions: list[int], origin: str, files: ModelFiles, override: ModelConfig | None
) -> dict[int, Key]:
    """The key of each version; ``routing.json`` is left out, so a routing change reloads
    nothing (it is applied on its own)."""
    by_version, shared = version_files(files)
    shared_key = tuple(sorted((r, s) for r, s in shared.items() if r != ROUTING_FILE))
    override_bytes = override.SerializeToString(deterministic=True) if override else b""
    return {
        v: Key(origin, shared_key, override_bytes, tuple(sorted(by_version.get(v, {}).items())))
        for v in versions
    }


@dataclass(slots=True)
class Listing:
    """One scan: where each model is (the first store that has it) and what every store that
    answered lists; models being written elsewhere are in ``writing``, not in ``found``."""

    found: dict[str, tuple[Storage, ModelFiles]] = field(default_factory=dict)
    listed: dict[str, set[str]] = field(default_factory=dict)  # store uri -> model names
    writing: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class StoreState:
    uri: str
    ok: bool
    last_ok_unix_s: float | None  # None: never answered
    error: str = ""


class Catalog:
    def __init__(self, storages: list[Storage]) -> None:
        self.storages = storages
        self.names: set[str] = set()  # model names the stores held at the last scan
        # Where each model was at the last scan, and its files (a store that did not answer
        # keeps what it listed before): lazy serving reads sizes and configs from it.
        self.listing = Listing()
        self.synced_unix_s: float | None = None  # the last scan every store answered
        self.stores = {s.uri: StoreState(s.uri, False, None) for s in storages}
        # Scans may overlap (the poller's, an index call's): a slow one that began earlier
        # must not overwrite what a later one found. Each scan is numbered when it starts.
        self._scans_started = 0
        self._scan_applied = 0
        self._duplicates: set[str] = set()
        self._fetch_failed: dict[str, ModelFiles] = {}
        self._refresh: asyncio.Task[tuple[Listing, dict[str, StorageError]]] | None = None
        # Each model's files at start (routing.json left out): what the operator put there.
        self._startup: dict[str, ModelFiles] | None = None
        # Files the server itself wrote for a model, and where what they hold came from.
        self._adopted: dict[str, tuple[ModelFiles, Origin]] = {}

    def mark_startup(self, listing: Listing) -> None:
        """Remember the models found at start (the first call counts; a store that did not
        answer then holds no model 'present at start' except what its cache served)."""
        if self._startup is None:
            self._startup = {name: _code_files(files) for name, (_, files) in listing.found.items()}

    def origin(self, name: str, files: ModelFiles) -> Origin:
        """STARTUP for a model whose files are as they were at start, the adopted origin for
        files as the server wrote them (``adopt``), else REPOSITORY."""
        code = _code_files(files)
        adopted = self._adopted.get(name)
        if adopted is not None and adopted[0] == code:
            return adopted[1]
        at_start = self._startup.get(name) if self._startup is not None else None
        return Origin.STARTUP if at_start == code else Origin.REPOSITORY

    def adopt(self, name: str, files: ModelFiles, origin: Origin) -> None:
        """The model's files are now ``files``, written by the server from a source of
        ``origin`` (a TorchServe archive registered from the operator's model store counts as
        present at start, a downloaded one as sent through the API)."""
        self._adopted[name] = (_code_files(files), origin)

    async def scan(self) -> tuple[Listing, dict[str, StorageError]]:
        """Every model folder of every store, and the stores that did not answer."""
        self._scans_started += 1
        number = self._scans_started
        results = await asyncio.gather(
            *(asyncio.to_thread(s.scan) for s in self.storages), return_exceptions=True
        )
        listing = Listing()
        failures: dict[str, StorageError] = {}
        now = time.time()
        newest = number > self._scan_applied  # no later scan has reported yet
        if newest:
            self._scan_applied = number
        for storage, result in zip(self.storages, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                error = (
                    result
                    if isinstance(result, StorageError)
                    else StorageError(f"model repository '{storage.uri}': {describe(result)}")
                )
                failures[storage.uri] = error
                if newest:
                    last = self.stores[storage.uri].last_ok_unix_s
                    self.stores[storage.uri] = StoreState(storage.uri, False, last, error.message)
                continue
            if newest:
                self.stores[storage.uri] = StoreState(storage.uri, True, now)
            listing.listed[storage.uri] = set(result)
            for name, files in result.items():
                if WRITING_MARKER in files:
                    listing.writing.add(name)
                elif name not in listing.found:
                    listing.found[name] = (storage, files)
                elif name not in self._duplicates:
                    self._duplicates.add(name)
                    log.error(
                        "model '%s' is in two repositories, %s and %s: serving the first",
                        name,
                        listing.found[name][0].uri,
                        storage.uri,
                    )
        if newest:
            every = set(listing.found) | listing.writing
            self.names = every if not failures else self.names | every
            kept = self.listing.found if failures else {}
            self.listing = Listing({**kept, **listing.found}, listing.listed, listing.writing)
            if not failures:
                self.synced_unix_s = now
        return listing, failures

    async def refresh(self, max_wait_s: float) -> None:
        """Start a rescan in the background and wait for it at most ``max_wait_s``; while an
        earlier one still runs (a store that hangs), return at once."""
        if self._refresh is not None and not self._refresh.done():
            return
        task = self._refresh = asyncio.get_running_loop().create_task(self.scan())
        task.add_done_callback(_consume)
        # Past the wait, answer from the last listing: the scan goes on, or failed and says so.
        with contextlib.suppress(TimeoutError, StorageError):
            await asyncio.wait_for(asyncio.shield(task), max_wait_s)

    async def find(self, name: str) -> tuple[Storage, ModelFiles]:
        """Which store holds a model, and its files now (NotFound, StorageError)."""
        errors: list[StorageError] = []
        for storage in self.storages:
            try:
                files = await asyncio.to_thread(storage.scan_model, name)
            except StorageError as exc:
                errors.append(exc)
                continue
            if files is not None:
                if WRITING_MARKER in files:
                    raise StorageError(
                        f"model '{name}' is being written to model repository "
                        f"'{storage.uri}' by another server; try again when it is done"
                    )
                return storage, files
        if errors:
            raise errors[0]
        raise NotFound(f"unknown model '{name}': no such folder in the repository")

    async def home(self, name: str) -> Storage:
        """Where an upload of ``name`` goes: the store that holds it, else the first."""
        check_model_name(name)
        for storage in self.storages:
            if await asyncio.to_thread(storage.scan_model, name) is not None:
                return storage
        return self.storages[0]

    async def fetch(self, name: str, storage: Storage, files: ModelFiles) -> Path:
        """A local folder with the model's files (logged once per failing snapshot)."""
        try:
            folder = await asyncio.to_thread(storage.fetch, name, files)
        except StorageError as exc:
            if self._fetch_failed.get(name) != files:
                self._fetch_failed[name] = files
                log.error("cannot fetch model '%s': %s", name, exc.message)
            raise
        self._fetch_failed.pop(name, None)
        return folder

    def forget(self, name: str) -> None:
        self._fetch_failed.pop(name, None)

    def cached(self, failed: set[str]) -> dict[str, tuple[Storage, ModelFiles]]:
        """What the unreachable stores left in their local caches, to serve meanwhile."""
        found: dict[str, tuple[Storage, ModelFiles]] = {}
        for storage in self.storages:
            cached = getattr(storage, "cached", None)  # remote stores keep a cache
            if storage.uri not in failed or cached is None:
                continue
            models: dict[str, ModelFiles] = cached()
            log.warning(
                "model repository '%s' is unreachable: serving %d model(s) from its local cache "
                "until it answers%s",
                storage.uri,
                len(models),
                f" ({', '.join(models)})" if models else "",
            )
            found.update({name: (storage, files) for name, files in models.items()})
        return found


def _code_files(files: ModelFiles) -> ModelFiles:
    """A model's files but its routing.json, which a routing change rewrites."""
    return {rel: stamp for rel, stamp in files.items() if rel != ROUTING_FILE}


def _consume(task: asyncio.Task[object]) -> None:
    if not task.cancelled():
        task.exception()  # a failed background refresh is reported by the next scan
