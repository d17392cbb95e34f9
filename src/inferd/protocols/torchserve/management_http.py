"""TorchServe's management API on its own port: register, scale, describe, list, set the
default version, unregister (``inferd.torchserve.management``), in TorchServe's words.

Query parameters are read as TorchServe reads them: a number that does not parse takes the
default, a boolean is true only when it says ``true``. A register call may also send its
parameters as a JSON body. Every route is of the admin scope (inferd's admin tokens).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from inferd.backends.torchserve.settings import TORCHSERVE_VERSION
from inferd.protocols.torchserve.http import _operation, pretty, status_response
from inferd.protocols.transport.http_routes import HttpRequest, HttpResponse, Router
from inferd.security.access import Access
from inferd.torchserve.errors import bad_request
from inferd.torchserve.management import Management, Registration

_MODEL = r"/models/(?P<model>[^/]+)"
_VERSION = _MODEL + r"/(?P<version>[^/]+)"
DEFAULT_BATCH_DELAY_MISSING = -100  # TorchServe's "not given" for max_batch_delay


def _query(request: HttpRequest) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(request.query, keep_blank_values=True).items()}


def _int(query: dict[str, str], key: str, default: int) -> int:
    try:
        return int(query[key])
    except (KeyError, ValueError):
        return default


def _bool(query: dict[str, str], key: str, default: bool) -> bool:
    value = query.get(key)
    return default if value is None else value.strip().lower() == "true"


def management_description() -> dict[str, Any]:
    """The management API's OpenAPI description (``OPTIONS /``)."""
    name, both = ["model_name"], ["model_name", "model_version"]
    ok = {"200": "OK", "404": "Model not found or Model version not found"}
    return {
        "openapi": "3.0.1",
        "info": {"title": "TorchServe Management APIs (inferd)", "version": TORCHSERVE_VERSION},
        "paths": {
            "/models": {
                "get": _operation("List registered models.", [], {"200": "OK"}),
                "post": _operation("Register a new model.", [], {"200": "OK", "400": "Bad"}),
            },
            "/models/{model_name}": {
                "get": _operation("Describe the default version.", name, ok),
                "put": _operation("Scale the default version's workers.", name, ok),
                "delete": _operation("Unregister the default version.", name, ok),
            },
            "/models/{model_name}/{model_version}": {
                "get": _operation("Describe a version ('all': every one).", both, ok),
                "put": _operation("Scale a version's workers.", both, ok),
                "delete": _operation("Unregister a version.", both, ok),
            },
            "/models/{model_name}/{model_version}/set-default": {
                "put": _operation("Make a version the default.", both, ok),
            },
        },
    }


class TorchServeManagementHttp:
    def __init__(self, management: Management, default_workers: int) -> None:
        self.management = management
        self.default_workers = default_workers
        self._description = pretty(management_description())

    def register(self, router: Router) -> None:
        admin = Access.ADMIN
        router.add("OPTIONS", "/", self.describe_api, access=Access.HEALTH)
        router.add("GET", "/api-description", self.describe_api, access=Access.HEALTH)
        router.add("GET", "/models", self.list_models, access=admin)
        router.add("POST", "/models", self.register_model, access=admin)
        for pattern in (_MODEL, _VERSION):
            router.add("GET", pattern, self.describe, access=admin)
            router.add("PUT", pattern, self.scale, access=admin)
            router.add("DELETE", pattern, self.unregister, access=admin)
            router.add("OPTIONS", pattern, self.describe_api, access=admin)
        router.add("PUT", _VERSION + "/set-default", self.set_default, access=admin)

    async def describe_api(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(self._description)

    async def list_models(self, request: HttpRequest) -> HttpResponse:
        query = _query(request)
        found = self.management.list_models(
            _int(query, "limit", 100), _int(query, "next_page_token", 0)
        )
        return HttpResponse(pretty(found))

    async def register_model(self, request: HttpRequest) -> HttpResponse:
        content_type = (request.headers.get("content-type") or "").split(";", 1)[0].strip()
        if content_type.lower() == "application/json":
            registration = self._from_json(request.body)
        else:
            registration = self._from_query(_query(request))
        status, message = await self.management.register(registration)
        return status_response(message, status)

    def _from_query(self, query: dict[str, str]) -> Registration:
        def given(key: str, missing: int) -> int | None:
            value = _int(query, key, missing)
            return None if value == missing else value

        return Registration(
            url=query.get("url"),
            model_name=query.get("model_name") or None,
            handler=query.get("handler") or None,
            batch_size=given("batch_size", -1),
            max_batch_delay=given("max_batch_delay", DEFAULT_BATCH_DELAY_MISSING),
            initial_workers=_int(query, "initial_workers", self.default_workers),
            response_timeout=given("response_timeout", -1),
            startup_timeout=given("startup_timeout", -1),
            synchronous=_bool(query, "synchronous", True),
        )

    def _from_json(self, body: bytes) -> Registration:
        try:
            doc = json.loads(body or b"{}")
        except ValueError as exc:
            raise bad_request(f"the request body is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise bad_request("the request body must be a JSON object")

        def number(key: str) -> int | None:
            value = doc.get(key)
            return value if isinstance(value, int) and value > 0 else None

        return Registration(
            url=doc.get("url") if isinstance(doc.get("url"), str) else None,
            model_name=doc.get("model_name") or None,
            handler=doc.get("handler") or None,
            batch_size=number("batch_size"),
            max_batch_delay=number("max_batch_delay"),
            initial_workers=number("initial_workers"),
            response_timeout=number("response_timeout"),
            startup_timeout=number("startup_timeout"),
            synchronous=doc.get("synchronous") is True,
        )

    async def describe(self, request: HttpRequest) -> HttpResponse:
        params = request.params
        customized = _bool(_query(request), "customized", False)
        found = await self.management.describe(
            params["model"], params.get("version") or "", customized
        )
        return HttpResponse(pretty(found))

    async def scale(self, request: HttpRequest) -> HttpResponse:
        query = _query(request)
        low = _int(query, "min_worker", 1)
        high = _int(query, "max_worker", low)
        version = request.params.get("version") or query.get("model_version") or ""
        status, message = await self.management.scale(
            request.params["model"], version, low, high, _bool(query, "synchronous", False)
        )
        return status_response(message, status)

    async def set_default(self, request: HttpRequest) -> HttpResponse:
        message = await self.management.set_default(
            request.params["model"], request.params["version"]
        )
        return status_response(message)

    async def unregister(self, request: HttpRequest) -> HttpResponse:
        message = await self.management.unregister(
            request.params["model"], request.params.get("version") or ""
        )
        return status_response(message)
