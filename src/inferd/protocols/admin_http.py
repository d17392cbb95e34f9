"""Operator routes on the HTTP port: Prometheus ``/metrics`` and ``/v2/logs`` tails.

``/v2/logs?after=N`` answers only the lines kept after position N with ``next``, the position
to pass next time: how the dashboard follows a log without fetching it whole every time. With
several serving processes, the lines are every process's, in order (``LogLines``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry

from inferd.core.errors import InvalidInput
from inferd.observability.logging import TAIL_LINES, Logs, cursor
from inferd.observability.metrics import CONTENT_TYPE, render
from inferd.protocols.transport.http_routes import HttpRequest, HttpResponse, Router, json_response
from inferd.security.access import Access

# The last ``count`` lines of a log (``kind``) above position ``after`` and at most ``upto``
# (None: any), in order: several workers' lines (``workers.node``).
LogLines = Callable[[str, int, int | None, int], Awaitable[list[str]]]


class AdminHttp:
    def __init__(
        self,
        metrics: CollectorRegistry | None,
        logs: Logs,
        totals: Callable[[], Awaitable[bytes]] | None = None,
        log_lines: LogLines | None = None,
    ) -> None:
        self.metrics = metrics
        self.logs = logs
        self.totals = totals  # several workers: their metrics, added up
        self.log_lines = log_lines or self._own_lines  # several workers: all their lines

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
            return json_response(
                {"kind": kind, "lines": await self.log_lines(kind, 0, None, count)}
            )
        after = query["after"][0]
        if not (after.isascii() and after.isdigit()):
            raise InvalidInput(f"after must be a non-negative integer, got '{after[:100]}'")
        upto = cursor()  # taken before any process is read: no line at or below it is to come
        lines = await self.log_lines(kind, int(after), upto, count)
        return json_response({"kind": kind, "lines": lines, "next": upto})

    async def _own_lines(self, kind: str, after: int, upto: int | None, count: int) -> list[str]:
        return [line for _, line in self.logs.entries(kind, after, upto, count)]
