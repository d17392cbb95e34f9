"""The repository's status (when the stores were last listed, how each answered, the models
held) as plain data: the model host sends it to the frontend workers every second, so that
``/v2/repository/status`` and the repository metrics of every worker say what the host knows."""

from __future__ import annotations

from typing import Any

from inferd.repository.catalog import StoreState
from inferd.repository.guard import Held
from inferd.repository.manager import RepositoryStatus


def status_doc(status: RepositoryStatus) -> list[Any]:
    return [
        status.synced_unix_s,
        [[s.uri, s.ok, s.last_ok_unix_s, s.error] for s in status.stores],
        [[h.name, h.store, h.since_s, h.since_unix_s, h.unload_at_unix_s] for h in status.held],
        status.faults,
    ]


def status_from_doc(doc: list[Any]) -> RepositoryStatus:
    synced, stores, held, faults = doc
    return RepositoryStatus(
        synced,
        tuple(StoreState(uri, bool(ok), last, error) for uri, ok, last, error in stores),
        tuple(Held(*h) for h in held),
        int(faults),
    )
