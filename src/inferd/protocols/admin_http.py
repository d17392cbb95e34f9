"""Operator routes on the HTTP port: Prometheus ``/metrics`` and ``/v2/logs`` tails.

``/v2/logs?after=N`` answers only the lines after sequence number N with ``next``, the number
to pass next time: how the dashboard follows a log without fetching it whole every time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry

from inferd.core.errors import InvalidInput
from inferd.observability.logging import TAIL_LINES, Logs
from inferd.observability.metrics import CONTENT_TYPE, render
from inferd.protocols.http_routes import HttpRequest, HttpResponse, Router, json_response
from inferd.security.access import Access


class AdminHttp:
    def __init__(
        self,
        metrics: CollectorRegistry | None,
        logs: Logs,
        totals: Callable[[], Awaitable[bytes]] | None = None,
    ) -> None:
        self.metrics = metrics
        self.logs = logs
        self.totals = totals  # several workers: their metrics, added up

    def register(self, router: Router) -> None:
        if self.metrics is not None:
            router.add("GET", "/metrics", self.prometheus, access=Access.METRICS)
        router.add("GET", "/v2/logs", self.tail, access=Access.ADMIN)

    async def prometheus(self, request: HttpRequest) -> HttpResponse:
        assert self.metrics is not None
        text = render(self.metrics) if self.totals is None else await self.totals()
        return HttpResponse(text, content_type=CONTENT_TYPE)

    async def tail(self, request: HttpRequest) -> HttpResponse:
        # A parameter given blank is refused, as the description's types say (not defaulted).
        query = parse_qs(request.query, keep_blank_values=True)
        kind = query.get("kind", ["engine"])[0]
        if kind not in ("engine", "access"):
            raise InvalidInput(f"kind must be engine or access, got '{kind[:100]}'")
        text = query.get("lines", ["100"])[0]
        if not (text.isascii() and text.isdigit()):
            raise InvalidInput(f"lines must be a non-negative integer, got '{text[:100]}'")
        count = min(int(text), TAIL_LINES)
        if "after" not in query:
            return json_response({"kind": kind, "lines": self.logs.tail(kind, count)})
        after = query["after"][0]
        if not (after.isascii() and after.isdigit()):
            raise InvalidInput(f"after must be a non-negative integer, got '{after[:100]}'")
        lines, newest = self.logs.since(kind, int(after), count)
        return json_response({"kind": kind, "lines": lines, "next": newest})
