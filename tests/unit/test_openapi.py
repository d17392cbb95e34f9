"""The OpenAPI description (``GET /v2/openapi.json``) against the routes a server builds: every
route described with its token scope, no operation the server does not serve, and every
operation's statuses listed with the Error body (no catch-all ``default``)."""

from __future__ import annotations

import asyncio
import re
import tempfile
from typing import Any

import orjson
import pytest
from openapi_spec_validator import validate

from inferd.app import flags
from inferd.app.server import NetworkServer
from inferd.cli import build_parser
from inferd.protocols.transport.http_routes import HttpRequest, HttpResponse, Router


def _served(*extra: str) -> tuple[Router, dict[str, Any]]:
    """The router of a server started with ``extra`` flags, and the description it serves."""
    with tempfile.TemporaryDirectory() as empty:
        args = build_parser().parse_args(["serve", "--model-repository", empty, *extra])
        router = NetworkServer(flags.from_sources(args, {})).http_app.router
    handler, _, _ = router.resolve("GET", "/v2/openapi.json")

    async def get() -> HttpResponse:
        return await handler(HttpRequest("GET", "/v2/openapi.json", {}, b"", {}))

    return router, orjson.loads(asyncio.run(get()).body)


def _sample(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x1", path)


@pytest.mark.parametrize(
    "extra",
    [(), ("--allow-metrics=false", "--allow-dashboard=false"), ("--dashboard-port", "9")],
)
def test_every_route_is_described_with_its_scope(extra: tuple[str, ...]) -> None:
    router, doc = _served(*extra)
    validate(doc)
    operations = [
        (method.upper(), _sample(path), op)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
    ]
    for method, sample, op in operations:  # each one served, with the scope it says
        _, route, _ = router.resolve(method, sample)
        assert route.access.value == op["x-inferd-access"], (method, sample)
    for method, pattern, _ in router.patterns():
        regex = re.compile(pattern)
        described = [s for m, s, _ in operations if m == method and regex.fullmatch(s)]
        assert described, f"{method} {pattern} is not in the description"


def test_every_operation_lists_its_statuses_with_the_error_body() -> None:
    _, doc = _served()
    error = {"$ref": "#/components/schemas/Error"}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            responses = op["responses"]
            assert "default" not in responses, (method, path)
            # what any route may answer: malformed, refused, slow, too large, a bug
            assert {"400", "403", "408", "413", "500"} <= set(responses), (method, path)
            if op["x-inferd-access"] != "public":
                assert "401" in responses, (method, path)
            if op["x-inferd-access"] in ("inference", "admin"):
                assert "503" in responses, (method, path)
            for status, answer in responses.items():
                if status in ("400", "503") and ("ready" in path or path == "/v2/health/ready"):
                    continue  # readiness answers "not ready" with those statuses
                if int(status) >= 400:
                    assert answer["content"]["application/json"]["schema"] == error, (
                        method,
                        path,
                        status,
                    )


def test_request_schemas_are_as_strict_as_the_server() -> None:
    _, doc = _served()
    schemas = doc["components"]["schemas"]
    assert schemas["InferRequest"]["properties"]["inputs"]["minItems"] == 1
    assert schemas["InferRequest"]["required"] == ["inputs"]
    assert set(schemas["InferInputTensor"]["required"]) == {"name", "shape", "datatype"}
    infer = doc["paths"]["/v2/models/{model}/infer"]["post"]
    assert infer["requestBody"]["required"] is True
    assert {"404", "503", "504"} <= set(infer["responses"])
    predict = doc["paths"]["/v1/models/{model}:predict"]["post"]
    assert predict["requestBody"]["required"] is True
    assert schemas["LabelsRequest"]["required"] == ["labels"]
    assert schemas["RoutingRequest"]["additionalProperties"] is False
