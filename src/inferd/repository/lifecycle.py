"""Model lifecycle: what changed, swap, retire, unload; one change at a time per model.

A (re)load brings every new or changed version up (loaded and warmed up on worker threads)
while the old ones keep serving; the new record then replaces the old in one step, and retired
versions finish their in-flight requests before they close. Unchanged versions are kept as
they are. A reload that brings nothing up keeps what serves; an all-or-nothing reload (an
upload) swaps nothing in unless every version it selects came up. The dependency graph of the
loaded models lives here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import NotFound
from inferd.plane.model import ModelState, ModelVersion
from inferd.plane.registry import ModelRecord, Registry, VersionStatus
from inferd.repository import records
from inferd.repository.catalog import Key, version_keys
from inferd.repository.dependencies import Dependencies
from inferd.repository.loader import LoadOptions, Plan, load_version, plan
from inferd.repository.storage import ModelFiles, describe
from inferd.security.trust import Origin

log = logging.getLogger("inferd.repository")


@dataclass(frozen=True, slots=True)
class Outcome:
    record: ModelRecord
    ok: bool  # every version the policy selects is READY
    took_over: bool  # the new versions replaced the old (False: the old ones keep serving)
    reason: str = ""


class Lifecycle:
    def __init__(self, registry: Registry, options: LoadOptions) -> None:
        self.registry = registry
        self.options = options
        self.graph = Dependencies()
        self._locks: dict[str, asyncio.Lock] = {}
        self._keys: dict[str, dict[int, Key]] = {}

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

    def serving(self) -> set[str]:
        """The models with at least one loaded version."""
        return {r.name for r in self.registry.records() if r.versions}

    async def plan(self, name: str, folder: Path, override: ModelConfig | None) -> Plan:
        """Read and check a model folder on a worker thread (ConfigError naming the problem)."""
        return await asyncio.to_thread(plan, name, folder, override)

    async def reload(
        self,
        name: str,
        model_plan: Plan,
        files: ModelFiles,
        origin: str,
        override: ModelConfig | None = None,
        *,
        trust: Origin = Origin.REPOSITORY,
        all_or_nothing: bool = False,
    ) -> Outcome:
        """Bring ``model_plan`` up as model ``name`` (hold ``locked(name)``); ``trust`` (where
        the files came from) decides what code the new versions may run."""
        old = self.current(name)
        keys = version_keys(model_plan.selected, origin, files, override)
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
        loaded, failed = await self._load(name, model_plan, to_load, trust)
        reason = "; ".join(f"version {v}: {r}" for v, r in failed.items())
        if failed and all_or_nothing:
            await asyncio.gather(*(m.close() for m in loaded.values()))
            return self.restore(name, old, reason)
        versions = dict(sorted({**reused, **loaded}.items()))
        if not versions:
            return self.fail(name, reason, failed)
        record = _serving_record(name, old, versions, failed, model_plan)
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

    async def _load(
        self, name: str, model_plan: Plan, versions: list[int], trust: Origin
    ) -> tuple[dict[int, ModelVersion], dict[int, str]]:
        loaded: dict[int, ModelVersion] = {}
        failed: dict[int, str] = {}
        for v in versions:
            try:
                loaded[v] = await asyncio.to_thread(
                    load_version, name, v, model_plan, self.options, trust
                )
            except Exception as exc:
                failed[v] = describe(exc)
                log.error("model '%s' version %d is UNAVAILABLE: %s", name, v, failed[v])
        return loaded, failed

    def restore(self, name: str, old: ModelRecord | None, reason: str) -> Outcome:
        """Undo an all-or-nothing reload that failed: the old record, or no record at all."""
        if old is None:
            self.registry.forget(name)
            return Outcome(
                ModelRecord(name, reason=reason), ok=False, took_over=False, reason=reason
            )
        self.registry.put(old)
        return Outcome(old, ok=False, took_over=False, reason=reason)

    def fail(self, name: str, reason: str, failures: dict[int, str] | None = None) -> Outcome:
        """Record a reload that brought nothing up (the old versions, if any, serve on)."""
        record, kept = records.failed(name, self.current(name), reason, failures or {})
        self.registry.put(record)
        if not kept:
            self._keys.pop(name, None)
        return Outcome(record, ok=False, took_over=not kept, reason=reason)

    def rekey(self, name: str, origin: str, files: ModelFiles) -> None:
        """The serving versions now stand for ``files`` in ``origin`` (they were loaded from a
        copy of them: an upload is loaded before it is written)."""
        record = self.current(name)
        if record is not None:
            self._keys[name] = version_keys(list(record.versions), origin, files, None)

    async def unload(self, name: str, *, forget: bool = False) -> None:
        """Stop routing to the model, drain and close its versions (hold ``locked(name)``).
        ``forget``: it left the repository, so drop its record; else it shows 'unloaded'."""
        old = self.current(name)
        if old is None:
            return
        self.registry.put(records.draining(old))
        await asyncio.gather(*(v.close() for v in old.versions.values()))
        self._keys.pop(name, None)
        self.graph.forget(name)
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


def _serving_record(
    name: str,
    old: ModelRecord | None,
    versions: dict[int, ModelVersion],
    failed: dict[int, str],
    model_plan: Plan,
) -> ModelRecord:
    status = {v: VersionStatus(v, ModelState.READY) for v in versions}
    status.update({v: VersionStatus(v, ModelState.UNAVAILABLE, r) for v, r in failed.items()})
    for v, earlier in old.status.items() if old else ():
        if v not in status and v in model_plan.dirs and earlier.state is ModelState.UNAVAILABLE:
            status[v] = earlier  # e.g. 'unloaded' from an earlier swap
    return ModelRecord(
        name,
        versions=versions,
        status=dict(sorted(status.items())),
        state=ModelState.READY,
        config=versions[max(versions)].config,
    )
