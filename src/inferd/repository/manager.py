"""The repository manager: turns model folders into loaded versions in the registry.

Loading runs on worker threads; a model that fails is recorded UNAVAILABLE with its reason
and never stops the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from pathlib import Path

from inferd.backends import select_backend
from inferd.backends.base import Backend, InstancePlacement, Runtime
from inferd.errors import ConfigError, InferdError, NotFound
from inferd.model import ModelState, ModelVersion
from inferd.registry import ModelRecord, Registry, VersionStatus
from inferd.repository.config import build_spec, read_config
from inferd.repository.layout import list_models, select_versions, version_dirs
from inferd.repository.model_config_pb2 import ModelConfig, ModelInstanceGroup
from inferd.repository.warmup import run_warmup
from inferd.scheduling.batcher import DirectScheduler, DynamicBatcher, Scheduler
from inferd.scheduling.cache import ResponseCache
from inferd.scheduling.instances import InstancePool
from inferd.scheduling.policy import BatchingOptions
from inferd.stats import ModelStats

log = logging.getLogger("inferd.repository")


class ModelManager:
    def __init__(
        self,
        roots: Iterable[Path],
        registry: Registry,
        *,
        default_max_batch_size: int = 64,
        auto_complete: bool = True,
        cache: ResponseCache | None = None,
    ) -> None:
        self.roots = [Path(r) for r in roots]
        self.registry = registry
        self.default_max_batch_size = default_max_batch_size
        self.auto_complete = auto_complete
        self.cache = cache  # the server-wide response cache, if --cache-size > 0
        self._locks: dict[str, asyncio.Lock] = {}

    def available(self) -> dict[str, Path]:
        return list_models(self.roots)

    async def load_all(self, names: Iterable[str] | None = None) -> None:
        """Load every model in the repositories, or only ``names``."""
        found = self.available()
        wanted = sorted(found) if names is None else list(names)
        for name in wanted:
            if name not in found:
                log.error("cannot load model '%s': no such folder in the repository", name)
                self.registry.put(
                    ModelRecord(name, reason="no such model folder in the repository")
                )
                continue
            await self.load_model(name)

    async def load_model(self, name: str) -> ModelRecord:
        """(Re)load a model; the new versions replace the old ones in one step."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            model_dir = self.available().get(name)
            if model_dir is None:
                raise NotFound(f"unknown model '{name}': no such folder in the repository")
            record = await asyncio.to_thread(self._build, name, model_dir)
            old = self.registry.remove(name)
            self.registry.put(record)
            if old is not None:
                await _retire(old)
            return record

    async def unload_model(self, name: str) -> None:
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            record = self.registry.remove(name)
            if record is None:
                raise NotFound(f"unknown model '{name}'")
            await _retire(record)

    async def close(self) -> None:
        for name in self.registry.names():
            record = self.registry.remove(name)
            if record is not None:
                await _retire(record)

    def _build(self, name: str, model_dir: Path) -> ModelRecord:
        record = ModelRecord(name, state=ModelState.LOADING)
        try:
            config = read_config(model_dir)
            dirs = version_dirs(model_dir)
            if not dirs:
                raise ConfigError(
                    f"model '{name}' has no version folder (expected {name}/1/<model file>)"
                )
            selected = select_versions(dirs, config.version_policy)
            backend = select_backend(config, (dirs[v] for v in selected))
        except InferdError as exc:
            log.error("model '%s' is UNAVAILABLE: %s", name, exc.message)
            record.state, record.reason = ModelState.UNAVAILABLE, exc.message
            return record
        for version in selected:
            started = time.perf_counter()
            try:
                loaded = self._load_version(
                    name, version, model_dir, dirs[version], config, backend
                )
            except Exception as exc:
                reason = exc.message if isinstance(exc, InferdError) else f"{exc}"
                log.error("model '%s' version %d is UNAVAILABLE: %s", name, version, reason)
                record.status[version] = VersionStatus(version, ModelState.UNAVAILABLE, reason)
                continue
            loaded.load_seconds = time.perf_counter() - started
            record.versions[version] = loaded
            record.status[version] = VersionStatus(version, ModelState.READY)
            record.config = loaded.config
            log.info(
                "loaded model '%s' version %d (%s, %d instance(s)) in %.2f s",
                name,
                version,
                backend.name,
                loaded.instance_count,
                time.perf_counter() - started,
            )
        if record.versions:
            record.state = ModelState.READY
        else:
            record.state = ModelState.UNAVAILABLE
            record.reason = "; ".join(
                f"version {s.version}: {s.reason}" for s in record.status.values()
            )
        return record

    def _load_version(
        self,
        name: str,
        version: int,
        model_dir: Path,
        version_dir: Path,
        base: ModelConfig,
        backend: Backend,
    ) -> ModelVersion:
        config = ModelConfig()
        config.CopyFrom(base)
        if self.auto_complete:
            backend.complete_config(version_dir, config, self.default_max_batch_size)
        elif not config.platform and not config.backend:
            config.backend = backend.name
        spec = build_spec(config)
        batching = (
            BatchingOptions.from_config(config) if config.HasField("dynamic_batching") else None
        )
        if config.response_cache.enable and self.cache is None:
            raise ConfigError(
                "response_cache is enabled but the server has no cache (start it with "
                "--cache-size BYTES)"
            )
        runtimes: list[Runtime] = []
        try:
            for placement in placements(config, backend):
                runtimes.append(backend.load(version_dir, config, placement))
            warmups = run_warmup(config, spec, runtimes, model_dir)
        except Exception:
            for rt in runtimes:
                rt.close()
            raise
        if warmups:
            log.info("warmed up model '%s' version %d: %d execution(s)", name, version, warmups)
        pool = InstancePool(f"{name}/{version}", runtimes)
        stats = ModelStats()
        scheduler: Scheduler = (
            DynamicBatcher(f"{name}/{version}", pool, batching, stats)
            if batching is not None
            else DirectScheduler(pool, stats)
        )
        return ModelVersion(
            name=name,
            version=version,
            config=config,
            spec=spec,
            scheduler=scheduler,
            stats=stats,
            cache=self.cache if config.response_cache.enable else None,
            instance_count=pool.count,
        )


def placements(config: ModelConfig, backend: Backend) -> list[InstancePlacement]:
    """One placement per execution instance, from ``instance_group`` (default: one)."""
    groups = list(config.instance_group) or [ModelInstanceGroup(count=1)]
    has_gpu = backend.gpu_available()
    wanted: list[tuple[str, int]] = []
    for group in groups:
        count = group.count or 1
        kind = "CPU"
        if group.kind == ModelInstanceGroup.KIND_GPU and not has_gpu:
            log.warning(
                "model '%s' asks for KIND_GPU but no GPU is available; using the CPU", config.name
            )
        elif group.kind in (ModelInstanceGroup.KIND_GPU, ModelInstanceGroup.KIND_AUTO) and has_gpu:
            kind = "GPU"
        devices = list(group.gpus) if kind == "GPU" and group.gpus else [0]
        wanted.extend((kind, device) for device in devices for _ in range(count))
    return [InstancePlacement(kind, device, len(wanted)) for kind, device in wanted]


async def _retire(record: ModelRecord) -> None:
    for version in record.versions.values():
        await version.close()
