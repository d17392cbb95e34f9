"""The repository API's operations, allowed by control mode: load, unload and upload models.

``none`` allows no change after startup. ``poll`` follows the repository, so load and
unload calls are refused as in Triton, but an upload (written into the repository) is
allowed. ``explicit`` allows everything. Errors name the problem and change nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson

from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.text import parse_config_json
from inferd.errors import ConfigError, InvalidInput
from inferd.redact import redact
from inferd.registry import ModelRecord
from inferd.repository.local import LocalStorage
from inferd.repository.manager import ControlMode, ModelManager, Outcome
from inferd.repository.storage import StorageError
from inferd.repository.upload import (
    ARCHIVE_FILE,
    check_model_name,
    install,
    new_staging,
    remove_tree,
    restore,
    spool,
    stage_archive,
)
from inferd.trust import Origin

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

    async def unload(self, name: str) -> None:
        self._require_explicit(f"unload model '{name}'")
        _check_repository_name(name)
        await self.manager.unload_model(name)

    async def upload(self, name: str, archive: bytes | AsyncIterator[bytes]) -> ModelRecord:
        """Write a model archive into the first local repository and load it, atomically.
        A streamed archive is written to a staging file as it arrives."""
        if self.manager.mode is ControlMode.NONE:
            raise InvalidInput(
                f"cannot upload model '{name}': the model control mode is 'none'; start the "
                "server with --model-control-mode poll or explicit to accept uploads"
            )
        check_model_name(name)
        storage = self.manager.writable_storage()
        if storage is None:
            raise InvalidInput(
                f"cannot upload model '{name}': the server has no local --model-repository folder"
            )
        if not await asyncio.to_thread(storage.root.is_dir):
            raise StorageError(f"model repository '{storage.root}' is not a directory")
        staging = await asyncio.to_thread(new_staging, storage.root)
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
                return await self._install(name, storage, staged, staging)
        finally:
            await asyncio.to_thread(remove_tree, staging)

    async def _install(
        self, name: str, storage: LocalStorage, staged: Path, staging: Path
    ) -> ModelRecord:
        target = storage.root / name
        previous = await asyncio.to_thread(install, staged, target)
        outcome: Outcome | None = None
        try:
            files = await asyncio.to_thread(storage.scan_model, name)
            outcome = await self.manager.fetch_and_reload(
                name, storage, files or {}, origin=Origin.API
            )
        finally:
            if outcome is None or not outcome.ok:
                await asyncio.to_thread(restore, target, previous, staging)
                if previous is None:
                    await self.manager.unload_locked(name, forget=True)
                else:
                    files = await asyncio.to_thread(storage.scan_model, name)
                    await self.manager.fetch_and_reload(name, storage, files or {})
        assert outcome is not None
        if not outcome.ok:
            raise InvalidInput(
                f"the uploaded model '{name}' did not load: {redact(outcome.reason)}; the "
                "repository "
                "was left as it was"
            )
        return outcome.record


def _checked(name: str, outcome: Outcome) -> ModelRecord:
    if not outcome.ok:
        raise InvalidInput(f"failed to load model '{name}': {redact(outcome.reason)}")
    return outcome.record
