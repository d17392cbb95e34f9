"""TorchServe's inference API on its own port: ``/ping``, ``/predictions``, ``/explanations``
and the API description (``OPTIONS /``), answered as TorchServe answers them.

A prediction takes any method but OPTIONS (``curl -T`` sends PUT), a raw body, a multipart form
or a form (``inferd.torchserve.forms``); the handler sees the request's headers plus
``explain`` and ``url_path`` (what follows the version in the path). The answer is the
handler's bytes with the status, content type and headers it set (no content type unless it
set one). Errors are TorchServe's ``{"code", "type", "message"}``, pretty-printed as its
server prints them, on every route of the port, the access checks' included
(``render_error``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from inferd.backends.torchserve.settings import TORCHSERVE_VERSION
from inferd.core.errors import InferdError
from inferd.protocols.transport.http import cancel_on_disconnect
from inferd.protocols.transport.http_routes import HttpRequest, HttpResponse, Router
from inferd.protocols.v2.http import OFFLOAD_BYTES
from inferd.security.access import Access
from inferd.torchserve import forms
from inferd.torchserve.errors import METHOD_MESSAGE, Answer, answer
from inferd.torchserve.models import Prediction, TorchServeModels, new_request_id

JSON = "application/json"
_VERSIONED = r"/(?P<model>[^/]+)(?:/(?P<version>[^/]+)(?:/(?P<path>.*))?)?"
PREDICT_METHODS = ("POST", "PUT", "GET", "DELETE", "PATCH")


async def _chunks(first: bytes, rest: AsyncIterator[Prediction]) -> AsyncIterator[bytes]:
    yield first
    async for prediction in rest:
        yield prediction.body


def pretty(value: Any) -> bytes:
    """JSON as TorchServe's server writes it: two-space indents, a final new line."""
    return json.dumps(value, indent=2, ensure_ascii=False).encode() + b"\n"


def render_error(error: InferdError, request_id: str, status: int) -> HttpResponse:
    """Any error as TorchServe's ``{"code", "type", "message"}``."""
    found = (
        Answer(405, "MethodNotAllowedException", METHOD_MESSAGE) if status == 405 else answer(error)
    )
    return HttpResponse(pretty(found.as_json()), found.status)


def status_response(message: str, status: int = 200) -> HttpResponse:
    return HttpResponse(pretty({"status": message}), status)


def _operation(summary: str, parameters: list[str], statuses: dict[str, str]) -> dict[str, Any]:
    return {
        "description": summary,
        "parameters": [
            {"in": "path", "name": p, "required": True, "schema": {"type": "string"}}
            for p in parameters
        ],
        "responses": {code: {"description": text} for code, text in statuses.items()},
    }


def inference_description() -> dict[str, Any]:
    """The inference API's OpenAPI description (``OPTIONS /``)."""
    predict = {"200": "The handler's answer", "404": "Unknown model or version"}
    predict["503"] = "No worker, or the handler failed"
    paths: dict[str, Any] = {
        "/": {"options": _operation("This API description.", [], {"200": "OK"})},
        "/ping": {"get": _operation("Health of the models.", [], {"200": "Healthy"})},
        "/api-description": {"get": _operation("This API description.", [], {"200": "OK"})},
    }
    for verb, text in (("predictions", "A prediction"), ("explanations", "An explanation")):
        paths[f"/{verb}/{{model_name}}"] = {
            "post": _operation(f"{text} of the default version.", ["model_name"], predict)
        }
        paths[f"/{verb}/{{model_name}}/{{model_version}}"] = {
            "post": _operation(f"{text} of one version.", ["model_name", "model_version"], predict)
        }
    return {
        "openapi": "3.0.1",
        "info": {"title": "TorchServe APIs (inferd)", "version": TORCHSERVE_VERSION},
        "paths": paths,
    }


class TorchServeInferenceHttp:
    def __init__(self, models: TorchServeModels) -> None:
        self.models = models
        self._description = pretty(inference_description())

    def register(self, router: Router) -> None:
        router.add("GET", "/ping", self.ping, access=Access.HEALTH)
        router.add("OPTIONS", "/", self.describe, access=Access.HEALTH)
        router.add("GET", "/api-description", self.describe, access=Access.HEALTH)
        for method in PREDICT_METHODS:
            router.add(method, "/predictions" + _VERSIONED, self.predictions)
            router.add(method, "/explanations" + _VERSIONED, self.explanations)
        router.add("OPTIONS", "/predictions" + _VERSIONED, self.describe_model)

    async def ping(self, request: HttpRequest) -> HttpResponse:
        if self.models.healthy():
            return status_response("Healthy")
        return status_response("Unhealthy", 500)

    async def describe(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(self._description)

    async def describe_model(self, request: HttpRequest) -> HttpResponse:
        name = request.params["model"]
        model = self.models.version(name, request.params.get("version", ""))
        doc = inference_description()
        doc["info"]["title"] = f"RESTful API for: {name}"
        doc["info"]["version"] = str(
            model.config.parameters["torchserve_model_version"].string_value
        )
        doc["paths"] = {k: v for k, v in doc["paths"].items() if k.startswith("/predictions")}
        return HttpResponse(pretty(doc))

    async def predictions(self, request: HttpRequest) -> HttpResponse:
        return await self._predict(request, "False")

    async def explanations(self, request: HttpRequest) -> HttpResponse:
        return await self._predict(request, "True")

    async def _predict(self, request: HttpRequest, explain: str) -> HttpResponse:
        params = request.params
        name = params["model"]
        version = params.get("version") or ""
        headers = request.headers
        content_type = headers.get("content-type") or ""
        body, request.body = request.body, b""  # from here on, the parameters hold it
        if len(body) > OFFLOAD_BYTES and forms.mime_type(content_type).lower() in forms.PARSED:
            # a large form is cut into its parameters off the event loop
            values, names, types = await asyncio.to_thread(forms.parameters, body, content_type)
        else:
            values, names, types = forms.parameters(body, content_type)
        del body
        meta: dict[str, Any] = {"explain": explain}
        meta.update(headers.items())
        meta["url_path"] = params.get("path") or ""
        request_id = new_request_id()
        found = await cancel_on_disconnect(
            request,
            self.models.answers(name, version, values, names, types, meta, request_id),
        )
        stream: AsyncIterator[bytes] | None = None
        if isinstance(found, Prediction):
            prediction = found
        else:  # a streaming handler: its first answer sets the status, each is a chunk
            prediction = await anext(found)
            stream = _chunks(prediction.body, found)
        answer_type = ""
        extra: list[tuple[str, str]] = []
        for key, value in prediction.headers.items():
            if key.lower() == "content-type":
                answer_type = value
            else:
                extra.append((key, value))
        response = HttpResponse(prediction.body, prediction.status, answer_type, extra)
        response.stream = stream
        response.request_id = request_id
        response.model = name
        response.version = version
        return response
