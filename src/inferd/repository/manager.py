"""The control plane of one server: which models should serve, and bringing them there.

It joins the catalog (what the stores hold), the lifecycle (swap, retire, unload, the
dependency graph) and the unload guard, by Triton's model control modes: ``none`` loads the
repository at start, ``poll`` follows it (a ``Poller`` built by the server calls ``scan`` and
``apply``), ``explicit`` loads what ``--load-model`` and the repository API ask for. Every
change it makes to a store (routing, uploads) goes through the store, so replicas polling
the same store converge; explicit loads and unloads stay this server's own choice.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import ConfigError, InferdError, InvalidInput, NotFound
from inferd.plane.registry import ModelRecord, Registry
from inferd.repository import provenance, records, routing_file
from inferd.repository.catalog import Catalog, Listing, StoreState
from inferd.repository.guard import Held, UnloadGuard
from inferd.repository.lifecycle import Lifecycle, Outcome
from inferd.repository.loader import LoadOptions
from inferd.repository.local import LocalStorage
from inferd.repository.schemes import not_started
from inferd.repository.storage import ModelFiles, Storage, StorageError
from inferd.repository.upload import new_staging, remove_tree, write_files
from inferd.scheduling.cache import ResponseCache
from inferd.security.trust import CodePolicy, Origin

log = logging.getLogger("inferd.repository")

INDEX_WAIT_S = 0.25  # the index waits this long for a fresh listing, then answers the last one

__all__ = ["ControlMode", "ModelManager", "Outcome", "RepositoryStatus"]


class ControlMode(enum.Enum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"

    @classmethod
    def parse(cls, text: str) -> ControlMode:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ConfigError(
                f"--model-control-mode must be none, poll or explicit, not '{text}'"
            ) from None


@dataclass(slots=True)
class _Source:
    storage: Storage | None  # None: the files came with the load call
    files: ModelFiles  # the snapshot last acted on
    owned: Path | None = None  # a folder the manager wrote (load-call files), removed later


@dataclass(frozen=True, slots=True)
class RepositoryStatus:
    """What the index, the status route and the metrics say about the stores."""

    synced_unix_s: float | None  # the last listing every store answered; None: never
    stores: tuple[StoreState, ...]
    held: tuple[Held, ...]  # models serving on although their store stopped listing them
    faults: int  # listings judged a store fault since start


def _as_storage(root: Path | str | Storage) -> Storage:
    if isinstance(root, str | os.PathLike):
        return LocalStorage(Path(root))
    return root


class ModelManager:
    def __init__(
        self,
        roots: Iterable[Path | str | Storage],
        registry: Registry,
        *,
        default_max_batch_size: int = 64,
        auto_complete: bool = True,
        cache: ResponseCache | None = None,
        mode: ControlMode = ControlMode.NONE,
        poll_interval_s: float = 15.0,
        files_dir: Path | None = None,
        unload_max_fraction: float = 0.5,
        unload_grace_s: float = 60.0,
        code_policy: CodePolicy | None = None,
        lazy: bool = False,
        exit_on_error: bool = False,
    ) -> None:
        self.registry = registry
        self.catalog = Catalog([_as_storage(r) for r in roots])
        self.lifecycle = Lifecycle(
            registry,
            LoadOptions(default_max_batch_size, auto_complete, cache, code_policy or CodePolicy()),
        )
        self.guard = UnloadGuard(unload_max_fraction, unload_grace_s)
        self.mode = mode
        self.poll_interval_s = poll_interval_s
        # Where the files given in a load call are written (one folder per load).
        self.files_dir = files_dir or Path(tempfile.gettempdir()) / f"inferd-load-{os.getpid()}"
        self.wanted: set[str] = set()  # the models that should serve (strict readiness)
        self.followed: set[str] | None = None  # poll mode with --load-model: only these
        # Lazy serving: nothing loads at start, and a poll follows only the loaded models
        # (``inferd.repository.residency`` loads and evicts them).
        self.lazy = lazy
        # At start, a local folder that cannot be read is a ConfigError (--exit-on-error), not
        # a store that failed: a typo in a path must not give a ready server with no model.
        self.exit_on_error = exit_on_error
        self._sources: dict[str, _Source] = {}

    # ------------------------------------------------------------------ what the server knows

    @property
    def storages(self) -> list[Storage]:
        return self.catalog.storages

    @property
    def known(self) -> set[str]:
        return self.catalog.names

    async def scan(self) -> tuple[Listing, dict[str, StorageError]]:
        """Every model folder of every store, and the stores that did not answer."""
        return await self.catalog.scan()

    async def repository_names(self) -> list[str]:
        """The model names in the stores, from the last listing; outside poll mode (where the
        poller keeps it fresh) a rescan is started and awaited for at most INDEX_WAIT_S."""
        if self.mode is not ControlMode.POLL:
            await self.catalog.refresh(INDEX_WAIT_S)
        return sorted(self.catalog.names)

    def ready(self) -> bool:
        """Whether every model that should serve has a READY version."""
        return all(self.registry.is_ready(name) for name in self.wanted)

    def status(self) -> RepositoryStatus:
        return RepositoryStatus(
            self.catalog.synced_unix_s,
            tuple(self.catalog.stores.values()),
            tuple(self.guard.held.values()),
            self.guard.faults,
        )

    def notes(self) -> dict[str, str]:
        """A reason to show beside models that serve on in spite of their store."""
        return {name: held.reason() for name, held in self.guard.held.items()}

    def locked(self, name: str) -> AbstractAsyncContextManager[None]:
        return self.lifecycle.locked(name)

    def current(self, name: str) -> ModelRecord | None:
        return self.lifecycle.current(name)

    # ------------------------------------------------------------------ startup and polling

    async def start(self, load_model: Sequence[str] = ()) -> None:
        """Startup loading by control mode. In poll mode the caller then runs a Poller over
        ``scan`` and ``apply``, which follows only the ``--load-model`` models when named."""
        names: list[str] | None = None
        if (self.mode is ControlMode.EXPLICIT and not load_model) or self.lazy:
            names = []
        elif load_model and "*" not in load_model:
            names = list(load_model)
        await self.load_all(names)
        if self.mode is ControlMode.POLL:
            self.followed = None if names is None else set(names)

    async def load_all(self, names: Iterable[str] | None = None) -> None:
        """Load every model in the repositories, or only ``names``."""
        listing, failures = await self.scan()
        local = {s.uri for s in self.storages if isinstance(s, LocalStorage)}
        unread = [e.message for uri, e in failures.items() if uri in local]
        if unread and self.exit_on_error:  # remote stores keep their rules: caches serve
            raise ConfigError(not_started(unread))
        for error in failures.values():
            log.error("%s", error.message)
        if failures:
            for name, place in self.catalog.cached(set(failures)).items():
                listing.found.setdefault(name, place)
        self.catalog.mark_startup(listing)
        wanted = sorted(listing.found) if names is None else list(names)
        self.wanted.update(wanted)
        records.queue(self.registry, [n for n in wanted if n in listing.found])
        for name in wanted:
            if name in self.lifecycle.serving():
                continue  # a dependency of a model loaded before it
            if name not in listing.found:
                reason = "no such model folder in the repository"
                if name in listing.writing:
                    reason = "it is being written to the repository by another server"
                elif failures:  # it may be in the repository that did not answer
                    reason = "not found; " + "; ".join(e.message for e in failures.values())
                log.error("cannot load model '%s': %s", name, reason)
                self.registry.put(ModelRecord(name, reason=reason))
                continue
            storage, files = listing.found[name]
            try:
                async with self.locked(name):
                    await self.fetch_and_reload(name, storage, files)
            except StorageError as exc:
                if records.is_queued(self.current(name)):
                    self.registry.put(ModelRecord(name, reason=exc.message))

    def _follows(self, name: str) -> bool:
        if self.lazy:
            return name in self._sources
        return self.followed is None or name in self.followed

    async def apply(self, listing: Listing, failed: set[str]) -> None:
        """Bring the loaded models in line with a scan (poll mode); stores in ``failed``
        did not answer, so their models stay as they are. Models a store stops listing go
        through the unload guard."""
        present = set(listing.found) | listing.writing
        for storage in self.catalog.storages:
            if storage.uri in failed:
                continue
            had = {
                name
                for name, source in self._sources.items()
                if source.storage is storage and self._follows(name)
            }
            listed = listing.listed.get(storage.uri, set()) | present
            verdict = self.guard.review(storage.uri, had, listed)
            for name in sorted(verdict.unload):
                await self._poll_sync(name)
        for name, (storage, files) in listing.found.items():
            if not self._follows(name):
                continue
            self.guard.release(name)
            source = self._sources.get(name)
            if source is None or source.storage is not storage or source.files != files:
                await self._poll_sync(name)

    async def _poll_sync(self, name: str) -> None:
        await self._poll_model(name, False)
        if self.registry.is_ready(name):
            await self._retry_users(name)

    async def _retry_users(self, name: str) -> None:
        """Models that could not load for want of ``name`` (an ensemble whose composing model
        was missing) try again now that it serves."""
        for user in reversed(self.lifecycle.graph.users(name)):
            if user in self.wanted and self._follows(user) and not self.registry.is_ready(user):
                log.info("model '%s' is ready: loading model '%s', which needs it", name, user)
                await self._poll_model(user, True)

    async def _poll_model(self, name: str, force: bool) -> None:
        try:
            async with self.locked(name):
                try:
                    storage, files = await self.catalog.find(name)
                except NotFound:
                    if self.current(name) is not None or name in self._sources:
                        log.info("model '%s' left the repository: unloading it", name)
                        await self.unload_locked(name, forget=True)
                    return
                self.wanted.add(name)
                source = self._sources.get(name)
                changed = source is None or source.storage is not storage or source.files != files
                if changed or force:
                    await self.fetch_and_reload(name, storage, files)
        except StorageError:
            pass  # logged by fetch_and_reload, or the poller reports the store's outage
        except Exception:
            log.exception("updating model '%s' from the repository failed", name)

    # ------------------------------------------------------------------ load

    async def load_model(self, name: str, config: ModelConfig | None = None) -> ModelRecord:
        """(Re)load a model from its repository; unchanged versions stay as they are."""
        return (await self.load(name, config)).record

    async def load(self, name: str, config: ModelConfig | None = None) -> Outcome:
        """Load a model from the repository, after the models it needs (explicit loads)."""
        async with self.locked(name):
            storage, files = await self.catalog.find(name)
            self.catalog.names.add(name)
            outcome = await self.fetch_and_reload(name, storage, files, config)
        if outcome.ok:
            self.wanted.add(name)
        return outcome

    async def fetch_and_reload(
        self,
        name: str,
        storage: Storage,
        files: ModelFiles,
        config: ModelConfig | None = None,
        chain: tuple[str, ...] = (),
    ) -> Outcome:
        """Copy the model locally if need be, then reload it (hold ``locked(name)``); what
        its files may run follows from whether they are as they were at start."""
        folder = await self.catalog.fetch(name, storage, files)
        trust = self.catalog.origin(name, files)
        outcome = await self._reload(name, folder, files, storage.uri, trust, config, chain=chain)
        await self._set_source(name, _Source(storage, files))
        return outcome

    async def _reload(
        self,
        name: str,
        folder: Path,
        files: ModelFiles,
        origin: str,
        trust: Origin,
        config: ModelConfig | None,
        *,
        chain: tuple[str, ...] = (),
        all_or_nothing: bool = False,
    ) -> Outcome:
        """Plan the folder, load the models it needs, then swap its versions in; ``origin``
        keys the versions (a store's uri, a folder), ``trust`` says where the files came from
        for the code policy (``inferd.security.trust``)."""
        old = self.current(name)
        try:
            model_plan = await self.lifecycle.plan(name, folder, config)
            self.lifecycle.graph.declare(name, model_plan.dependencies)
            await self._load_dependencies(name, chain)
        except InferdError as exc:
            log.error("model '%s' is UNAVAILABLE: %s", name, exc.message)
            if all_or_nothing:
                return self.lifecycle.restore(name, old, exc.message)
            return self.lifecycle.fail(name, exc.message)
        return await self.lifecycle.reload(
            name, model_plan, files, origin, config, trust=trust, all_or_nothing=all_or_nothing
        )

    async def _load_dependencies(self, name: str, chain: tuple[str, ...]) -> None:
        """Load what ``name`` needs that is not READY yet, in order (ModelLoadError if one
        does not come up)."""
        for need in self.lifecycle.graph.load_order(name):
            if self.registry.is_ready(need) or need in chain:
                continue
            log.info("model '%s' needs model '%s': loading it first", name, need)
            try:
                async with self.locked(need):
                    storage, files = await self.catalog.find(need)
                    outcome = await self.fetch_and_reload(
                        need, storage, files, chain=(*chain, name)
                    )
            except InferdError as exc:
                raise ConfigError(
                    f"needs model '{need}', which cannot load: {exc.message}"
                ) from None
            if not self.registry.is_ready(need):
                raise ConfigError(f"needs model '{need}', which did not load: {outcome.reason}")
            self.wanted.add(need)

    async def load_files(
        self, name: str, config: ModelConfig, files: dict[str, bytes], max_bytes: int
    ) -> Outcome:
        """Load a model from files given in the call (Triton's ``file:`` parameters), written
        to a folder of the manager's own; the repository is not touched."""
        async with self.locked(name):
            await asyncio.to_thread(self.files_dir.mkdir, parents=True, exist_ok=True)
            owned = await asyncio.to_thread(new_staging, self.files_dir)
            folder = owned / name
            try:
                await asyncio.to_thread(write_files, files, folder, max_bytes)
                await asyncio.to_thread(provenance.record, folder, "a load call")
                stamps = await asyncio.to_thread(LocalStorage(owned).scan_model, name) or {}
                outcome = await self._reload(
                    name, folder, stamps, f"call:{owned}", Origin.API, config
                )
            except BaseException:
                await asyncio.to_thread(remove_tree, owned)
                raise
            if outcome.took_over:
                await self._set_source(name, _Source(None, stamps, owned))
            else:
                await asyncio.to_thread(remove_tree, owned)
        if outcome.ok:
            self.wanted.add(name)
        return outcome

    async def publish(self, name: str, storage: Storage, staged: Path) -> Outcome:
        """An upload (hold ``locked(name)``): load the staged folder, all versions or none,
        and only then write it into ``storage``, so a store never holds a model that did not
        load here. The model's ``routing.json`` is kept unless the upload brings one. Every
        file of the upload is recorded as the network's (``provenance``), whatever the archive
        held under that record's name, and keeps that origin in the store."""
        routing = staged / routing_file.ROUTING_FILE
        if not await asyncio.to_thread(routing.exists):
            data = await asyncio.to_thread(storage.read, f"{name}/{routing_file.ROUTING_FILE}")
            if data is not None:
                await asyncio.to_thread(routing.write_bytes, data)
        await asyncio.to_thread(provenance.record, staged, "an upload")
        stamps = await asyncio.to_thread(LocalStorage(staged.parent).scan_model, name) or {}
        origin = f"upload:{staged}"
        outcome = await self._reload(
            name, staged, stamps, origin, Origin.API, None, all_or_nothing=True
        )
        if not outcome.ok:
            return outcome
        try:
            files = await asyncio.to_thread(storage.put_model, name, staged)
        except StorageError:
            await self._revert(name)
            raise
        self.lifecycle.rekey(name, storage.uri, files)
        await self._set_source(name, _Source(storage, files))
        self.catalog.names.add(name)
        self.wanted.add(name)
        return outcome

    async def _revert(self, name: str) -> None:
        """After a failed write: serve what the store has again (hold ``locked(name)``)."""
        try:
            storage, files = await self.catalog.find(name)
        except NotFound:
            await self.unload_locked(name, forget=True)
            return
        except StorageError:
            return  # the store is down: the uploaded versions serve until it answers
        await self.fetch_and_reload(name, storage, files)

    async def _set_source(self, name: str, source: _Source) -> None:
        old = self._sources.get(name)
        self._sources[name] = source
        if old is not None and old.owned is not None and old.owned != source.owned:
            await asyncio.to_thread(remove_tree, old.owned)

    # ------------------------------------------------------------------ routing

    async def persist_routing(self, name: str, changes: dict[str, Any]) -> bool:
        """Write routing keys into the model's ``routing.json`` in its store (False: the
        model has no store, its files came with a load call)."""
        async with self.locked(name):
            source = self._sources.get(name)
            if source is None or source.storage is None:
                return False
            storage = source.storage
            rel = f"{name}/{routing_file.ROUTING_FILE}"
            data = await asyncio.to_thread(storage.read, rel)
            doc: dict[str, Any] = {}
            if data is not None:
                try:
                    doc = routing_file.parse(data, f"{storage.uri}/{rel}")
                except InvalidInput as exc:
                    log.warning("replacing %s", exc.message)
            doc.update(changes)
            await asyncio.to_thread(storage.write, rel, routing_file.encode(doc))
            log.info("model '%s': routing %s written to %s", name, sorted(changes), storage.uri)
            return True

    # ------------------------------------------------------------------ unload

    def is_held(self, name: str) -> bool:
        return name in self.guard.held

    async def unload_model(self, name: str, unload_dependents: bool = False) -> list[str]:
        """Unload a model and the loaded models that need it; with ``unload_dependents``
        (Triton's name) also what it needed that no other loaded model needs. Returns the
        models unloaded, in order."""
        async with self.locked(name):
            if self.current(name) is None:
                if name in self.known:
                    return []  # in the repository but not loaded: nothing to do
                raise NotFound(f"unknown model '{name}'")
        serving = self.lifecycle.serving()
        graph = self.lifecycle.graph
        users = [u for u in graph.users(name) if u in serving]
        needed = graph.orphans(name, serving - set(users)) if unload_dependents else []
        order = [*users, name, *needed]
        for model in order:
            if model != name:
                why = "needs" if model in users else "was needed by"
                log.info("unloading model '%s': it %s model '%s'", model, why, name)
            async with self.locked(model):
                await self.unload_locked(model, forget=self.is_held(model))
        return order

    async def unload_locked(self, name: str, *, forget: bool = False) -> None:
        """Stop routing to the model, drain and close its versions (hold ``locked(name)``).
        ``forget``: it left the repository, so drop its record; else it shows 'unloaded'."""
        self.wanted.discard(name)
        self.guard.release(name)
        self.catalog.forget(name)
        await self.lifecycle.unload(name, forget=forget)
        source = self._sources.pop(name, None)
        if source is not None and source.owned is not None:
            await asyncio.to_thread(remove_tree, source.owned)
        if forget:
            self.catalog.names.discard(name)

    async def close(self) -> None:
        await self.lifecycle.close()
        await asyncio.to_thread(remove_tree, self.files_dir)
