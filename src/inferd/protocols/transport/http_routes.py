"""What an HTTP handler sees: the request and the response, the error statuses, and the
router that finds a handler and its route (access scope, body limits) by method and path."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from inferd.core.errors import ErrorCode, InferdError, InvalidInput, NotFound, Overloaded
from inferd.core.types import Timings
from inferd.protocols.transport.watch import ClientWatch
from inferd.security.access import Access
from inferd.security.redact import redact

Headers = Mapping[str, str]

STATUS_OF: dict[ErrorCode, int] = {
    ErrorCode.INVALID_ARGUMENT: 400,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.CANCELLED: 499,  # nginx's "client closed request": counted apart from 5xx
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.UNIMPLEMENTED: 501,
    ErrorCode.INTERNAL: 500,
}

JSON_TYPE = "application/json"
RETRY_AFTER_S = "1"
RESOLVED_KEPT = 1024  # (method, path) pairs the router remembers


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    headers: Headers  # lower-case names
    body: bytes
    params: Mapping[str, str]  # shared by the requests of one path: read-only
    query: str = ""
    # Resolves when the client hangs up (RSGI's client_disconnect).
    disconnected: Callable[[], Awaitable[None]] | None = None
    # A streamed route's body, chunk by chunk, limits and timeouts applied (else None).
    chunks: AsyncIterator[bytes] | None = None
    task: asyncio.Task[Any] | None = None  # the task serving it
    watch: ClientWatch | None = None  # cancels the task when the client hangs up


@dataclass(slots=True)
class HttpResponse:
    body: bytes = b""
    status: int = 200
    content_type: str = JSON_TYPE
    headers: list[tuple[str, str]] = field(default_factory=list)
    # For the access log and traces, set by handlers that serve a model.
    model: str = ""
    version: str = ""
    request_id: str = ""
    timings: Timings | None = None
    # "gzip" or "deflate": compress the body so. Handlers choose (Triton compresses inference
    # responses only, as the client's Accept-Encoding asks); nothing else is compressed.
    encoding: str = ""
    # Sent chunk by chunk instead of ``body`` (server-sent events), as the chunks come.
    stream: AsyncIterator[bytes] | None = None


def json_response(value: Any, status: int = 200) -> HttpResponse:
    return HttpResponse(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY), status)


def error_response(error: InferdError, request_id: str = "") -> HttpResponse:
    message = error.message
    if error.code is ErrorCode.INTERNAL:
        message = f"{redact(message)} (request id {request_id})"
    response = json_response({"error": message}, STATUS_OF[error.code])
    if error.code is ErrorCode.UNAUTHENTICATED:
        response.headers.append(("www-authenticate", 'Bearer realm="inferd"'))
    elif isinstance(error, Overloaded):
        response.headers.append(("retry-after", RETRY_AFTER_S))
    return response


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]
# How a port answers an error: (error, request id, the HTTP status inferd would use).
ErrorRenderer = Callable[[InferdError, str, int], HttpResponse]


@dataclass(frozen=True, slots=True)
class Route:
    """How the app treats a handler's requests before calling it."""

    access: Access = Access.INFERENCE
    max_body_bytes: int | None = None  # None: --http-max-body-bytes
    limit_flag: str = "--http-max-body-bytes"
    stream: bool = False  # the handler reads ``request.chunks`` itself
    # Checks that need no body (a full queue): run before the body is read.
    admit: Callable[[Mapping[str, str]], None] | None = None
    # Counted among the requests in progress (health, metrics and public pages never are).
    counted: bool = field(init=False)
    # Whose in-flight count the route's requests take: inference's (0) or admin's (1).
    pool: int = field(init=False)

    def __post_init__(self) -> None:
        counted = self.access not in (Access.PUBLIC, Access.HEALTH, Access.METRICS)
        object.__setattr__(self, "counted", counted)
        object.__setattr__(self, "pool", int(self.access is Access.ADMIN))


Resolved = tuple[Handler, Route, Mapping[str, str]]


class Router:
    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self.routes: dict[Handler, Route] = {}
        # (method, path) -> what ``resolve`` found: clients repeat the same few paths (one
        # model's infer URL), which then cost one dict look-up instead of the regexes. The
        # parameters are shared between the requests of a path: read-only (Mapping).
        self._resolved: dict[tuple[str, str], Resolved] = {}

    def add(
        self,
        method: str,
        pattern: str,
        handler: Handler,
        *,
        access: Access = Access.INFERENCE,
        max_body_bytes: int | None = None,
        limit_flag: str = "--http-max-body-bytes",
        stream: bool = False,
        admit: Callable[[Mapping[str, str]], None] | None = None,
    ) -> None:
        self._routes.append((method, re.compile(pattern + r"\Z"), handler))
        self.routes[handler] = Route(access, max_body_bytes, limit_flag, stream, admit)
        self._resolved.clear()

    def patterns(self) -> list[tuple[str, str, Route]]:
        """(method, regex, route) of every route, for the API description."""
        return [(m, r.pattern, self.routes[h]) for m, r, h in self._routes]

    def resolve(self, method: str, path: str) -> Resolved:
        """The handler, its route and the path parameters; NotFound, or 405."""
        found = self._resolved.get((method, path))
        if found is not None:
            return found
        handler, params = self.match(method, path)
        found = (handler, self.routes.get(handler) or Route(), params)
        if len(self._resolved) >= RESOLVED_KEPT:  # many distinct paths: start over
            self._resolved.clear()
        self._resolved[method, path] = found
        return found

    def match(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        """The handler and path parameters; NotFound, or 405 for a known path."""
        allowed: list[str] = []
        for route_method, regex, handler in self._routes:
            found = regex.match(path)
            if found is None:
                continue
            if route_method == method:
                return handler, {k: v for k, v in found.groupdict().items() if v is not None}
            allowed.append(route_method)
        if allowed:
            raise MethodNotAllowed(f"method {method} is not allowed on {path}", allowed)
        raise NotFound(f"no route for {method} {path}")


class MethodNotAllowed(InvalidInput):
    def __init__(self, message: str, allowed: list[str]) -> None:
        super().__init__(message)
        self.allow = ", ".join(sorted(set(allowed)))
