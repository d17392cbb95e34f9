"""The model manager a server's Settings describe: its stores, control mode and limits, and
with lazy serving its budget (``inferd.repository.residency``)."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry

from inferd.app.flags import parse_size
from inferd.app.settings import Settings
from inferd.core.errors import ConfigError, InvalidInput
from inferd.observability.residency_metrics import ResidencyCollector
from inferd.plane.dataplane import DataPlane
from inferd.plane.registry import Registry
from inferd.repository.manager import ControlMode, ModelManager
from inferd.repository.memory import return_freed
from inferd.repository.residency import Budget, Residency
from inferd.repository.schemes import open_storage
from inferd.repository.single import SingleModelStorage
from inferd.repository.storage import Storage, StorageOptions
from inferd.repository.upload import check_model_name
from inferd.scheduling.cache import ResponseCache
from inferd.security.trust import CodePolicy


def storage_options(settings: Settings, cache_max_bytes: int = 0) -> StorageOptions:
    """How the server reaches its stores (S3 credentials and endpoint, the local cache)."""
    return StorageOptions(
        cache_dir=settings.model_cache_dir,
        cache_max_bytes=cache_max_bytes,
        s3_endpoint_url=settings.s3_endpoint_url,
        s3_access_key_id=settings.s3_access_key_id,
        s3_secret_access_key=settings.s3_secret_access_key,
        s3_region=settings.s3_region,
        s3_addressing_style=settings.s3_addressing_style,
    )


def single_model_storage(settings: Settings) -> Storage:
    """``--model-name``: the one local folder of ``--model-repository`` as that model."""
    try:
        check_model_name(settings.model_name)
    except InvalidInput as exc:
        raise ConfigError(f"--model-name: {exc.message}") from None
    if len(settings.model_repository) != 1:
        raise ConfigError("--model-name serves one folder: give exactly one --model-repository")
    (uri,) = settings.model_repository
    scheme, sep, path = uri.partition("://")
    if sep and scheme != "file":
        raise ConfigError(f"--model-name serves a local folder, not '{uri}'")
    return SingleModelStorage(Path(path if sep else uri), settings.model_name)


def model_manager(
    settings: Settings,
    registry: Registry,
    cache: ResponseCache | None,
    code_policy: CodePolicy | None = None,
) -> ModelManager:
    cache_max_bytes = 0
    if settings.model_cache_max_bytes.strip():
        cache_max_bytes = parse_size(settings.model_cache_max_bytes, "--model-cache-max-bytes")
        if not settings.lazy_serving():
            raise ConfigError(
                "--model-cache-max-bytes bounds the cache of lazy serving: give "
                "--model-memory-budget or --max-loaded-models too"
            )
    options = storage_options(settings, cache_max_bytes)
    storages = (
        [single_model_storage(settings)]
        if settings.model_name
        else [open_storage(uri, options) for uri in settings.model_repository]
    )
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
        lazy=settings.lazy_serving(),
        exit_on_error=settings.exit_on_error,
    )


def lazy_serving(
    settings: Settings, manager: ModelManager, plane: DataPlane, metrics: CollectorRegistry
) -> tuple[Residency, ResidencyCollector] | None:
    """Lazy serving's budget, pins and loads on demand, wired to the data plane and the
    metrics (and the collector, which a frontend worker replaces); None unless a budget is
    set."""
    if not settings.lazy_serving():
        if settings.pin_model:
            raise ConfigError("--pin-model needs lazy serving (--model-memory-budget or ...)")
        return None
    if settings.max_loaded_models < 0:
        raise ConfigError("--max-loaded-models must be 0 (no bound) or more")
    memory = 0
    if settings.model_memory_budget.strip():
        memory = parse_size(settings.model_memory_budget, "--model-memory-budget")
        if memory <= 0:
            raise ConfigError("--model-memory-budget must be more than 0 bytes")
    # Memory a model frees goes back to the system, so each load's growth is its own.
    return_freed()
    budget = Budget(memory, settings.max_loaded_models, frozenset(settings.pin_model))
    residency = Residency(manager, budget)
    plane.on_demand = residency
    residency_metrics = ResidencyCollector(residency)
    metrics.register(residency_metrics)
    return residency, residency_metrics
