"""The repository API's operations, allowed by control mode: load, unload, upload, routing.

``none`` allows no change after startup. ``poll`` follows the repository, so load and
unload calls are refused as in Triton, but an upload (written into the repository) is
allowed, and so is an unload that confirms a model its store stopped listing (held by the
unload guard). ``explicit`` allows everything. Errors name the problem and change nothing.
Uploads and routing changes are written into the model's store, which replicas share;
loads and unloads are this server's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson

from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.text import parse_config_json
from inferd.core.errors import ConfigError, InvalidInput
from inferd.plane.registry import ModelRecord
from inferd.plane.routing import RoutingPolicy
from inferd.repository import routing_file
from inferd.repository.manager import ControlMode, ModelManager, Outcome, RepositoryStatus
from inferd.repository.storage import StorageError
from inferd.repository.upload import (
    ARCHIVE_FILE,
    check_model_name,
    new_staging,
    remove_tree,
    spool,
    stage_archive,
)
from inferd.security.redact import redact

DEFAULT_MAX_UPLOAD_BYTES = 1 << 30


def parse_config_override(name: str, text: str) -> ModelConfig:
    """The ``config`` parameter of a load call: a model config as Triton's JSON."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"parameters.config is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("parameters.config must be a JSON object (a model config)")
    try:
        config = parse_config_json(doc, "parameters.config")
    except ConfigError as exc:
        raise InvalidInput(exc.message) from None
    if config.name and config.name != name:
        raise InvalidInput(f"parameters.config names model '{config.name}', not '{name}'")
    return config


def _check_repository_name(name: str) -> None:
    if not name or name.startswith(".") or "/" in name or "\\" in name:
        raise InvalidInput(f"'{name}' is not a model name")


@dataclass(frozen=True, slots=True)
class RepositoryView:
    """What the index adds to the loaded models: the names in the stores, a reason for each
    model that serves on in spite of its store, and when the stores were last listed."""

    names: list[str]
    notes: dict[str, str]
    synced_unix_s: float | None


class RepositoryControl:
    def __init__(
        self, manager: ModelManager, max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    ) -> None:
        self.manager = manager
        self.max_upload_bytes = max_upload_bytes

    def _require_explicit(self, what: str) -> None:
        mode = self.manager.mode
        if mode is ControlMode.EXPLICIT:
            return
        hint = (
            " (it follows the repository: change the repository instead)"
            if mode is ControlMode.POLL
            else ""
        )
        raise InvalidInput(
            f"cannot {what}: the model control mode is '{mode.value}'{hint}; start the server "
            "with --model-control-mode explicit to load and unload models through the API"
        )

    async def view(self) -> RepositoryView:
        names = await self.manager.repository_names()
        return RepositoryView(names, self.manager.notes(), self.manager.catalog.synced_unix_s)

    def status(self) -> RepositoryStatus:
        return self.manager.status()

    async def load(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> ModelRecord:
        """Triton's RepositoryModelLoad: from the repository, or from the files given."""
        self._require_explicit(f"load model '{name}'")
        _check_repository_name(name)
        config = parse_config_override(name, config_json) if config_json is not None else None
        if files:
            check_model_name(name)
            if config is None:
                raise InvalidInput(
                    f"load of model '{name}': 'file:' parameters need a 'config' parameter too"
                )
            outcome = await self.manager.load_files(name, config, files, self.max_upload_bytes)
        else:
            outcome = await self.manager.load(name, config)
        return _checked(name, outcome)

    async def unload(self, name: str, unload_dependents: bool = False) -> list[str]:
        """Triton's RepositoryModelUnload; returns the models unloaded, in order."""
        _check_repository_name(name)
        if not (self.manager.mode is ControlMode.POLL and self.manager.is_held(name)):
            self._require_explicit(f"unload model '{name}'")
        return await self.manager.unload_model(name, unload_dependents)

    async def upload(self, name: str, archive: bytes | AsyncIterator[bytes]) -> ModelRecord:
        """Load a model archive and, once it serves, write it into its store (the one that
        holds the model, else the first): all of it, or nothing. A streamed archive is
        written to a staging file as it arrives."""
        if self.manager.mode is ControlMode.NONE:
            raise InvalidInput(
                f"cannot upload model '{name}': the model control mode is 'none'; start the "
                "server with --model-control-mode poll or explicit to accept uploads"
            )
        check_model_name(name)
        storage = await self.manager.catalog.home(name)
        base = await asyncio.to_thread(storage.staging_dir)
        if not await asyncio.to_thread(base.is_dir):
            raise StorageError(f"model repository '{storage.uri}' is not a directory")
        staging = await asyncio.to_thread(new_staging, base)
        try:
            path = staging / ARCHIVE_FILE
            if isinstance(archive, bytes):
                await asyncio.to_thread(path.write_bytes, archive)
            else:
                await spool(archive, path)
            staged = await asyncio.to_thread(
                stage_archive, path, staging, name, self.max_upload_bytes
            )
            async with self.manager.locked(name):
                outcome = await self.manager.publish(name, storage, staged)
        finally:
            await asyncio.to_thread(remove_tree, staging)
        if not outcome.ok:
            raise InvalidInput(
                f"the uploaded model '{name}' did not load: {redact(outcome.reason)}; the "
                "repository was left as it was"
            )
        return outcome.record

    async def persist_routing(self, name: str, policy: RoutingPolicy, keys: set[str]) -> bool:
        """Write ``keys`` of a routing policy beside the model's config in its store (before
        the caller applies it); False when the model has no store (load-call files)."""
        return await self.manager.persist_routing(name, routing_file.document(policy, keys))


def _checked(name: str, outcome: Outcome) -> ModelRecord:
    if not outcome.ok:
        raise InvalidInput(f"failed to load model '{name}': {redact(outcome.reason)}")
    return outcome.record
