"""Lazy serving with several workers, on the model host: the host's budget is the server's.

The host's ``Residency`` (``inferd.repository.residency``) holds the one budget. A frontend
worker whose request names a model that is not loaded asks the host to load it
(``demand_ensure``, over the workers' sockets): the host loads it as for a request of its own
(one load however many processes wait, the least recently used idle models evicted to make
room), sends every frontend its table, and answers with the table's number (and the load's
error, if it failed), which the frontend waits to have applied before it routes the request.

Frontends also ask the host for a model's metadata from its config (``demand_describe``) and for
the residency of every model and the totals (``demand_views``, ``demand_totals``: the index and
the dashboard). Every status the host sends carries the names of the repository's models and the
loads that failed, so a frontend knows without asking which names it serves and which are not
available. The requests a frontend forwards are held in the residency while they run
(``ModelHost.uses``): they count as use, and keep their model loaded. Nothing is copied into
the frontends (``workers.copies``): every model lives within the budget, in the host.
"""

from __future__ import annotations

import base64
from dataclasses import asdict
from typing import Any

from inferd.core.errors import InferdError, NotFound
from inferd.plane.registry import unknown_model
from inferd.repository.residency import Residency
from inferd.scheduling.wire import encode_error
from inferd.workers.host import ModelHost
from inferd.workers.peers import FIGURES_TIMEOUT_S, Handler, Peers

# What a status carries for the frontends: the repository's model names, the failed loads.
Extra = tuple[frozenset[str], dict[str, str]]


class HostDemand:
    """The host's answers to the frontends' on-demand calls (module doc)."""

    def __init__(self, residency: Residency, host: ModelHost, peers: Peers) -> None:
        self.residency = residency
        self.host = host
        self.peers = peers
        self._names: frozenset[str] = frozenset()
        host.uses = residency
        host.extra = self.extra
        residency.elsewhere = self.elsewhere

    def handlers(self) -> dict[str, Handler]:
        return {
            "demand_ensure": self._ensure,
            "demand_describe": self._describe,
            "demand_views": self._views,
            "demand_totals": self._totals,
            "demand_counts": self._counts,
        }

    def extra(self) -> Extra:
        names = self.residency.manager.catalog.names
        if names != self._names:
            self._names = frozenset(names)
        return self._names, self.residency.failures()

    async def elsewhere(self) -> tuple[int, int]:
        """The hits and misses the frontends counted."""
        answers = await self.peers.ask_all({"op": "demand_counts"}, FIGURES_TIMEOUT_S)
        counts = [(int(a[0]), int(a[1])) for a in answers.values()]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    async def _ensure(self, message: dict[str, Any]) -> dict[str, Any]:
        """Load a model for a frontend's requests (whose misses it counted)."""
        name = str(message["name"])
        if not self.residency.serves(name):
            raise NotFound(unknown_model(name))
        try:
            await self.residency.ensure(name, None, miss=False)
        except InferdError as exc:
            # A failure reaches the frontends with the table's status; then the asker says it.
            return {"seq": self.host.publish(), "error": exc.message, "kind": encode_error(exc)[0]}
        return {"seq": self.host.publish()}

    async def _describe(self, message: dict[str, Any]) -> dict[str, Any] | None:
        described = await self.residency.describe(str(message["name"]))
        if described is None:
            return None
        config = base64.b64encode(described.config.SerializeToString()).decode()
        return {"config": config, "versions": list(described.versions)}

    async def _views(self, message: dict[str, Any]) -> dict[str, Any]:
        return {name: asdict(view) for name, view in self.residency.views().items()}

    async def _totals(self, message: dict[str, Any]) -> dict[str, Any]:
        return asdict(await self.residency.summary())

    async def _counts(self, message: dict[str, Any]) -> list[int]:
        return [self.residency.hits, self.residency.counters.misses]
