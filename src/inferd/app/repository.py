"""The model manager a server's Settings describe: its stores, control mode and limits."""

from __future__ import annotations

import os
from pathlib import Path

from inferd.app.settings import Settings
from inferd.core.errors import ConfigError
from inferd.core.registry import Registry
from inferd.repository.manager import ControlMode, ModelManager
from inferd.repository.schemes import open_storage
from inferd.repository.storage import StorageOptions
from inferd.scheduling.cache import ResponseCache
from inferd.security.trust import CodePolicy


def model_manager(
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
    if not 0 < settings.repository_unload_max_fraction <= 1:
        raise ConfigError("--repository-unload-max-fraction must be above 0 and at most 1")
    if settings.repository_unload_grace_s < 0:
        raise ConfigError("--repository-unload-grace-s must be 0 or more")
    files_dir = (
        Path(settings.model_cache_dir) / f"load-{os.getpid()}" if settings.model_cache_dir else None
    )
    return ModelManager(
        storages,
        registry,
        default_max_batch_size=settings.default_max_batch_size,
        auto_complete=not settings.disable_auto_complete_config,
        cache=cache,
        mode=mode,
        poll_interval_s=float(settings.repository_poll_secs),
        files_dir=files_dir,
        unload_max_fraction=settings.repository_unload_max_fraction,
        unload_grace_s=float(settings.repository_unload_grace_s),
        code_policy=code_policy,
    )
