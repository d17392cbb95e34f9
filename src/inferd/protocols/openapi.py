"""The OpenAPI 3 description of inferd's HTTP API, served at ``GET /v2/openapi.json``.

KServe v2 (with Triton's binary data, repository and statistics extensions), TF Serving's
REST API and inferd's own routes (labels, routing, uploads, the repository's status, logs,
metrics, the dashboard's JSON and page). The test suite fuzzes a live server from it
(schemathesis), so every answer must fit what it says.
"""

from __future__ import annotations

from typing import Any

import orjson

from inferd.protocols.http_routes import HttpRequest, HttpResponse, Router
from inferd.security.access import Access
from inferd.version import __version__

JSON = "application/json"
Schema = dict[str, Any]

_ERROR: Schema = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}
_PARAMETERS: Schema = {"type": "object", "additionalProperties": True}
_SHAPE: Schema = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_DATATYPE: Schema = {
    "type": "string",
    "enum": [
        "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
        "FP16", "FP32", "FP64", "BF16", "BYTES",
    ],
}  # fmt: skip
_TENSOR_IN: Schema = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": _SHAPE,
        "datatype": _DATATYPE,
        "parameters": _PARAMETERS,
        "data": {},
    },
}
_TENSOR_OUT: Schema = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": _SHAPE,
        "datatype": {"type": "string"},
        "parameters": _PARAMETERS,
        "data": {"type": "array"},
    },
}
_LIVE: Schema = {
    "type": "object",
    "required": ["status"],
    "properties": {"status": {"type": "string", "enum": ["alive"]}},
}
_INFER_REQUEST: Schema = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "inputs": {"type": "array", "items": _TENSOR_IN},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "parameters": _PARAMETERS},
            },
        },
    },
}
_INFER_RESPONSE: Schema = {
    "type": "object",
    "required": ["model_name", "outputs"],
    "properties": {
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "outputs": {"type": "array", "items": _TENSOR_OUT},
    },
}
_META_TENSOR: Schema = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": {"type": "string"},
        "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
    },
}
_MODEL_METADATA: Schema = {
    "type": "object",
    "required": ["name", "versions", "platform", "inputs", "outputs"],
    "properties": {
        "name": {"type": "string"},
        "versions": {"type": "array", "items": {"type": "string"}},
        "platform": {"type": "string"},
        "inputs": {"type": "array", "items": _META_TENSOR},
        "outputs": {"type": "array", "items": _META_TENSOR},
    },
}
_TIME_OR_NULL: Schema = {"type": ["string", "null"]}
_RESIDENCY: Schema = {  # lazy serving (--model-memory-budget): where each model stands
    "type": "object",
    "properties": {
        "state": {"enum": ["available", "loading", "loaded", "evicted", "failed"]},
        "memory_bytes": {"type": "integer", "minimum": 0},
        "pinned": {"type": "boolean"},
        "loads": {"type": "integer", "minimum": 0},
        "loaded_at": _TIME_OR_NULL,
        "last_used_at": _TIME_OR_NULL,
        "evicted_at": _TIME_OR_NULL,
        "reason": {"type": "string"},
        "in_flight": {"type": "integer", "minimum": 0},
    },
}
_INDEX: Schema = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name", "version", "state", "reason"],
        "properties": {
            **{k: {"type": "string"} for k in ("name", "version", "state", "reason")},
            "residency": _RESIDENCY,
        },
    },
}
_OBJECT: Schema = {"type": "object"}
_ROUTING_BODY: Schema = {
    "type": "object",
    "properties": {
        "labels": {"type": ["object", "null"]},
        "traffic_split": {"type": ["object", "null"]},
        "shadow": {"type": ["object", "null"]},
    },
}


def _path_parameter(name: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _op(
    summary: str,
    ok: Schema | None,
    *,
    access: Access = Access.INFERENCE,
    body: Schema | None = None,
    body_type: str = JSON,
    ok_type: str = JSON,
    extra: dict[str, Schema] | None = None,
    parameters: list[Schema] | None = None,
) -> Schema:
    responses: dict[str, Any] = {
        "200": {"description": "OK"},
        "default": {
            "description": "an error, with a one-line reason",
            "content": {JSON: {"schema": _ERROR}},
        },
    }
    if ok is not None:
        responses["200"]["content"] = {ok_type: {"schema": ok}}
    for status, schema in (extra or {}).items():
        responses[status] = {"description": status, "content": {JSON: {"schema": schema}}}
    op: Schema = {"summary": summary, "x-inferd-access": access.value, "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": False, "content": {body_type: {"schema": body}}}
    if parameters:
        op["parameters"] = parameters
    return op


def _model_paths(prefix: str, suffix: str, method: str, op: Schema) -> dict[str, Schema]:
    """The route by model, by model and version, and by model and version label."""
    model = _path_parameter("model")
    variants = {
        f"{prefix}/{{model}}{suffix}": [model],
        f"{prefix}/{{model}}/versions/{{version}}{suffix}": [model, _path_parameter("version")],
        f"{prefix}/{{model}}/labels/{{label}}{suffix}": [model, _path_parameter("label")],
    }
    return {path: {method: {**op, "parameters": params}} for path, params in variants.items()}


def _merge(paths: dict[str, Schema], more: dict[str, Schema]) -> None:
    for path, ops in more.items():
        paths.setdefault(path, {}).update(ops)


def _dashboard_paths(page: bool) -> dict[str, Schema]:
    """The dashboard's JSON routes, a model's files, and (when served on this port) its page."""
    model = [_path_parameter("model")]
    query = [
        {"name": "after", "in": "query", "schema": {"type": "string"}},
        {"name": "model", "in": "query", "schema": {"type": "string"}},
    ]
    paths: dict[str, Schema] = {
        "/v2/dashboard/models": {"get": _op("the dashboard's models table", _OBJECT)},
        "/v2/dashboard/series": {
            "get": _op("recent traffic, sampled once a second", _OBJECT, parameters=query)
        },
        "/v2/dashboard/cluster": {"get": _op("Envoy's view of the nodes", _OBJECT)},
        "/v2/repository/models/{model}/files": {
            "get": _op(
                "a model folder's files, versions and config",
                _OBJECT,
                access=Access.ADMIN,
                parameters=model,
            )
        },
        "/v2/repository/models/{model}/files/{path}": {
            "get": _op(
                "one file of a model folder",
                None,
                access=Access.ADMIN,
                parameters=[*model, _path_parameter("path")],
            )
        },
    }
    if page:
        to_page = {"302": {"description": "to /dashboard/"}}
        paths["/"] = {
            "get": _op(
                "a browser (Accept: text/html) to the dashboard; else KServe v1's liveness",
                _LIVE,
                access=Access.PUBLIC,
            )
        }
        paths["/dashboard"] = {"get": _op("to the dashboard", None, access=Access.PUBLIC)}
        for path in ("/", "/dashboard"):
            paths[path]["get"]["responses"].update(to_page)
        asset = _op(
            "a file of the dashboard page",
            None,
            access=Access.PUBLIC,
            parameters=[_path_parameter("asset")],
        )
        asset["responses"]["304"] = {"description": "not modified (If-None-Match)"}
        paths["/dashboard/{asset}"] = {"get": asset}
    return paths


def describe(dashboard: bool = True, page: bool = True) -> Schema:
    """The whole OpenAPI document; ``dashboard``: with the dashboard's routes, ``page``: its
    page on this port too."""
    admin = Access.ADMIN
    model = [_path_parameter("model")]
    ready_schema: Schema = {
        "type": "object",
        "required": ["ready"],
        "properties": {"ready": {"type": "boolean"}, "name": {"type": "string"}},
    }
    # 400: not ready, or a version string that is no number (Triton's words, an error)
    not_ready: Schema = {"anyOf": [ready_schema, _ERROR]}
    paths: dict[str, Schema] = {
        "/v2": {"get": _op("server metadata", _OBJECT)},
        "/v2/health/live": {
            "get": _op(
                "liveness",
                {"type": "object", "properties": {"live": {"type": "boolean"}}},
                access=Access.HEALTH,
            )
        },
        "/v2/health/ready": {
            "get": _op("readiness", _OBJECT, access=Access.HEALTH, extra={"503": ready_schema})
        },
        "/v2/models/stats": {"get": _op("statistics of every model", _OBJECT)},
        "/v2/openapi.json": {"get": _op("this description", _OBJECT)},
        "/v2/repository/index": {
            "post": _op("the repository's models and their states", _INDEX, body=_OBJECT)
        },
        "/v2/repository/status": {
            "get": _op("when each store was last listed, held models", _OBJECT, access=admin)
        },
        "/v2/repository/models/{model}/load": {
            "post": _op("load a model", None, access=admin, body=_OBJECT, parameters=model)
        },
        "/v2/repository/models/{model}/unload": {
            "post": _op("unload a model", None, access=admin, body=_OBJECT, parameters=model)
        },
        "/v2/repository/models/{model}": {
            "put": _op(
                "upload a model folder (.tar.gz or .zip) and load it",
                _INDEX,
                access=admin,
                body={"type": "string", "format": "binary"},
                body_type="application/octet-stream",
                parameters=model,
            )
        },
        "/v2/repository/models/{model}/labels": {
            "post": _op("set version labels", _OBJECT, access=admin, body=_OBJECT, parameters=model)
        },
        "/v2/repository/models/{model}/routing": {
            "post": _op(
                "set labels, traffic split, shadow",
                _OBJECT,
                access=admin,
                body=_ROUTING_BODY,
                parameters=model,
            )
        },
        "/v2/models/{model}/routing": {
            "get": _op("labels, traffic split, shadow", _OBJECT, parameters=model)
        },
        "/v2/logs": {
            "get": _op(
                "the last lines of the engine or access log",
                _OBJECT,
                access=admin,
                parameters=[
                    {"name": "kind", "in": "query", "schema": {"type": "string"}},
                    {"name": "lines", "in": "query", "schema": {"type": "string"}},
                ],
            )
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics",
                {"type": "string"},
                access=Access.METRICS,
                ok_type="text/plain",
            )
        },
    }
    infer = _op(
        "inference (JSON; binary tensors with Inference-Header-Content-Length)",
        _INFER_RESPONSE,
        body=_INFER_REQUEST,
    )
    paths["/"] = {"get": _op("KServe v1 server liveness", _LIVE, access=Access.HEALTH)}
    if dashboard:
        _merge(paths, _dashboard_paths(page))
    _merge(paths, _model_paths("/v2/models", "", "get", _op("model metadata", _MODEL_METADATA)))
    _merge(
        paths,
        _model_paths(
            "/v2/models", "/ready", "get", _op("model readiness", ready_schema,
                                               extra={"400": not_ready})
        ),
    )  # fmt: skip
    _merge(paths, _model_paths("/v2/models", "/config", "get", _op("model config", _OBJECT)))
    _merge(paths, _model_paths("/v2/models", "/stats", "get", _op("model statistics", _OBJECT)))
    _merge(paths, _model_paths("/v2/models", "/infer", "post", infer))
    tf_body: Schema = {
        "type": "object",
        "properties": {
            "signature_name": {"type": "string"},
            "instances": {},
            "inputs": {},
            "examples": {"type": "array"},
        },
    }
    tf_status: Schema = {
        "type": "object",
        "required": ["name", "ready", "model_version_status"],
        "properties": {
            "name": {"type": "string"},
            "ready": {"type": "boolean"},
            "model_version_status": {"type": "array"},
        },
    }
    status_op = _op("TF Serving model status, with KServe v1's name and ready", tf_status)
    _merge(paths, _model_paths("/v1/models", "", "get", status_op))
    _merge(
        paths,
        _model_paths("/v1/models", "/metadata", "get", _op("TF Serving metadata", _OBJECT)),
    )
    for verb in ("predict", "classify", "regress"):
        _merge(
            paths,
            _model_paths(
                "/v1/models", f":{verb}", "post", _op(f"TF Serving {verb}", _OBJECT, body=tf_body)
            ),
        )
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "inferd",
            "version": __version__,
            "description": "KServe v2 / Triton and TensorFlow Serving REST, plus inferd's "
            "repository, routing and operator routes. x-inferd-access names the token scope.",
        },
        "components": {
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"token": []}],
        "paths": paths,
    }


class OpenApi:
    def __init__(self, dashboard: bool = True, page: bool = True) -> None:
        self._body = orjson.dumps(describe(dashboard, page))

    def register(self, router: Router) -> None:
        router.add("GET", "/v2/openapi.json", self.document)

    async def document(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(self._body)
