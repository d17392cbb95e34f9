"""The records one model name goes through while the lifecycle changes it.

While new versions load, the old ones keep serving and the new ones show LOADING; a
failed reload keeps what serves and shows why; retired versions drain, then show
UNAVAILABLE 'unloaded' (or vanish with their folder); an unload drains every version.
The registry swaps whole records, so a request sees one of these states, never a mix.
"""

from __future__ import annotations

import asyncio
import logging

from inferd.plane.model import ModelState, ModelVersion
from inferd.plane.registry import ModelRecord, Registry, VersionStatus

log = logging.getLogger("inferd.repository")

UNLOADED = "unloaded"


def queue(registry: Registry, names: list[str]) -> None:
    """Models that startup loading will reach in turn: each shows LOADING (Triton's word), no
    version, until then, rather than as a repository model nobody asked for ('unloaded')."""
    known = set(registry.names())
    for name in names:
        if name not in known:
            registry.put(ModelRecord(name, state=ModelState.LOADING))


def is_queued(record: ModelRecord | None) -> bool:
    """No record yet, or the one ``queue`` put there: nothing was loaded or tried."""
    return record is None or (
        not record.versions and not record.status and record.state is ModelState.LOADING
    )


def interim(name: str, old: ModelRecord | None, loading: list[int]) -> ModelRecord:
    """The record while new versions load: the old versions serve, the new ones show LOADING."""
    if old is None:
        status = {v: VersionStatus(v, ModelState.LOADING) for v in loading}
        return ModelRecord(name, status=status, state=ModelState.LOADING)
    status = dict(old.status)
    for v in loading:
        if v not in old.versions:
            status[v] = VersionStatus(v, ModelState.LOADING)
    return ModelRecord(
        name,
        versions=old.versions,
        status=dict(sorted(status.items())),
        state=old.state if old.versions else ModelState.LOADING,
        reason=old.reason,
        config=old.config,
    )


def failed(
    name: str, old: ModelRecord | None, reason: str, failures: dict[int, str]
) -> tuple[ModelRecord, bool]:
    """The record after a reload that brought nothing up, and whether old versions serve on."""
    statuses = {v: VersionStatus(v, ModelState.UNAVAILABLE, r) for v, r in failures.items()}
    if old is None or not old.versions:
        return ModelRecord(
            name, status=statuses, state=ModelState.UNAVAILABLE, reason=reason
        ), False
    status = {**old.status, **{v: s for v, s in statuses.items() if v not in old.versions}}
    log.warning(
        "model '%s': the reload failed, version(s) %s keep serving",
        name,
        ", ".join(str(v) for v in old.versions),
    )
    kept = ModelRecord(
        name,
        versions=old.versions,
        status=dict(sorted(status.items())),
        state=ModelState.READY,
        reason=f"the last reload failed: {reason}",
        config=old.config,
    )
    return kept, True


def draining(old: ModelRecord) -> ModelRecord:
    """An unloading model: no version takes requests, every loaded one shows UNLOADING."""
    return ModelRecord(
        old.name,
        status={v: VersionStatus(v, ModelState.UNLOADING) for v in old.versions},
        state=ModelState.UNLOADING if old.versions else ModelState.UNAVAILABLE,
        reason="unloading",
        config=old.config,
    )


def unloaded(old: ModelRecord) -> ModelRecord:
    status = {v: VersionStatus(v, ModelState.UNAVAILABLE, UNLOADED) for v in old.versions}
    return ModelRecord(old.name, status=status, state=ModelState.UNAVAILABLE, reason=UNLOADED)


async def retire(record: ModelRecord, retired: list[ModelVersion], on_disk: set[int]) -> None:
    """Close versions the new record no longer serves, once their in-flight requests finish;
    they then show UNAVAILABLE 'unloaded' (or vanish when their folder is gone)."""
    await asyncio.gather(*(m.close() for m in retired))
    for m in retired:
        status = record.status.get(m.version)
        if status is None or status.state is not ModelState.UNLOADING:
            continue
        if m.version in on_disk:
            record.status[m.version] = VersionStatus(m.version, ModelState.UNAVAILABLE, UNLOADED)
        else:
            del record.status[m.version]
    log.info(
        "model '%s': retired version(s) %s; serving %s",
        record.name,
        ", ".join(str(m.version) for m in retired),
        ", ".join(str(v) for v in record.versions),
    )
