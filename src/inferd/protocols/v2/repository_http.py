"""The model repository API over HTTP: Triton's routes, uploads, and version routing.

``POST /v2/repository/index``, ``.../models/{m}/load`` and ``.../unload`` are Triton's
model repository extension (a load may carry ``parameters.config`` and base64
``file:<version>/<path>`` contents). The index answers from the last listing of the stores
and says when that was in the ``Inferd-Repository-Synced-At`` header; ``GET
/v2/repository/status`` details each store. ``PUT /v2/repository/models/{m}`` takes a .tar.gz
or .zip of a model folder. ``.../labels`` and ``.../routing`` set version labels, the traffic
split and shadow copies; ``GET /v2/models/{m}/routing`` reads them with the shadow counts.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

from inferd.core.errors import InferdError, InvalidInput, Unavailable
from inferd.core.views import IndexEntry, ResidencyView
from inferd.plane.dataplane import DataPlane
from inferd.plane.routing import routing_document
from inferd.protocols.transport.http_routes import HttpRequest, HttpResponse, Router, json_response
from inferd.protocols.v2.http import json_object, parse_json
from inferd.security.access import Access
from inferd.security.redact import redact

_REPO_MODEL = r"/v2/repository/models/(?P<model>[^/]+)"
FILE_PREFIX = "file:"
SYNCED_HEADER = "inferd-repository-synced-at"


def rfc3339(unix_s: float | None) -> str:
    """A UTC time as RFC 3339 (``never`` for None)."""
    if unix_s is None:
        return "never"
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix_s))
    return f"{whole}.{int(unix_s % 1 * 1000):03d}Z"


def _body(request: HttpRequest) -> dict[str, Any]:
    if not request.body.strip(b" \t\r\n"):  # JSON's whitespace only (not \v or \f)
        return {}
    doc = parse_json(request.body)
    if not isinstance(doc, dict):
        raise InvalidInput("the request body must be a JSON object")
    return doc


def load_parameters(params: dict[str, Any]) -> tuple[str | None, dict[str, bytes]]:
    """The ``config`` string and the decoded ``file:`` contents of a load call."""
    config = params.get("config")
    if config is not None and not isinstance(config, str):
        raise InvalidInput("parameters.config must be a string holding the model config JSON")
    files: dict[str, bytes] = {}
    for key, value in params.items():
        if not key.startswith(FILE_PREFIX):
            continue
        if not isinstance(value, str):
            raise InvalidInput(f"parameter '{key}' must be a base64 string")
        try:
            files[key[len(FILE_PREFIX) :]] = base64.b64decode(value, validate=True)
        except binascii.Error:
            raise InvalidInput(f"parameter '{key}' is not valid base64") from None
    return config, files


class RepositoryHttp:
    """Handlers for ``/v2/repository`` and ``/v2/models/{m}/routing``."""

    def __init__(
        self, plane: DataPlane, max_upload_bytes: int, max_concurrent_uploads: int = 2
    ) -> None:
        self.plane = plane
        self.max_upload_bytes = max_upload_bytes
        self.max_concurrent_uploads = max_concurrent_uploads
        self.uploads = 0  # in progress

    def register(self, router: Router) -> None:
        admin = Access.ADMIN
        router.add("POST", "/v2/repository/index", self.index)
        router.add("GET", "/v2/repository/status", self.status, access=admin)
        router.add("POST", _REPO_MODEL + "/load", self.load, access=admin)
        router.add("POST", _REPO_MODEL + "/unload", self.unload, access=admin)
        router.add(
            "PUT",
            _REPO_MODEL,
            self.upload,
            access=admin,
            max_body_bytes=self.max_upload_bytes,
            limit_flag="--max-upload-bytes",
            stream=True,
        )
        router.add("POST", _REPO_MODEL + "/labels", self.labels, access=admin)
        router.add("POST", _REPO_MODEL + "/routing", self.set_routing, access=admin)
        router.add("GET", r"/v2/models/(?P<model>[^/]+)/routing", self.routing)

    async def index(self, request: HttpRequest) -> HttpResponse:
        ready_only = _body(request).get("ready", False)
        if not isinstance(ready_only, bool):
            raise InvalidInput("'ready' must be a boolean")
        entries = await self.plane.index(ready_only)
        response = json_response(_entries(entries))
        if self.plane.repository is not None:
            synced = self.plane.repository_status().synced_unix_s
            response.headers.append((SYNCED_HEADER, rfc3339(synced)))
        return response

    async def status(self, request: HttpRequest) -> HttpResponse:
        status = self.plane.repository_status()
        now = time.time()
        return json_response(
            {
                "synced_at": rfc3339(status.synced_unix_s),
                "synced_age_s": None
                if status.synced_unix_s is None
                else round(now - status.synced_unix_s, 3),
                "stores": [
                    {
                        "uri": s.uri,
                        "ok": s.ok,
                        "last_ok_at": rfc3339(s.last_ok_unix_s),
                        "error": s.error,
                    }
                    for s in status.stores
                ],
                "held": [
                    {
                        "name": h.name,
                        "store": h.store,
                        "missing_since": rfc3339(h.since_unix_s),
                        "unload_at": rfc3339(h.unload_at_unix_s),
                    }
                    for h in status.held
                ],
                "store_faults": status.faults,
            }
        )

    async def load(self, request: HttpRequest) -> HttpResponse:
        params = json_object(_body(request).get("parameters"), "parameters")
        config, files = load_parameters(params)
        await self.plane.load_model(request.params["model"], config, files)
        return HttpResponse(b"")

    async def unload(self, request: HttpRequest) -> HttpResponse:
        params = json_object(_body(request).get("parameters"), "parameters")
        dependents = params.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidInput("parameters.unload_dependents must be a boolean")
        await self.plane.unload_model(request.params["model"], dependents)
        return HttpResponse(b"")

    async def upload(self, request: HttpRequest) -> HttpResponse:
        """The archive streams to a staging file as it arrives (never whole in memory)."""
        if self.uploads >= self.max_concurrent_uploads:
            raise Unavailable(
                f"{self.uploads} uploads are in progress (--max-concurrent-uploads "
                f"{self.max_concurrent_uploads}); retry later"
            )
        assert request.chunks is not None
        self.uploads += 1
        try:
            entries = await self.plane.upload_model(request.params["model"], request.chunks)
        except InferdError as exc:
            # A failing model names its files, in the staging folder: never a server path.
            exc.message = redact(exc.message)
            exc.args = (exc.message,)
            raise
        finally:
            self.uploads -= 1
        return json_response(_entries(entries))

    async def labels(self, request: HttpRequest) -> HttpResponse:
        doc = _body(request)
        if "labels" not in doc:
            raise InvalidInput('the body must be {"labels": {"LABEL": VERSION or null, ...}}')
        labels = json_object(doc["labels"], "labels")
        view = await self.plane.set_labels(request.params["model"], labels)
        return json_response(routing_document(view))

    async def set_routing(self, request: HttpRequest) -> HttpResponse:
        view = await self.plane.set_routing(request.params["model"], _body(request))
        return json_response(routing_document(view))

    async def routing(self, request: HttpRequest) -> HttpResponse:
        return json_response(
            routing_document(await self.plane.total_routing(request.params["model"]))
        )


def _entries(entries: list[IndexEntry]) -> list[dict[str, Any]]:
    """Index rows; a reason never shows a server path (``inferd.security.redact``)."""
    rows: list[dict[str, Any]] = []
    for e in entries:
        row: dict[str, Any] = {
            "name": e.name,
            "version": e.version,
            "state": e.state,
            "reason": redact(e.reason),
        }
        if e.residency is not None:
            row["residency"] = residency_json(e.residency)
        rows.append(row)
    return rows


def residency_json(view: ResidencyView) -> dict[str, Any]:
    """A model's residency with lazy serving, times as RFC 3339."""

    def at(unix_s: float | None) -> str | None:
        return None if unix_s is None else rfc3339(unix_s)

    return {
        "state": view.state,
        "memory_bytes": view.memory_bytes,
        "pinned": view.pinned,
        "loads": view.loads,
        "loaded_at": at(view.loaded_unix_s),
        "last_used_at": at(view.last_used_unix_s),
        "evicted_at": at(view.evicted_unix_s),
        "reason": redact(view.reason),
        "in_flight": view.in_flight,
    }
