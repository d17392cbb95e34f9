"""TorchServe's management operations on inferd's model repository: register, scale,
unregister, set the default version, list and describe.

A registered archive becomes a model folder of the repository (the first store), so versions,
hot reload, S3 and replicas work as for any model::

    <repo>/<model>/config.pbtxt         backend "torchserve", version_policy all
    <repo>/<model>/<n>/<file>.mar       the archive (or a no-archive folder's files)
    <repo>/<model>/<n>/torchserve.json  what the registration asked (url, batch size, workers)
    <repo>/<model>/routing.json         the default version, once there are several

Each TorchServe version string gets the next version number. The default version (the first
one registered, or the one ``set-default`` names) is a traffic split of 100 % to it, written
beside the model. Registering and unregistering need the model API (``--enable-model-api``,
which is ``--model-control-mode explicit``), as in TorchServe; scaling rewrites the version's
``torchserve.json``, and inferd swaps in the version with its new worker count, requests
going on meanwhile. The files written keep the trust of their source (``sources``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from google.protobuf import text_format

from inferd.backends.torchserve import archive
from inferd.backends.torchserve.settings import REGISTRATION_FILE
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.text import parse_config_text
from inferd.core.errors import ConfigError, InferdError, InvalidInput, NotFound
from inferd.repository import provenance
from inferd.repository.manager import ModelManager
from inferd.repository.storage import PROVENANCE_FILE, ModelFiles, Storage, version_files
from inferd.repository.upload import check_model_name
from inferd.security.trust import Origin
from inferd.torchserve.errors import (
    METHOD_MESSAGE,
    TorchServeError,
    bad_request,
    model_not_found,
)
from inferd.torchserve.models import TorchServeModels, new_request_id
from inferd.torchserve.sources import ModelStore, Source

log = logging.getLogger("inferd.torchserve")

CONFIG_FILE = "config.pbtxt"
_TRUST = {Origin.API: 0, Origin.REPOSITORY: 1, Origin.STARTUP: 2}


class ModelApiDisabled(TorchServeError):
    """Registering and unregistering need the model API, as in TorchServe."""

    def __init__(self) -> None:
        super().__init__(405, "MethodNotAllowedException", METHOD_MESSAGE)


@dataclass(frozen=True, slots=True)
class Registration:
    """A register call's parameters (None: not given)."""

    url: str | None
    model_name: str | None = None
    handler: str | None = None
    batch_size: int | None = None
    max_batch_delay: int | None = None
    initial_workers: int | None = None
    response_timeout: int | None = None
    startup_timeout: int | None = None
    synchronous: bool = True


def _least_trusted(a: Origin, b: Origin) -> Origin:
    return a if _TRUST[a] <= _TRUST[b] else b


class Management:
    def __init__(
        self,
        models: TorchServeModels,
        manager: ModelManager,
        store: ModelStore,
        default_workers: int = 1,
        model_api: bool = False,
    ) -> None:
        self.models = models
        self.plane = models.plane
        self.manager = manager
        self.store = store
        self.default_workers = max(default_workers, 1)
        self.model_api = model_api
        self._lock = asyncio.Lock()  # one change at a time
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ the repository

    async def _files(self, name: str) -> tuple[Storage, ModelFiles]:
        try:
            return await self.manager.catalog.find(name)
        except NotFound:
            return await self.manager.catalog.home(name), {}

    async def _write_config(self, storage: Storage, name: str) -> None:
        """config.pbtxt serving every version folder (the model's own settings kept), written
        once: adding or removing a version then changes nothing the other versions load from."""
        rel = f"{name}/{CONFIG_FILE}"
        data = await asyncio.to_thread(storage.read, rel)
        config = parse_config_text(data.decode(), CONFIG_FILE) if data else ModelConfig()
        if data and config.version_policy.HasField("all"):
            return
        if not config.backend and not config.platform:
            config.backend = "torchserve"
        config.version_policy.all.SetInParent()
        text = text_format.MessageToString(config)
        await asyncio.to_thread(storage.write, rel, text.encode())

    async def _adopt(self, name: str, storage: Storage, origin: Origin) -> None:
        files = await asyncio.to_thread(storage.scan_model, name) or {}
        self.manager.catalog.adopt(name, files, origin)

    def _require_model_api(self) -> None:
        if not self.model_api:
            raise ModelApiDisabled()

    def _default_number(self, name: str) -> int | None:
        try:
            return self.models.default(name).version
        except InferdError:
            return None

    # ------------------------------------------------------------------ register

    async def register(self, request: Registration) -> tuple[int, str]:
        """Register an archive: (HTTP status, TorchServe's status message)."""
        self._require_model_api()
        if not request.url:
            raise bad_request("Parameter url is required.")
        if request.initial_workers == 0:
            raise bad_request(
                "initial_workers must be at least 1: inferd serves every registered version "
                "with worker processes"
            )
        source = await asyncio.to_thread(self.store.resolve, request.url)
        try:
            async with self._lock:
                return await self._register(source, request)
        finally:
            await asyncio.to_thread(source.discard)

    async def _register(self, source: Source, request: Registration) -> tuple[int, str]:
        manifest = await asyncio.to_thread(archive.read_manifest, source.path)
        model_yaml = await asyncio.to_thread(archive.read_model_yaml, source.path, manifest)
        name = request.model_name or manifest.model_name or source.default_name
        try:
            check_model_name(name)
        except InvalidInput as exc:
            raise bad_request(exc.message) from None
        version = manifest.model_version
        for loaded in self._loaded(name):
            if self._ts_version(loaded) == version:
                raise TorchServeError(
                    409,
                    "ConflictStatusException",
                    f"Model version {version} is already registered for model {name}",
                )
        storage, files = await self._files(name)
        by_version, _ = version_files(files)
        number = max(by_version, default=0) + 1
        workers, most = self._workers(model_yaml, request.initial_workers)
        doc = {
            "url": request.url,
            "min_workers": workers,
            "max_workers": most,
            "loaded_at_startup": False,
        }
        for key in ("handler", "batch_size", "max_batch_delay", "response_timeout"):
            value = getattr(request, key)
            if value is not None and value != -1:
                doc[key] = value
        if request.startup_timeout is not None and request.startup_timeout > 0:
            doc["startup_timeout"] = request.startup_timeout
        before = self.manager.catalog.origin(name, files) if files else Origin.STARTUP
        default = self._default_number(name)
        if default is not None:  # the first version stays the default, as in TorchServe
            await self.plane.set_routing(name, {"traffic_split": {str(default): 100}})
        await self._install(storage, name, number, source, doc)
        await self._write_config(storage, name)
        await self._adopt(name, storage, _least_trusted(before, source.origin))
        if not request.synchronous:
            self._background(self._load_new(storage, name, number, version))
            return 202, "Processing worker updates..."
        await self._load_new(storage, name, number, version)
        return 200, f'Model "{name}" Version: {version} registered with {workers} initial workers'

    async def install_at_start(self, source: Source, name: str | None) -> str:
        """A ``--models`` archive written into the repository before the models load; the
        model's name. An archive whose version is already there is left as it is."""
        manifest = await asyncio.to_thread(archive.read_manifest, source.path)
        model_yaml = await asyncio.to_thread(archive.read_model_yaml, source.path, manifest)
        model = name or manifest.model_name or source.default_name
        check_model_name(model)
        storage, files = await self._files(model)
        by_version, _ = version_files(files)
        if files:
            folder = await self.manager.catalog.fetch(model, storage, files)
            for number in by_version:
                try:
                    found = archive.find_archive(folder / str(number))
                    there = archive.read_manifest(found).model_version
                except ConfigError:
                    continue
                if there == manifest.model_version:
                    log.info("model '%s' version %s is in the repository already", model, there)
                    return model
        number = max(by_version, default=0) + 1
        workers, most = self._workers(model_yaml, None)
        doc = {
            "url": source.url,
            "min_workers": workers,
            "max_workers": most,
            "loaded_at_startup": True,
        }
        await self._install(storage, model, number, source, doc)
        await self._write_config(storage, model)
        return model

    def _workers(self, model_yaml: dict[str, Any], initial: int | None) -> tuple[int, int]:
        """(min, max) workers: model-config.yaml's pair when it is consistent, as in
        TorchServe, else the registration's initial workers (else the server's default)."""
        low, high = model_yaml.get("minWorkers"), model_yaml.get("maxWorkers")
        if isinstance(low, int) and isinstance(high, int) and 0 < low <= high:
            return low, high
        count = initial if initial is not None and initial > 0 else self.default_workers
        return count, count

    async def _install(
        self, storage: Storage, name: str, number: int, source: Source, doc: dict[str, Any]
    ) -> None:
        files = await asyncio.to_thread(source.files)
        if source.origin is Origin.API:  # downloaded: recorded before any file is written
            rel = f"{name}/{PROVENANCE_FILE}"
            existing = await asyncio.to_thread(storage.read, rel)
            sent = {f"{number}/{r}": data for r, data in files.items()}
            recorded = provenance.added(existing, sent, "a TorchServe registration")
            await asyncio.to_thread(storage.write, rel, recorded)
        for rel, data in files.items():
            await asyncio.to_thread(storage.write, f"{name}/{number}/{rel}", data)
        registration = json.dumps(doc, indent=2).encode()
        await asyncio.to_thread(storage.write, f"{name}/{number}/{REGISTRATION_FILE}", registration)

    async def _load_new(self, storage: Storage, name: str, number: int, version: str) -> None:
        """Load the model with its new version; a version that does not come up is removed
        from the repository again, and its error answered."""
        outcome = await self.manager.load(name)
        if self.plane.registry.ready_version(name, number) is not None:
            return
        reason = outcome.reason or "it did not load"
        log.error("model '%s' version %s did not load: %s", name, version, reason)
        await self._remove_version(storage, name, number)
        raise TorchServeError(
            500,
            "InternalServerException",
            f"Failed to start workers for model {name} version: {version} ({reason})",
        )

    def _background(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            log.error("a TorchServe management change failed: %s", error)

    # ------------------------------------------------------------------ unregister

    async def unregister(self, name: str, version: str = "") -> str:
        self._require_model_api()
        if not name:
            raise bad_request("Parameter url is required.")
        async with self._lock:
            model = self.models.find(name, version) if version else self.models.default(name)
            loaded = self._loaded(name)
            default = self._default_number(name)
            if len(loaded) > 1 and model.version == default:
                raise TorchServeError(
                    403,
                    "InvalidModelVersionException",
                    f"Cannot remove default version for model {name}",
                )
            storage, _ = await self._files(name)
            await self._remove_version(storage, name, model.version)
        return f'Model "{name}" unregistered'

    async def _remove_version(self, storage: Storage, name: str, number: int) -> None:
        """Remove one version's files; the model's last version takes the model with it."""
        storage, files = await self._files(name)
        before = self.manager.catalog.origin(name, files)
        by_version, shared = version_files(files)
        for rel in by_version.get(number, {}):
            await asyncio.to_thread(storage.remove, f"{name}/{number}/{rel}")
        remaining = [n for n in by_version if n != number]
        if remaining:
            await self._adopt(name, storage, before)
            await self.manager.load(name)
            return
        for rel in shared:
            await asyncio.to_thread(storage.remove, f"{name}/{rel}")
        async with self.manager.locked(name):
            await self.manager.unload_locked(name, forget=True)

    # ------------------------------------------------------------------ scale, default

    async def scale(
        self,
        name: str,
        version: str,
        min_workers: int,
        max_workers: int,
        synchronous: bool,
    ) -> tuple[int, str]:
        """TorchServe's scale workers: the version reloads with ``min_workers`` workers."""
        if max_workers < min_workers:
            raise bad_request("max_worker cannot be less than min_worker.")
        async with self._lock:
            model = self.models.find(name, version) if version else self.models.default(name)
            if min_workers < 1:
                raise bad_request(
                    "min_worker must be at least 1: inferd serves every registered version "
                    "with worker processes (unregister it instead)"
                )
            storage, files = await self._files(name)
            before = self.manager.catalog.origin(name, files)
            rel = f"{name}/{model.version}/{REGISTRATION_FILE}"
            data = await asyncio.to_thread(storage.read, rel)
            doc = json.loads(data) if data else {}
            doc.update({"min_workers": min_workers, "max_workers": max_workers})
            await asyncio.to_thread(storage.write, rel, json.dumps(doc, indent=2).encode())
            await self._adopt(name, storage, before)
            if not synchronous:
                self._background(self.manager.load(name))
                return 202, "Processing worker updates..."
            outcome = await self.manager.load(name)
        if self.plane.registry.ready_version(name, model.version) is None:
            raise TorchServeError(
                500,
                "InternalServerException",
                f"Failed to start workers for model {name} version: {version or None} "
                f"({outcome.reason})",
            )
        message = f"Workers scaled to {min_workers} for model: {name}"
        return 200, message + (f", version: {version}" if version else "")

    async def set_default(self, name: str, version: str) -> str:
        self.models.record(name)
        try:
            model = self.models.find(name, version)
        except TorchServeError:
            raise TorchServeError(
                404,
                "ModelVersionNotFoundException",
                f"Model version {version} does not exist for model {name}",
            ) from None
        async with self._lock:
            await self.plane.set_routing(name, {"traffic_split": {str(model.version): 100}})
        return f'Default version successfully updated for model "{name}" to "{version}"'

    # ------------------------------------------------------------------ reading

    def _loaded(self, name: str) -> list[Any]:
        try:
            return self.models.versions(name)
        except TorchServeError:
            return []

    @staticmethod
    def _ts_version(model: Any) -> str:
        return str(model.config.parameters["torchserve_model_version"].string_value)

    def list_models(self, limit: int, token: int) -> dict[str, Any]:
        """TorchServe's list: by name, a page of ``limit`` from ``token`` (its quirks kept:
        a limit over 100 or below 0 is 100, the next token is set whenever the page is full)."""
        if limit > 100 or limit < 0:
            limit = 100
        token = max(token, 0)
        names = self.models.names()
        last = token + limit
        found: dict[str, Any] = {}
        if last > len(names):
            last = len(names)
        else:
            found["nextPageToken"] = str(last)
        found["models"] = [
            {"modelName": n, "modelUrl": self.models.settings_of(self.models.default(n)).url}
            for n in names[token:last]
        ]
        return found

    async def describe(
        self, name: str, version: str = "", customized: bool = False
    ) -> list[dict[str, Any]]:
        """TorchServe's describe; ``customized`` adds the handler's ``describe_handle``
        answer as ``customizedMetadata`` (one version only, as in TorchServe)."""
        if version == "all":
            chosen = self.models.versions(name)
        else:
            chosen = [self.models.find(name, version) if version else self.models.default(name)]
        found = [self.models.describe(name, m) for m in chosen]
        if customized and version != "all":
            prediction = await self.models.predict(
                name, version, [b""], ["body"], [""], {"describe": "True"}, new_request_id()
            )
            try:
                metadata = json.loads(prediction.body or b"{}")
            except ValueError:
                metadata = None
            found[0]["customizedMetadata"] = metadata if isinstance(metadata, dict) else {}
        return found


def error_of(exc: InferdError) -> InferdError:
    """Errors raised while registering, in TorchServe's words where it has some."""
    if isinstance(exc, ConfigError):
        return TorchServeError(400, "InvalidModelException", exc.message)
    if isinstance(exc, NotFound):
        return model_not_found(exc.message)
    return exc
