"""The repository manager: decides which model versions are loaded, and swaps them in.

Model control modes follow Triton: ``none`` loads the repository at start, ``poll`` follows
its changes (``inferd.repository.poller``), ``explicit`` loads what ``--load-model`` and the
repository API ask for. A (re)load brings every new or changed version up (loaded and warmed
up on worker threads) while the old ones keep serving; the new record then replaces the old
in one step, and retired versions finish their in-flight requests before they close.
Unchanged versions are kept as they are. A reload that brings nothing up keeps what serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inferd.config.model_config_pb2 import ModelConfig
from inferd.errors import ConfigError, InferdError, NotFound
from inferd.model import ModelState, ModelVersion
from inferd.registry import ModelRecord, Registry, VersionStatus
from inferd.repository import records
from inferd.repository.loader import LoadOptions, load_version, plan
from inferd.repository.local import LocalStorage
from inferd.repository.schemes import open_storage
from inferd.repository.storage import (
    ModelFiles,
    Stamp,
    Storage,
    StorageError,
    StorageOptions,
    describe,
    version_files,
)
from inferd.repository.upload import new_staging, remove_tree, write_files
from inferd.scheduling.cache import ResponseCache
from inferd.trust import CodePolicy, Origin

if TYPE_CHECKING:
    from inferd.settings import Settings

log = logging.getLogger("inferd.repository")

Found = dict[str, tuple[Storage, ModelFiles]]  # model name -> where it is, and its files


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


@dataclass(frozen=True, slots=True)
class _Key:
    """What a loaded version was built from: equal keys mean nothing of it changed."""

    folder: str
    shared: tuple[tuple[str, Stamp], ...]  # the model's files outside version folders
    override: bytes  # the config given in the load call, serialized
    files: tuple[tuple[str, Stamp], ...]  # the version folder's files


@dataclass(slots=True)
class _Source:
    storage: Storage | None  # None: the files came with the load call
    files: ModelFiles  # the snapshot last acted on
    owned: Path | None = None  # a folder the manager wrote (load-call files), removed later


@dataclass(frozen=True, slots=True)
class Outcome:
    record: ModelRecord
    ok: bool  # every version the policy selects is READY
    took_over: bool  # the new versions replaced the old (False: the old ones keep serving)
    reason: str = ""


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
        code_policy: CodePolicy | None = None,
    ) -> None:
        self.storages = [_as_storage(r) for r in roots]
        self.registry = registry
        self.options = LoadOptions(
            default_max_batch_size, auto_complete, cache, code_policy or CodePolicy()
        )
        # The files of each model at the first scan: what the operator put there before start.
        self._initial: dict[str, ModelFiles] | None = None
        self.mode = mode
        self.poll_interval_s = poll_interval_s
        # Where the files given in a load call are written (one folder per load).
        self.files_dir = files_dir or Path(tempfile.gettempdir()) / f"inferd-load-{os.getpid()}"
        self.known: set[str] = set()  # model names seen in the repositories by the last scan
        self._locks: dict[str, asyncio.Lock] = {}
        self._sources: dict[str, _Source] = {}
        self._keys: dict[str, dict[int, _Key]] = {}
        self._fetch_failed: dict[str, ModelFiles] = {}
        self._duplicates: set[str] = set()
        self.followed: set[str] | None = None  # poll mode with --load-model: only these

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        registry: Registry,
        cache: ResponseCache | None,
        code_policy: CodePolicy | None = None,
    ) -> ModelManager:
        options = StorageOptions(
            cache_dir=settings.model_cache_dir,
            s3_endpoint_url=settings.s3_endpoint_url,
            s3_access_key_id=settings.s3_access_key_id,
            s3_secret_access_key=settings.s3_secret_access_key,
            s3_region=settings.s3_region,
            s3_addressing_style=settings.s3_addressing_style,
        )
        storages = [open_storage(uri, options) for uri in settings.model_repository]
        mode = ControlMode.parse(settings.model_control_mode)
        if settings.repository_poll_secs < 1:
            raise ConfigError("--repository-poll-secs must be at least 1")
        files_dir = (
            Path(settings.model_cache_dir) / f"load-{os.getpid()}"
            if settings.model_cache_dir
            else None
        )
        return cls(
            storages,
            registry,
            default_max_batch_size=settings.default_max_batch_size,
            auto_complete=not settings.disable_auto_complete_config,
            cache=cache,
            mode=mode,
            poll_interval_s=float(settings.repository_poll_secs),
            files_dir=files_dir,
            code_policy=code_policy,
        )

    # ------------------------------------------------------------------ repository view

    async def scan(self) -> tuple[Found, dict[str, StorageError]]:
        """Every model folder of every repository, and the repositories that did not answer."""
        results = await asyncio.gather(
            *(asyncio.to_thread(s.scan) for s in self.storages), return_exceptions=True
        )
        found: Found = {}
        failures: dict[str, StorageError] = {}
        for storage, result in zip(self.storages, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                failures[storage.uri] = (
                    result
                    if isinstance(result, StorageError)
                    else StorageError(f"model repository '{storage.uri}': {describe(result)}")
                )
                continue
            for name, files in result.items():
                if name not in found:
                    found[name] = (storage, files)
                elif name not in self._duplicates:
                    self._duplicates.add(name)
                    log.error(
                        "model '%s' is in two repositories, %s and %s: serving the first",
                        name,
                        found[name][0].uri,
                        storage.uri,
                    )
        self.known = set(found) if not failures else self.known | set(found)
        return found, failures

    async def repository_names(self) -> list[str]:
        """The model names in the repositories now (the last known ones if a store is down)."""
        await self.scan()
        return sorted(self.known)

    def writable_storage(self) -> LocalStorage | None:
        """The first local repository (uploads are written there)."""
        for storage in self.storages:
            if isinstance(storage, LocalStorage):
                return storage
        return None

    # ------------------------------------------------------------------ startup and polling

    async def start(self, load_model: Sequence[str] = ()) -> None:
        """Startup loading by control mode. In poll mode the caller then runs a Poller over
        ``scan`` and ``apply``, which follows only the ``--load-model`` models when named."""
        names: list[str] | None = None
        if self.mode is ControlMode.EXPLICIT and not load_model:
            names = []
        elif load_model and "*" not in load_model:
            names = list(load_model)
        await self.load_all(names)
        if self.mode is ControlMode.POLL:
            self.followed = None if names is None else set(names)

    async def load_all(self, names: Iterable[str] | None = None) -> None:
        """Load every model in the repositories, or only ``names``."""
        found, failures = await self.scan()
        if self._initial is None:
            self._initial = {name: files for name, (_, files) in found.items()}
        for error in failures.values():
            log.error("%s", error.message)
        wanted = sorted(found) if names is None else list(names)
        for name in wanted:
            if name not in found:
                reason = "no such model folder in the repository"
                if failures:  # it may be in the repository that did not answer
                    reason = "not found; " + "; ".join(e.message for e in failures.values())
                log.error("cannot load model '%s': %s", name, reason)
                self.registry.put(ModelRecord(name, reason=reason))
                continue
            storage, files = found[name]
            try:
                async with self.locked(name):
                    await self.fetch_and_reload(name, storage, files)
            except StorageError as exc:
                if self.current(name) is None:
                    self.registry.put(ModelRecord(name, reason=exc.message))

    async def apply(self, found: Found, failed: set[str]) -> None:
        """Bring the loaded models in line with a scan (poll mode); stores in ``failed``
        did not answer, so their models stay as they are."""
        for name, (storage, files) in found.items():
            if self.followed is not None and name not in self.followed:
                continue
            source = self._sources.get(name)
            if source is None or source.storage is not storage or source.files != files:
                await self._poll_sync(name)
        for name, source in list(self._sources.items()):
            if name in found or source.storage is None or source.storage.uri in failed:
                continue
            await self._poll_sync(name)

    async def _poll_sync(self, name: str) -> None:
        try:
            async with self.locked(name):
                try:
                    storage, files = await self.find(name)
                except NotFound:
                    if self.current(name) is not None:
                        log.info("model '%s' left the repository: unloading it", name)
                        await self.unload_locked(name, forget=True)
                    return
                source = self._sources.get(name)
                if source is None or source.storage is not storage or source.files != files:
                    await self.fetch_and_reload(name, storage, files)
        except StorageError:
            pass  # logged by fetch_and_reload, or the poller reports the store's outage
        except Exception:
            log.exception("updating model '%s' from the repository failed", name)

    # ------------------------------------------------------------------ load and unload

    @contextlib.asynccontextmanager
    async def locked(self, name: str) -> AsyncIterator[None]:
        """One change at a time per model name."""
        async with self._locks.setdefault(name, asyncio.Lock()):
            yield

    def current(self, name: str) -> ModelRecord | None:
        try:
            return self.registry.record(name)
        except NotFound:
            return None

    async def find(self, name: str) -> tuple[Storage, ModelFiles]:
        """Which repository holds a model, and its files now (NotFound, StorageError)."""
        errors: list[StorageError] = []
        for storage in self.storages:
            try:
                files = await asyncio.to_thread(storage.scan_model, name)
            except StorageError as exc:
                errors.append(exc)
                continue
            if files is not None:
                return storage, files
        if errors:
            raise errors[0]
        raise NotFound(f"unknown model '{name}': no such folder in the repository")

    async def load_model(self, name: str, config: ModelConfig | None = None) -> ModelRecord:
        """(Re)load a model from its repository; unchanged versions stay as they are."""
        return (await self.load(name, config)).record

    async def load(self, name: str, config: ModelConfig | None = None) -> Outcome:
        async with self.locked(name):
            storage, files = await self.find(name)
            return await self.fetch_and_reload(name, storage, files, config)

    async def fetch_and_reload(
        self,
        name: str,
        storage: Storage,
        files: ModelFiles,
        config: ModelConfig | None = None,
        origin: Origin | None = None,
    ) -> Outcome:
        """Copy the model locally if need be, then reload it (hold ``locked(name)``).
        ``origin`` defaults to STARTUP for files as they were at start, else REPOSITORY."""
        if origin is None:
            at_start = self._initial.get(name) if self._initial is not None else None
            origin = Origin.STARTUP if at_start == files else Origin.REPOSITORY
        try:
            folder = await asyncio.to_thread(storage.fetch, name, files)
        except StorageError as exc:
            if self._fetch_failed.get(name) != files:
                self._fetch_failed[name] = files
                log.error("cannot fetch model '%s': %s", name, exc.message)
            raise
        self._fetch_failed.pop(name, None)
        outcome = await self.reload(name, folder, files, config, origin)
        await self._set_source(name, _Source(storage, files))
        return outcome

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
                stamps = await asyncio.to_thread(LocalStorage(owned).scan_model, name) or {}
                outcome = await self.reload(name, folder, stamps, config, Origin.API)
            except BaseException:
                await asyncio.to_thread(remove_tree, owned)
                raise
            if outcome.took_over:
                await self._set_source(name, _Source(None, stamps, owned))
            else:
                await asyncio.to_thread(remove_tree, owned)
            return outcome

    async def _set_source(self, name: str, source: _Source) -> None:
        old = self._sources.get(name)
        self._sources[name] = source
        if old is not None and old.owned is not None and old.owned != source.owned:
            await asyncio.to_thread(remove_tree, old.owned)

    async def reload(
        self,
        name: str,
        folder: Path,
        files: ModelFiles,
        override: ModelConfig | None = None,
        origin: Origin = Origin.REPOSITORY,
    ) -> Outcome:
        """Bring ``folder`` up as model ``name`` (hold ``locked(name)``)."""
        old = self.current(name)
        try:
            model_plan = await asyncio.to_thread(plan, name, folder, override)
        except InferdError as exc:
            log.error("model '%s' is UNAVAILABLE: %s", name, exc.message)
            return self._failed(name, old, exc.message, {})
        by_version, shared = version_files(files)
        shared_key = tuple(sorted(shared.items()))
        override_bytes = override.SerializeToString(deterministic=True) if override else b""
        keys = {
            v: _Key(
                str(folder),
                shared_key,
                override_bytes,
                tuple(sorted(by_version.get(v, {}).items())),
            )
            for v in model_plan.selected
        }
        old_keys = self._keys.get(name, {})
        reused: dict[int, ModelVersion] = {}
        for v in model_plan.selected:
            current = old.versions.get(v) if old is not None else None
            if (
                current is not None
                and current.state is ModelState.READY
                and old_keys.get(v) == keys[v]
            ):
                reused[v] = current
        to_load = [v for v in model_plan.selected if v not in reused]
        if to_load:
            self.registry.put(records.interim(name, old, to_load))
        loaded: dict[int, ModelVersion] = {}
        failed: dict[int, str] = {}
        for v in to_load:
            try:
                loaded[v] = await asyncio.to_thread(
                    load_version, name, v, model_plan, self.options, origin
                )
            except Exception as exc:
                failed[v] = describe(exc)
                log.error("model '%s' version %d is UNAVAILABLE: %s", name, v, failed[v])
        versions = dict(sorted({**reused, **loaded}.items()))
        reason = "; ".join(f"version {v}: {r}" for v, r in failed.items())
        if not versions:
            return self._failed(name, old, reason, failed)
        status = {v: VersionStatus(v, ModelState.READY) for v in versions}
        status.update({v: VersionStatus(v, ModelState.UNAVAILABLE, r) for v, r in failed.items()})
        for v, earlier in old.status.items() if old else ():
            if v not in status and v in model_plan.dirs and earlier.state is ModelState.UNAVAILABLE:
                status[v] = earlier  # e.g. 'unloaded' from an earlier swap
        record = ModelRecord(
            name,
            versions=versions,
            status=dict(sorted(status.items())),
            state=ModelState.READY,
            config=versions[max(versions)].config,
        )
        kept = {id(m) for m in versions.values()}
        retired = [m for m in (old.versions.values() if old else ()) if id(m) not in kept]
        for m in retired:
            record.status.setdefault(m.version, VersionStatus(m.version, ModelState.UNLOADING))
        self.registry.routing(name).apply_config(model_plan.routing)
        self.registry.put(record)
        self._keys[name] = {v: keys[v] for v in versions}
        if retired:
            await records.retire(record, retired, set(model_plan.dirs))
        return Outcome(record, ok=not failed, took_over=True, reason=reason)

    def _failed(
        self, name: str, old: ModelRecord | None, reason: str, failures: dict[int, str]
    ) -> Outcome:
        record, kept = records.failed(name, old, reason, failures)
        self.registry.put(record)
        if not kept:
            self._keys.pop(name, None)
        return Outcome(record, ok=False, took_over=not kept, reason=reason)

    async def unload_model(self, name: str) -> None:
        async with self.locked(name):
            if self.current(name) is None:
                if name in self.known:
                    return  # in the repository but not loaded: nothing to do
                raise NotFound(f"unknown model '{name}'")
            await self.unload_locked(name)

    async def unload_locked(self, name: str, *, forget: bool = False) -> None:
        """Stop routing to the model, drain and close its versions (hold ``locked(name)``).
        ``forget``: it left the repository, so drop its record; else it shows 'unloaded'."""
        old = self.current(name)
        if old is None:
            return
        self.registry.put(records.draining(old))
        await asyncio.gather(*(v.close() for v in old.versions.values()))
        self._keys.pop(name, None)
        self._fetch_failed.pop(name, None)
        source = self._sources.pop(name, None)
        if source is not None and source.owned is not None:
            await asyncio.to_thread(remove_tree, source.owned)
        if forget:
            self.registry.forget(name)
        else:
            self.registry.put(records.unloaded(old))
        log.info("unloaded model '%s'", name)

    async def close(self) -> None:
        for name in self.registry.names():
            record = self.registry.remove(name)
            if record is not None:
                await asyncio.gather(*(v.close() for v in record.versions.values()))
        await asyncio.to_thread(remove_tree, self.files_dir)
