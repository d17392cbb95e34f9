"""One worker's side of a multi-worker server: answers its peers, and adds their figures to
its own, so ``/metrics``, the statistics API, the routing documents' shadow counts and the
dashboard report the whole server, and
``/v2/logs`` every worker's lines, in order."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from inferd.core.errors import InferdError
from inferd.core.stats import ModelStatistics
from inferd.dashboard.series import TrafficSeries
from inferd.observability.logging import Entry, Logs, merge_entries
from inferd.observability.metrics import render
from inferd.plane.dataplane import DataPlane
from inferd.plane.routing import ShadowCounts
from inferd.workers.control import CHANGES, SharedControl
from inferd.workers.merge import (
    merge_metrics,
    merge_shadow_counts,
    merge_statistics,
    merge_traffic,
    shadow_document,
    statistics_document,
    statistics_from_document,
)
from inferd.workers.peers import FIGURES_TIMEOUT_S, Handler, Peers
from inferd.workers.supervisor_log import read_entries

log = logging.getLogger("inferd.workers")


class WorkerNode:
    def __init__(
        self,
        peers: Peers,
        control: SharedControl,
        plane: DataPlane,
        metrics: CollectorRegistry,
        logs: Logs,
    ) -> None:
        self.peers = peers
        self.control = control
        self.plane = plane
        self.metrics = metrics
        self.logs = logs
        self.series: TrafficSeries | None = None  # the dashboard's, when it is on
        # Messages answered by other parts of the worker, by op (lazy serving's).
        self.handlers: dict[str, Handler] = {}

    async def start(self) -> None:
        await self.peers.serve(self.handle)

    async def close(self) -> None:
        await self.peers.close()

    async def handle(self, message: dict[str, Any]) -> Any:
        op = message.get("op")
        handler = self.handlers.get(op) if isinstance(op, str) else None
        if handler is not None:
            return await handler(message)
        if op == "metrics":
            return render(self.metrics).decode()
        if op == "statistics":
            try:
                own = self.plane.statistics(message["name"], message["version"])
            except InferdError:  # not loaded here (yet): nothing to add
                return []
            return statistics_document(own)
        if op == "shadow_stats":
            return shadow_document(self.plane.registry.shadow_counts(message["names"]))
        if op == "logs":
            return self.logs.entries(
                message["kind"], message["after"], message["upto"], message["count"]
            )
        if op == "traffic":
            if self.series is None:
                raise ValueError("the dashboard is off")
            return self.series.as_json(float(message["after"]), message["model"])
        if op in CHANGES:
            await self.control.apply(message)
            return None
        if isinstance(op, str) and op.startswith("host_") and self.peers.role.index == 0:
            return await self.control.on_behalf(message)
        raise ValueError(f"unknown message '{op}'")

    async def metrics_text(self) -> bytes:
        """This worker's exposition plus every peer's, as totals."""
        answers = await self.peers.ask_all({"op": "metrics"}, FIGURES_TIMEOUT_S)
        own = render(self.metrics)
        return merge_metrics([own, *(str(text).encode() for text in answers.values())])

    async def statistics(self, name: str, version: str) -> tuple[ModelStatistics, ...]:
        """The statistics API's figures, totalled over the workers (NotFound when this worker
        does not know the model either)."""
        own: Sequence[ModelStatistics] = self.plane.statistics(name, version)
        message = {"op": "statistics", "name": name, "version": version}
        answers = await self.peers.ask_all(message, FIGURES_TIMEOUT_S)
        return merge_statistics(own, (statistics_from_document(a) for a in answers.values()))

    async def shadow_stats(self, names: list[str]) -> dict[str, ShadowCounts]:
        """The shadow counts of the named models, totalled over the workers: each worker
        counts the copies it made of the requests it ran."""
        own = self.plane.registry.shadow_counts(names)
        message = {"op": "shadow_stats", "names": names}
        answers = await self.peers.ask_all(message, FIGURES_TIMEOUT_S)
        return merge_shadow_counts(own, answers.values())

    async def log_lines(self, kind: str, after: int, upto: int | None, count: int) -> list[str]:
        """The last ``count`` lines of every worker's log ``kind`` in (``after``, ``upto``], and
        of the supervisor's engine log, in the order they were kept (a worker that does not
        answer in time is left out)."""
        own = self.logs.entries(kind, after, upto, count)
        message = {"op": "logs", "kind": kind, "after": after, "upto": upto, "count": count}
        supervisor: list[Entry] = []
        if kind == "engine":  # the supervisor's lines too (workers started, exited)
            run_dir = self.peers.role.run_dir
            supervisor, answers = await asyncio.gather(
                asyncio.to_thread(read_entries, run_dir, after, upto, count),
                self.peers.ask_all(message, FIGURES_TIMEOUT_S),
            )
        else:
            answers = await self.peers.ask_all(message, FIGURES_TIMEOUT_S)
        theirs: list[list[Entry]] = [
            [(int(position), str(line)) for position, line in answers[index]]
            for index in sorted(answers)
        ]
        return merge_entries([supervisor, own, *theirs], count)

    async def traffic(self, after: float, model: str) -> dict[str, Any]:
        """The dashboard's traffic rows for the whole server."""
        assert self.series is not None
        own = self.series.as_json(after, model)
        message = {"op": "traffic", "after": after, "model": model}
        answers = await self.peers.ask_all(message, FIGURES_TIMEOUT_S)
        return merge_traffic([own, *answers.values()], time.time())


class _MergedCollector:
    """The totals for a scrape of ``--metrics-port``, served from prometheus_client's thread:
    the figures are gathered on the server's loop."""

    def __init__(self, node: WorkerNode, loop: asyncio.AbstractEventLoop) -> None:
        self.node = node
        self.loop = loop

    def collect(self) -> list[Metric]:
        future = asyncio.run_coroutine_threadsafe(self.node.metrics_text(), self.loop)
        text = future.result(2 * FIGURES_TIMEOUT_S)
        return list(text_string_to_metric_families(text.decode()))


def merged_registry(node: WorkerNode, loop: asyncio.AbstractEventLoop) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_MergedCollector(node, loop))
    return registry
