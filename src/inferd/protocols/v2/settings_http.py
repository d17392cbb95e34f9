"""Triton's trace and log settings routes: ``/v2/trace/setting``,
``/v2/models/{m}/trace/setting`` and ``/v2/logging`` (GET reads, POST changes and answers the
settings now in effect)."""

from __future__ import annotations

from typing import Any

from inferd.core.errors import InvalidInput
from inferd.observability.log_settings import LogSettings
from inferd.observability.trace_settings import TraceSettings
from inferd.protocols.transport.http_routes import HttpRequest, HttpResponse, Router, json_response
from inferd.protocols.v2.http import parse_json
from inferd.security.access import Access


class SettingsHttp:
    def __init__(self, trace: TraceSettings, logs: LogSettings) -> None:
        self.trace = trace
        self.logs = logs

    def register(self, router: Router) -> None:
        # The admin scope, as their gRPC twins: a setting can name a file the server writes.
        admin = Access.ADMIN
        for path in ("/v2/trace/setting", "/v2/models/(?P<model>[^/]+)/trace/setting"):
            router.add("GET", path, self.get_trace, access=admin)
            router.add("POST", path, self.update_trace, access=admin)
        router.add("GET", "/v2/logging", self.get_logging, access=admin)
        router.add("POST", "/v2/logging", self.update_logging, access=admin)

    async def get_trace(self, request: HttpRequest) -> HttpResponse:
        return json_response(self.trace.get(request.params.get("model", "")))

    async def update_trace(self, request: HttpRequest) -> HttpResponse:
        changes = _object(request.body)
        model = request.params.get("model", "")
        return json_response(await self.trace.update_everywhere(changes, model))

    async def get_logging(self, request: HttpRequest) -> HttpResponse:
        return json_response(self.logs.get())

    async def update_logging(self, request: HttpRequest) -> HttpResponse:
        return json_response(await self.logs.update_everywhere(_object(request.body)))


def _object(body: bytes) -> dict[str, Any]:
    doc = parse_json(body) if body else {}
    if not isinstance(doc, dict):
        raise InvalidInput("the settings must be a JSON object")
    return doc
