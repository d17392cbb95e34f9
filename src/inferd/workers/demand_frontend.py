"""Lazy serving at a frontend worker: the model host loads, under the server's one budget.

``RemoteDemand`` is the ``OnDemand`` (``inferd.plane.demand``) of a frontend's data plane. A
request for a model of the repository that is not loaded here asks the host to load it, once per
model however many of this worker's requests wait (the host joins every worker's asks into one
load: ``workers.demand_host``), then waits until this worker has applied the host's table that
holds the model, and is routed and forwarded like any request. A load that failed answers as on
the host: 503 with its reason. Which names the repository holds, and which loads failed, come
with the host's status; metadata from a config, the index's residency and the totals are asked
of the host. This worker counts the hits and misses of its own requests: the merged metrics and
the host's totals add them up.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from functools import partial
from typing import Any

from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.views import ResidencyTotals, ResidencyView
from inferd.plane.demand import Described, wait_load
from inferd.plane.registry import Registry
from inferd.scheduling.wire import decode_error
from inferd.workers.demand_host import Extra
from inferd.workers.forward import HostLink, host_gone
from inferd.workers.frontend import HOST
from inferd.workers.peers import FIGURES_TIMEOUT_S, Handler, PeerError, Peers

NOTHING: Extra = (frozenset(), {})


class RemoteDemand:
    """A frontend's on-demand loads, made by the model host (module doc)."""

    def __init__(self, peers: Peers, link: HostLink, registry: Registry) -> None:
        self.peers = peers
        self.link = link
        self.registry = registry
        self.hits = 0  # counted by the data plane
        self.misses = 0
        self._asks: dict[str, asyncio.Task[None]] = {}

    def handlers(self) -> dict[str, Handler]:
        return {"demand_counts": self._counts}

    def counts(self) -> tuple[int, int]:
        """This worker's hits and misses."""
        return self.hits, self.misses

    async def _counts(self, message: dict[str, Any]) -> list[int]:
        return list(self.counts())

    def _extra(self) -> Extra:
        extra: Extra | None = self.link.extra
        return extra if extra is not None else NOTHING

    # ------------------------------------------------------------------ OnDemand

    def serves(self, name: str) -> bool:
        return name in self._extra()[0]

    def available(self, name: str) -> bool:
        return name not in self._extra()[1]

    async def ensure(self, name: str, timeout_s: float | None) -> None:
        if self.registry.is_ready(name):
            return
        self.misses += self.available(name)  # as the host: a failed load's reason is no miss
        task = self._asks.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._ask(name))
            self._asks[name] = task
            task.add_done_callback(partial(self._done, name))
        await wait_load(task, name, timeout_s)

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._asks.get(name) is task:
            del self._asks[name]
        if not task.cancelled():
            task.exception()  # reported to every waiter; none may be left

    async def _ask(self, name: str) -> None:
        """Have the host load ``name``, then wait for its table to be applied here."""
        answer = await self._host({"op": "demand_ensure", "name": name}, None)
        await self.link.caught_up(int(answer["seq"]))
        if "error" in answer:
            raise decode_error(str(answer["kind"]), str(answer["error"]))

    async def describe(self, name: str) -> Described | None:
        doc = await self._host({"op": "demand_describe", "name": name}, FIGURES_TIMEOUT_S)
        if doc is None:
            return None
        config = ModelConfig()
        config.ParseFromString(base64.b64decode(doc["config"]))
        return Described(config, tuple(int(v) for v in doc["versions"]))

    async def survey(self) -> Mapping[str, ResidencyView]:
        docs = await self._host({"op": "demand_views"}, FIGURES_TIMEOUT_S)
        return {name: ResidencyView(**doc) for name, doc in docs.items()}

    async def summary(self) -> ResidencyTotals:
        return ResidencyTotals(**await self._host({"op": "demand_totals"}, FIGURES_TIMEOUT_S))

    async def _host(self, message: dict[str, Any], timeout_s: float | None) -> Any:
        """The host's answer (its error, as the same class; Unavailable if it is away)."""
        try:
            return await self.peers.ask(HOST, message, timeout_s)
        except PeerError as exc:
            raise exc.error() from None
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            raise host_gone(self.link.index) from None
