"""The OpenAPI 3 description of inferd's HTTP API, served at ``GET /v2/openapi.json``.

KServe v2 (with Triton's binary data, repository and statistics extensions), TF Serving's
REST API and inferd's own routes (labels, routing, uploads, the repository's status, logs,
metrics, the dashboard's JSON and page). The test suite fuzzes a live server from it
(schemathesis), so every answer must fit what it says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson

from inferd.protocols.openapi_schemas import SCHEMAS, Schema, ref
from inferd.protocols.transport.http_routes import HttpRequest, HttpResponse, Router
from inferd.security.access import Access
from inferd.version import __version__

JSON = "application/json"

# Why each status is answered; every error carries the Error body.
_WHY: dict[int, str] = {
    400: "a malformed request: its JSON, a field, its Content-Length (the error names it)",
    401: "a token is needed (Authorization: Bearer), or the token is not valid",
    403: "refused: the token's scope, the Host or Origin, or the admin API is off",
    404: "no such model, version, label, file or shared memory region",
    408: "the request body arrived too slowly (--http-body-timeout-s)",
    413: "the request body is over the limit (--http-max-body-bytes, --max-upload-bytes)",
    415: "a browser form's Content-Type, which the admin API refuses",
    500: "an internal error; the message carries the request id of the server log's entry",
    501: "not offered by this server",
    503: "busy or not ready (a full queue, the in-flight limit, a model not ready): retry",
    504: "the request waited in the model's queue past its timeout",
}
# What the HTTP layer may answer on any route, before a handler runs: a malformed or slow
# request, a body over the limit, a Host or Origin refused, a bug.
_ANY_ROUTE = (400, 403, 408, 413, 500)
_HEADERS: dict[int, Schema] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer"}},
    503: {
        "Retry-After": {
            "schema": {"type": "integer"},
            "description": "seconds to wait (sent with the in-flight limit and a full queue)",
        }
    },
}
_BINARY: Schema = {"type": "string", "format": "binary"}
_HEADER_LENGTH: Schema = {
    "schema": {"type": "integer", "minimum": 0},
    "description": "binary tensors: the length of the JSON part, which the tensors' bytes "
    "follow in the body",
}
MODEL_ERRORS = (404,)  # a route naming a model, version or label
INFER_ERRORS = (404, 503, 504)


def _path_parameter(name: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "query", "schema": schema, "description": description}


def operation(
    summary: str,
    ok: Schema | None,
    *,
    access: Access = Access.INFERENCE,
    body: Schema | None = None,
    body_required: bool = False,
    body_type: str = JSON,
    ok_type: str = JSON,
    errors: tuple[int, ...] = (),
    special: dict[int, Schema] | None = None,
    parameters: list[Schema] | None = None,
) -> Schema:
    """One operation; ``errors``: the statuses its handler answers beyond what any route may
    (``_ANY_ROUTE``, 401 where a token may be needed, 503 where the in-flight limit applies,
    415 on the admin API's bodies); ``special``: a status whose body is not the Error."""
    responses: dict[str, Any] = {"200": {"description": "OK"}}
    if ok is not None:
        responses["200"]["content"] = {ok_type: {"schema": ok}}
    codes = set(_ANY_ROUTE) | set(errors)
    if access is not Access.PUBLIC:
        codes.add(401)
    if access in (Access.INFERENCE, Access.ADMIN):
        codes.add(503)  # the in-flight limit (Retry-After)
    if access is Access.ADMIN and body is not None:
        codes.add(415)
    for code in sorted(codes):
        schema = (special or {}).get(code, ref("Error"))
        responses[str(code)] = {"description": _WHY[code], "content": {JSON: {"schema": schema}}}
        if code in _HEADERS:
            responses[str(code)]["headers"] = _HEADERS[code]
    op: Schema = {"summary": summary, "x-inferd-access": access.value, "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": {body_type: {"schema": body}}}
    if parameters:
        op["parameters"] = parameters
    return op


def model_paths(
    prefix: str, suffix: str, method: str, op: Schema, labels: bool = True
) -> dict[str, Schema]:
    """The route by model, by model and version, and by model and version label (a version
    that is no number, or a label no version carries, is a 404 too)."""
    model = _path_parameter("model")
    variants = {
        f"{prefix}/{{model}}{suffix}": [model],
        f"{prefix}/{{model}}/versions/{{version}}{suffix}": [model, _path_parameter("version")],
    }
    if labels:
        variants[f"{prefix}/{{model}}/labels/{{label}}{suffix}"] = [
            model,
            _path_parameter("label"),
        ]
    extra = list(op.get("parameters", []))
    return {
        path: {method: {**op, "parameters": [*params, *extra]}} for path, params in variants.items()
    }


def merge(paths: dict[str, Schema], more: dict[str, Schema]) -> None:
    for path, ops in more.items():
        paths.setdefault(path, {}).update(ops)


def dashboard_paths(page: bool) -> dict[str, Schema]:
    """The dashboard's JSON routes, a model's files, and (when served on this port) its page."""
    model = [_path_parameter("model")]
    object_ = ref("Object")
    query = [
        _query("after", {"type": "number"}, "only the samples after this time (Unix seconds)"),
        _query("model", {"type": "string"}, "one model's traffic"),
    ]
    paths: dict[str, Schema] = {
        "/v2/dashboard/models": {"get": operation("the dashboard's models table", object_)},
        "/v2/dashboard/series": {
            "get": operation("recent traffic, sampled once a second", object_, parameters=query)
        },
        "/v2/dashboard/cluster": {"get": operation("Envoy's view of the nodes", object_)},
        "/v2/repository/models/{model}/files": {
            "get": operation(
                "a model folder's files, versions and config",
                object_,
                access=Access.ADMIN,
                errors=(404, 501),
                parameters=model,
            )
        },
        "/v2/repository/models/{model}/files/{path}": {
            "get": operation(
                "one file of a model folder",
                _BINARY,
                ok_type="application/octet-stream",
                access=Access.ADMIN,
                errors=(404, 501),
                parameters=[*model, _path_parameter("path")],
            )
        },
    }
    if page:
        to_page = {"302": {"description": "to /dashboard/"}}
        paths["/"] = {
            "get": operation(
                "a browser (Accept: text/html) to the dashboard; else KServe v1's liveness",
                ref("Live"),
                access=Access.PUBLIC,
            )
        }
        paths["/dashboard"] = {"get": operation("to the dashboard", None, access=Access.PUBLIC)}
        for path in ("/", "/dashboard"):
            paths[path]["get"]["responses"].update(to_page)
        del paths["/dashboard"]["get"]["responses"]["200"]
        asset = operation(
            "a file of the dashboard page",
            _BINARY,
            ok_type="*/*",
            access=Access.PUBLIC,
            errors=(404,),
            parameters=[_path_parameter("asset")],
        )
        asset["responses"]["304"] = {"description": "not modified (If-None-Match)"}
        paths["/dashboard/{asset}"] = {"get": asset}
    return paths


def v2_paths() -> dict[str, Schema]:
    """KServe v2's routes (Triton's extensions), the repository API and the operator's."""
    admin = Access.ADMIN
    model = [_path_parameter("model")]
    object_ = ref("Object")
    routing = ref("Routing")
    paths: dict[str, Schema] = {
        "/v2": {"get": operation("server metadata", object_)},
        "/v2/health/live": {
            "get": operation(
                "liveness",
                {"type": "object", "properties": {"live": {"type": "boolean"}}},
                access=Access.HEALTH,
            )
        },
        "/v2/health/ready": {
            "get": operation(
                "readiness (503: not ready)",
                ref("Ready"),
                access=Access.HEALTH,
                errors=(503,),
                special={503: ref("Ready")},
            )
        },
        "/v2/models/stats": {"get": operation("statistics of every model", object_)},
        "/v2/openapi.json": {"get": operation("this description", object_)},
        "/v2/repository/index": {
            "post": operation(
                "the repository's models and their states",
                ref("RepositoryIndex"),
                body=ref("IndexRequest"),
                errors=(501,),
            )
        },
        "/v2/repository/status": {
            "get": operation(
                "when each store was last listed, held models", object_, access=admin, errors=(501,)
            )
        },
        "/v2/repository/models/{model}/load": {
            "post": operation(
                "load a model (optionally with its config and files)",
                None,
                access=admin,
                body=ref("LoadRequest"),
                errors=(404, 501),
                parameters=model,
            )
        },
        "/v2/repository/models/{model}/unload": {
            "post": operation(
                "unload a model",
                None,
                access=admin,
                body=ref("UnloadRequest"),
                errors=(404, 501),
                parameters=model,
            )
        },
        "/v2/repository/models/{model}": {
            "put": operation(
                "upload a model folder (.tar.gz, .tar or .zip) and load it",
                ref("RepositoryIndex"),
                access=admin,
                body=_BINARY,
                body_required=True,
                body_type="application/octet-stream",
                errors=(404, 501),
                parameters=model,
            )
        },
        "/v2/repository/models/{model}/labels": {
            "post": operation(
                "set version labels",
                routing,
                access=admin,
                body=ref("LabelsRequest"),
                body_required=True,
                errors=(404,),
                parameters=model,
            )
        },
        "/v2/repository/models/{model}/routing": {
            "post": operation(
                "set labels, traffic split, shadow",
                routing,
                access=admin,
                body=ref("RoutingRequest"),
                errors=(404,),
                parameters=model,
            )
        },
        "/v2/models/{model}/routing": {
            "get": operation(
                "labels, traffic split, shadow", routing, errors=(404,), parameters=model
            )
        },
        "/v2/logs": {
            "get": operation(
                "the last lines of the engine or access log",
                object_,
                access=admin,
                parameters=[
                    _query("kind", {"type": "string", "enum": ["engine", "access"]}, "the log"),
                    _query("lines", {"type": "integer", "minimum": 0}, "at most this many"),
                    _query("after", {"type": "integer", "minimum": 0}, "lines after this one"),
                ],
            )
        },
    }
    infer = operation(
        "inference (JSON; binary tensors with Inference-Header-Content-Length)",
        ref("InferResponse"),
        body=ref("InferRequest"),
        body_required=True,
        errors=INFER_ERRORS,
    )
    # Binary tensors: the JSON part, then the tensors' bytes (Triton's binary data extension).
    header = {"name": "Inference-Header-Content-Length", "in": "header", **_HEADER_LENGTH}
    infer["parameters"] = [header]
    infer["requestBody"]["content"]["application/octet-stream"] = {"schema": _BINARY}
    infer["responses"]["200"]["content"]["application/octet-stream"] = {"schema": _BINARY}
    infer["responses"]["200"]["headers"] = {"Inference-Header-Content-Length": _HEADER_LENGTH}
    merge(
        paths,
        model_paths(
            "/v2/models",
            "",
            "get",
            operation("model metadata", ref("ModelMetadata"), errors=INFER_ERRORS),
        ),
    )
    ready = operation(
        "model readiness (400: not ready)",
        ref("Ready"),
        errors=MODEL_ERRORS,
        special={400: {"anyOf": [ref("Ready"), ref("Error")]}},
    )
    merge(paths, model_paths("/v2/models", "/ready", "get", ready))
    merge(
        paths,
        model_paths(
            "/v2/models", "/config", "get", operation("model config", object_, errors=INFER_ERRORS)
        ),
    )
    merge(
        paths,
        model_paths(
            "/v2/models",
            "/stats",
            "get",
            operation("model statistics", object_, errors=MODEL_ERRORS),
        ),
    )
    merge(paths, model_paths("/v2/models", "/infer", "post", infer))
    return paths


def shared_memory_paths() -> dict[str, Schema]:
    """Triton's system and CUDA shared memory extensions."""
    paths: dict[str, Schema] = {}
    region = [_path_parameter("name")]
    for kind, root in (("system", "/v2/systemsharedmemory"), ("CUDA", "/v2/cudasharedmemory")):
        status = operation(f"the registered {kind} shared memory regions", ref("RegionStatus"))
        one = operation(
            f"one {kind} shared memory region",
            ref("RegionStatus"),
            errors=(404,),
            parameters=region,
        )
        register = operation(
            f"register a {kind} shared memory region",
            ref("Object"),
            body=ref("RegisterRegion"),
            body_required=True,
            errors=(501,) if kind == "CUDA" else (),
            parameters=region,
        )
        gone = operation(f"unregister every {kind} shared memory region", ref("Object"))
        paths[f"{root}/status"] = {"get": status}
        paths[f"{root}/region/{{name}}/status"] = {"get": one}
        paths[f"{root}/region/{{name}}/register"] = {"post": register}
        paths[f"{root}/unregister"] = {"post": gone}
        paths[f"{root}/region/{{name}}/unregister"] = {
            "post": operation(f"unregister a {kind} region", ref("Object"), parameters=region)
        }
    return paths


def settings_paths() -> dict[str, Schema]:
    """Triton's trace and log settings extensions."""
    admin = Access.ADMIN
    paths: dict[str, Schema] = {}
    trace = ref("TraceSettings")
    for path, parameters, errors in (
        ("/v2/trace/setting", [], ()),
        ("/v2/models/{model}/trace/setting", [_path_parameter("model")], (404,)),
    ):
        paths[path] = {
            "get": operation(
                "trace settings", trace, access=admin, errors=errors, parameters=parameters
            ),
            "post": operation(
                "change trace settings; answers those in effect",
                trace,
                access=admin,
                body=trace,
                errors=errors,
                parameters=parameters,
            ),
        }
    logs = ref("LogSettings")
    paths["/v2/logging"] = {
        "get": operation("log settings", logs, access=admin),
        "post": operation(
            "change log settings; answers those in effect", logs, access=admin, body=logs
        ),
    }
    return paths


def generate_paths() -> dict[str, Schema]:
    """Triton's generate extension."""
    paths: dict[str, Schema] = {}
    generate = operation(
        "one inference as flat JSON: each input by name",
        ref("GenerateResponse"),
        body=ref("GenerateRequest"),
        body_required=True,
        errors=INFER_ERRORS,
    )
    stream = operation(
        "a decoupled model's responses as server-sent events (data: GenerateResponse)",
        {"type": "string"},
        ok_type="text/event-stream",
        body=ref("GenerateRequest"),
        body_required=True,
        errors=INFER_ERRORS,
    )
    merge(paths, model_paths("/v2/models", "/generate", "post", generate, labels=False))
    merge(paths, model_paths("/v2/models", "/generate_stream", "post", stream, labels=False))
    return paths


def metrics_paths() -> dict[str, Schema]:
    """``/metrics``."""
    metrics = operation(
        "Prometheus metrics", {"type": "string"}, access=Access.METRICS, ok_type="text/plain"
    )
    return {"/metrics": {"get": metrics}}


def describe(parts: Iterable[dict[str, Schema]]) -> Schema:
    """The whole OpenAPI document of the paths of ``parts`` (each API's; a later part's
    operation on a path replaces an earlier one's)."""
    paths: dict[str, Schema] = {}
    for part in parts:
        merge(paths, part)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "inferd",
            "version": __version__,
            "description": "KServe v2 / Triton and TensorFlow Serving REST, plus inferd's "
            "repository, routing and operator routes. x-inferd-access names the token scope. "
            "Every error answers the Error body with its status.",
        },
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"token": []}],
        "paths": paths,
    }


class OpenApi:
    """``GET /v2/openapi.json``: the document of ``parts`` (every API's paths, read once, at the
    first request)."""

    def __init__(self, parts: Callable[[], Iterable[dict[str, Schema]]]) -> None:
        self._parts = parts
        self._body: bytes | None = None

    def register(self, router: Router) -> None:
        router.add("GET", "/v2/openapi.json", self.document)

    async def document(self, request: HttpRequest) -> HttpResponse:
        if self._body is None:
            self._body = orjson.dumps(describe(self._parts()))
        return HttpResponse(self._body)
