"""The endpoint reference, generated from what a server serves: the HTTP routes of the router
the server builds (``Server(settings)``, nothing started) and the RPCs of its gRPC services,
each with its token scope. One short description per route and RPC is kept here; a route or
RPC without one, or a description of none, fails the build (``missing()``)."""

from __future__ import annotations

import re
import tempfile

from inferd.app import flags
from inferd.app.server import NetworkServer as Server
from inferd.cli import build_parser
from inferd.protocols.apis import grpc_services
from inferd.protocols.transport.grpc_services import access_table
from inferd.security.access import Access

_M = "/v2/models/{model}[/versions/{version} | /labels/{label}]"
_TF = "/v1/models/{model}[/versions/{version} | /labels/{label}]"

HTTP: dict[str, str] = {
    f"POST {_M}/infer": "inference: JSON, or binary tensors after a JSON header",
    "GET /v2": "server metadata: name, version, extensions",
    "GET /v2/models/stats": "statistics of every model (Triton's statistics extension)",
    f"GET {_M}/stats": "statistics of one model or version",
    "GET /v2/health/live": "200 while the process serves",
    "GET /v2/health/ready": "200 when the server is ready, else 503",
    f"GET {_M}": "model metadata: inputs, outputs, versions, platform",
    f"GET {_M}/ready": "200 when the model (version) is ready, 400 when not, 404 unknown",
    f"GET {_M}/config": "the completed model config as Triton's JSON",
    f"POST {_TF}:predict": "TF Serving predict: `instances` (row) or `inputs` (columnar)",
    f"POST {_TF}:classify": "TF Serving classify: `examples` (+ `context`)",
    f"POST {_TF}:regress": "TF Serving regress: `examples` (+ `context`)",
    f"GET {_TF}": "TF Serving model status (`model_version_status`)",
    f"GET {_TF}/metadata": "TF Serving metadata: every signature",
    "POST /v2/repository/index": "the repository's models and their states",
    "GET /v2/repository/status": "when each store was last listed, and the held models",
    "POST /v2/repository/models/{model}/load": "load or reload a model",
    "POST /v2/repository/models/{model}/unload": "unload a model",
    "PUT /v2/repository/models/{model}": "upload a model folder (.tar.gz, .tar, .zip...) and "
    "load it",
    "POST /v2/repository/models/{model}/labels": "set or remove version labels",
    "POST /v2/repository/models/{model}/routing": "set labels, traffic split, shadow",
    "GET /v2/models/{model}/routing": "labels, traffic split, shadow and its counts",
    "GET /metrics": "Prometheus metrics",
    "GET /v2/logs": "the last lines of the engine or access log",
    "GET /v2/trace/setting": "the trace settings",
    "POST /v2/trace/setting": "change the trace settings",
    "GET /v2/models/{model}/trace/setting": "a model's trace settings",
    "POST /v2/models/{model}/trace/setting": "change a model's trace settings",
    "GET /v2/logging": "the log settings",
    "POST /v2/logging": "change the log settings",
    "GET /v2/systemsharedmemory/status": "the registered system shared-memory regions",
    "GET /v2/systemsharedmemory/region/{name}/status": "one region",
    "POST /v2/systemsharedmemory/region/{name}/register": "map a window of a shared-memory "
    "object as a region",
    "POST /v2/systemsharedmemory/unregister": "forget every region",
    "POST /v2/systemsharedmemory/region/{name}/unregister": "forget one region",
    "GET /v2/cudasharedmemory/status": "CUDA regions: always none (no GPU)",
    "GET /v2/cudasharedmemory/region/{name}/status": "CUDA regions: always none (no GPU)",
    "POST /v2/cudasharedmemory/region/{name}/register": "501: no GPU",
    "POST /v2/cudasharedmemory/unregister": "CUDA regions: nothing to forget",
    "POST /v2/cudasharedmemory/region/{name}/unregister": "CUDA regions: nothing to forget",
    "POST /v2/models/{model}[/versions/{version}]/generate": "Triton's generate extension: "
    "flat JSON in, one JSON answer out",
    "POST /v2/models/{model}[/versions/{version}]/generate_stream": "the same, answers as "
    "server-sent events",
    "GET /v2/openapi.json": "the OpenAPI 3 description of the HTTP API",
    "GET /v2/dashboard/models": "the dashboard's models table",
    "GET /v2/dashboard/series": "the dashboard's traffic series",
    "GET /v2/dashboard/cluster": "Envoy's view of the nodes (`--envoy-admin`)",
    "GET /v2/repository/models/{model}/files": "a model's files in the repository",
    "GET /v2/repository/models/{model}/files/{path}": "one of those files (up to 64 MiB)",
    "GET /": "redirects to the dashboard",
    "GET /dashboard": "redirects to the dashboard",
    "GET /dashboard/{asset}": "the dashboard page and its files",
}

GRPC: dict[str, str] = {
    "inference.GRPCInferenceService/ServerLive": "the process serves",
    "inference.GRPCInferenceService/ServerReady": "the server is ready",
    "inference.GRPCInferenceService/ModelReady": "a model (version) is ready",
    "inference.GRPCInferenceService/ServerMetadata": "name, version, extensions",
    "inference.GRPCInferenceService/ModelMetadata": "inputs, outputs, versions, platform",
    "inference.GRPCInferenceService/ModelInfer": "inference (`raw_input_contents` or typed "
    "`contents`)",
    "inference.GRPCInferenceService/ModelStreamInfer": "inference on a stream; decoupled models "
    "answer 0..N times",
    "inference.GRPCInferenceService/ModelConfig": "the completed model config",
    "inference.GRPCInferenceService/ModelStatistics": "Triton's statistics",
    "inference.GRPCInferenceService/RepositoryIndex": "the repository's models and states",
    "inference.GRPCInferenceService/RepositoryModelLoad": "load or reload a model",
    "inference.GRPCInferenceService/RepositoryModelUnload": "unload a model",
    "inference.GRPCInferenceService/SystemSharedMemoryStatus": "the registered regions",
    "inference.GRPCInferenceService/SystemSharedMemoryRegister": "register a region",
    "inference.GRPCInferenceService/SystemSharedMemoryUnregister": "forget one region or all",
    "inference.GRPCInferenceService/CudaSharedMemoryStatus": "always none (no GPU)",
    "inference.GRPCInferenceService/CudaSharedMemoryRegister": "UNIMPLEMENTED: no GPU",
    "inference.GRPCInferenceService/CudaSharedMemoryUnregister": "nothing to forget",
    "inference.GRPCInferenceService/TraceSetting": "read or change the trace settings",
    "inference.GRPCInferenceService/LogSettings": "read or change the log settings",
    "tensorflow.serving.PredictionService/Predict": "TF Serving predict",
    "tensorflow.serving.PredictionService/GetModelMetadata": "every signature of a model",
    "tensorflow.serving.PredictionService/Classify": "classify `tf.Example`s",
    "tensorflow.serving.PredictionService/Regress": "regress `tf.Example`s",
    "tensorflow.serving.ModelService/GetModelStatus": "each version's state",
    "grpc.health.v1.Health/Check": 'SERVING while the server (service `""`) or a model '
    "(service: its name) is ready",
    "grpc.health.v1.Health/Watch": "the same, streamed as it changes",
    "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": "server reflection: the "
    "services above",
}

_SCOPE = {
    Access.PUBLIC: "open",
    Access.HEALTH: "health",
    Access.METRICS: "metrics",
    Access.INFERENCE: "inference",
    Access.ADMIN: "admin",
}


def _readable(pattern: str) -> list[str]:
    """``/v2/models/(?P<model>[^/]+)...\\Z`` as ``/v2/models/{model}...``; a group of plain
    alternatives (TF Serving's verbs) gives one path each."""
    text = pattern.removesuffix(r"\Z")
    text = re.sub(r"\(\?P<(\w+)>(?:\[[^\]]*\][*+]|\.\+)\)", r"{\1}", text)
    text = text.replace("\\", "")
    text = re.sub(r"\(\?:(.*?)\)\?", lambda m: "[" + m.group(1).replace("|", " | ") + "]", text)
    verbs = re.search(r"\(\?P<\w+>([a-z_|]+)\)", text)
    if verbs is None:
        return [text]
    return [text[: verbs.start()] + v + text[verbs.end() :] for v in verbs.group(1).split("|")]


def http_routes() -> list[tuple[str, str, str]]:
    """(method, path, scope) of every route of a server with the default settings."""
    with tempfile.TemporaryDirectory() as empty:
        args = build_parser().parse_args(["serve", "--model-repository", empty])
        server = Server(flags.from_sources(args, {}))
        routes = []
        for method, pattern, route in server.http_app.router.patterns():
            for path in _readable(pattern):
                routes.append((method, path, _SCOPE[route.access]))
        return routes


def grpc_methods() -> list[tuple[str, str]]:
    """(service/method, scope) of every RPC the gRPC port serves, as its services declare."""
    with tempfile.TemporaryDirectory() as empty:
        args = build_parser().parse_args(["serve", "--model-repository", empty])
        services = grpc_services(Server(flags.from_sources(args, {})).frontends.apis)
    access_of = access_table(services)
    names = [f"{s.name}/{m}" for s in services for m in s.handlers]
    names.append("grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    return [(name, _SCOPE[access_of("/" + name)]) for name in names]


def missing() -> list[str]:
    """Routes and RPCs without a description, and descriptions of none (both must be empty)."""
    routes = {f"{m} {p}" for m, p, _ in http_routes()}
    rpcs = {name for name, _ in grpc_methods()}
    return sorted((routes - set(HTTP)) | (rpcs - set(GRPC))) + sorted(
        (set(HTTP) - routes) | (set(GRPC) - rpcs)
    )


def reference() -> str:
    problems = missing()
    if problems:
        raise ValueError(f"endpoint reference out of date: {', '.join(problems)}")
    lines = [
        "# Endpoints",
        "",
        "Every HTTP route and gRPC method a server answers, generated from the server itself",
        "(the router it builds and the gRPC services it registers) each time the site is built.",
        "The scope is the token a call needs once tokens are configured (see",
        "[Tokens and scopes](../security/tokens.md)): *inference* (an inference or admin token),",
        "*admin*, *health* and *metrics* (open unless `--auth-health` / `--auth-metrics`), *open*",
        "(never a token). `[a | b]` is an optional part of the path. `GET /v2/openapi.json`",
        "describes the HTTP API as OpenAPI 3, with each route's scope as `x-inferd-access`.",
        "",
        "## HTTP (port 8080)",
        "",
        "| method | path | scope | what |",
        "|---|---|---|---|",
    ]
    for method, path, scope in http_routes():
        lines.append(f"| {method} | `{path}` | {scope} | {HTTP[f'{method} {path}']} |")
    lines += [
        "",
        "## gRPC (port 8081)",
        "",
        "| service | method | scope | what |",
        "|---|---|---|---|",
    ]
    for name, scope in grpc_methods():
        service, method = name.split("/")
        lines.append(f"| `{service}` | `{method}` | {scope} | {GRPC[name]} |")
    lines.append("")
    return "\n".join(lines)
