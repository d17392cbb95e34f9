"""A thin RSGI application (granian's interface): routing, the edge checks, body limits and
timeouts, gzip/deflate, the in-flight limit, errors.

No web framework sits on the infer route: one regex match, the guard (``http_guard``), one
body read, one send.
RSGI because it keeps the server's own cost per request low: an empty RSGI handler on this
project's 2-core machine costs about 70 CPU-µs per request (``benchmarks/empty_rsgi.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import re
import sys
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from inferd.errors import (
    ErrorCode,
    InferdError,
    InvalidInput,
    NotFound,
    Overloaded,
    PayloadTooLarge,
)
from inferd.observability.requests import Finished, RequestObserver, new_request_id
from inferd.protocols.access import Access
from inferd.protocols.deadlines import BodyDeadlines
from inferd.protocols.http_body import (
    DEFAULT_MAX_BODY_BYTES,
    Limits,
    decompress,
    send_stream,
    too_large,
)
from inferd.protocols.http_guard import NO_CORS, HttpGuard
from inferd.protocols.watch import ClientWatch
from inferd.redact import redact
from inferd.types import Timings

log = logging.getLogger("inferd.http")

Headers = Mapping[str, str]
T = TypeVar("T")

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
# Bodies up to this size are read in one call; larger ones chunk by chunk into one buffer.
WHOLE_BODY_BYTES = 1 << 20
RETRY_AFTER_S = "1"
# A request refused before its body was read has a body up to this size read and dropped
# (never held), so its client gets the answer; a larger one's connection is closed instead.
DRAIN_MAX_BYTES = 8 << 20
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

    def __post_init__(self) -> None:
        counted = self.access not in (Access.PUBLIC, Access.HEALTH, Access.METRICS)
        object.__setattr__(self, "counted", counted)

    @property
    def pool(self) -> int:
        """Whose in-flight count the route's requests take: inference's (0) or admin's (1)."""
        return int(self.access is Access.ADMIN)


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
            raise _MethodNotAllowed(f"method {method} is not allowed on {path}", allowed)
        raise NotFound(f"no route for {method} {path}")


class _MethodNotAllowed(InvalidInput):
    def __init__(self, message: str, allowed: list[str]) -> None:
        super().__init__(message)
        self.allow = ", ".join(sorted(set(allowed)))


class HttpApp:
    """The RSGI entry point for every HTTP route of the server."""

    def __init__(
        self,
        router: Router,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        observer: RequestObserver | None = None,
        guard: HttpGuard | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.router = router
        self.limits = limits or Limits(max_body_bytes=max_body_bytes)
        self._deadlines = BodyDeadlines(self.limits.body_timeout_s)
        self._too_slow = self.limits.body_rate.describe()
        self._watch = ClientWatch()
        self.max_body_bytes = self.limits.max_body_bytes
        self.observer = observer
        self.guard = guard
        self.inflight = [0, 0]  # requests in progress: inference's, admin's (Route.pool)
        self.inflight_bytes = 0
        self._max_requests = self.limits.max_inflight_requests or sys.maxsize
        self._max_bytes = self.limits.max_inflight_bytes or sys.maxsize

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        if scope.proto != "http":
            return
        start_ns = time.perf_counter_ns()
        method, path = scope.method, scope.path
        headers: Headers = scope.headers
        endpoint = "unmatched"
        body = b""
        cors = NO_CORS
        counted = reserved = False  # in the request count; its declared bytes in the byte count
        declared = 0
        unread = True  # the body is still on the wire
        try:
            if method == "OPTIONS" and self.guard is not None:
                cors = self.guard.preflight(headers)
                raise _Preflight
            handler, route, params = self.router.resolve(method, path)
            endpoint = handler.__qualname__
            if self.guard is not None:
                cors = self.guard.check(method, headers, route.access)
            length = headers.get("content-length")
            if length is None:
                declared = 0
            elif length.isdigit() and length.isascii():
                declared = int(length)
            else:
                raise InvalidInput(f"Content-Length '{length[:40]}' is not a number")
            if route.counted:
                pool = route.pool
                if self.inflight[pool] >= self._max_requests or (
                    declared
                    and self.inflight_bytes + declared > self._max_bytes
                    and self.inflight_bytes > 0
                ):
                    self._refuse(pool)
                self.inflight_bytes += declared
                reserved = True
                if route.stream:  # it runs while its body streams in: counted from now
                    self.inflight[pool] += 1
                    counted = True
            if route.admit is not None:
                route.admit(params)
            limit = route.max_body_bytes or self.limits.max_body_bytes
            task = asyncio.current_task()
            request = HttpRequest(
                method,
                path,
                headers,
                b"",
                params,
                scope.query_string,
                protocol.client_disconnect,
                task=task,
                watch=self._watch,
            )
            unread = False  # from here on, the body is read (or streamed by the handler)
            if route.stream:
                if declared > limit:
                    raise too_large(declared, limit, route.limit_flag)
                request.chunks = self._chunks(protocol, limit, route.limit_flag)
            elif (
                0 < declared <= WHOLE_BODY_BYTES
                and declared <= limit
                and ("content-encoding" not in headers)
            ):  # the usual body, read in one call (as ``_read_body`` would, one frame less)
                body = request.body = await self._whole(protocol, declared, task)
            else:
                body = request.body = await self._read_body(
                    headers, protocol, declared, limit, route.limit_flag
                )
            if reserved and not counted:  # counted once its body is in: slow bodies never are
                if self.inflight[pool] >= self._max_requests:
                    self._refuse(pool)
                self.inflight[pool] += 1
                counted = True
            response = await handler(request)
        except _Preflight:
            response = HttpResponse(b"", 204)
        except _MethodNotAllowed as exc:
            response = json_response({"error": exc.message}, 405)
            response.headers.append(("allow", exc.allow))
        except InferdError as exc:
            if unread and 0 < declared <= DRAIN_MAX_BYTES:
                await self._discard(protocol)
            request_id = headers.get("x-request-id") or new_request_id()
            if exc.code is ErrorCode.INTERNAL:
                log.error("%s %s failed (request id %s): %s", method, path, request_id, exc.message)
            response = error_response(exc, request_id)
            response.request_id = request_id
        except Exception:  # a bug must answer 500, not drop the connection
            request_id = headers.get("x-request-id") or new_request_id()
            log.exception("unhandled error on %s %s (request id %s)", method, path, request_id)
            response = json_response(
                {"error": f"internal error (request id {request_id}); the server log has more"},
                500,
            )
            response.request_id = request_id
        finally:
            if counted:
                self.inflight[route.pool] -= 1
            if reserved:
                self.inflight_bytes -= declared
        request_id = headers.get("x-request-id") or response.request_id or new_request_id()
        response.headers.append(("x-request-id", request_id))
        if cors:
            response.headers.extend(cors)
        sent = 0
        if response.stream is not None:
            head = [("content-type", response.content_type), *response.headers]
            sent = await send_stream(protocol, response.status, head, response.stream)
        elif response.status != 499:  # nobody is there to read it
            sent = _send(protocol, response)
        observer = self.observer
        if observer is None:
            return
        if not observer.detailed:  # metrics only: skip building the record
            ns = time.perf_counter_ns() - start_ns
            observer.endpoints.observe("http", endpoint, str(response.status), ns)
        else:
            observer.finish(
                Finished(
                    "http",
                    method,
                    path,
                    endpoint,
                    str(response.status),
                    start_ns,
                    len(body),
                    sent,
                    scope.client,
                    request_id,
                    response.model,
                    response.version,
                    response.timings,
                ),
                headers,
            )

    async def _discard(self, protocol: Any) -> None:
        """Read a refused request's (small) body and drop it, chunk by chunk, so that the
        client, still sending it, reads the answer instead of a reset connection."""
        with contextlib.suppress(Exception):
            async for _ in self._chunks(protocol, DRAIN_MAX_BYTES, ""):
                pass

    def _refuse(self, pool: int) -> None:
        """Answer 503 at once (before the body is read): too much is in progress."""
        limits = self.limits
        count = self.inflight[pool]
        if limits.max_inflight_requests and count >= limits.max_inflight_requests:
            raise Overloaded(
                f"the server has {count} {'admin ' if pool else ''}requests in progress "
                f"(--max-inflight-requests {limits.max_inflight_requests}); retry later"
            )
        raise Overloaded(
            f"the server holds {self.inflight_bytes} bytes of request bodies in progress "
            f"(--max-inflight-bytes {limits.max_inflight_bytes}); retry later"
        )

    async def _read_body(
        self, headers: Headers, protocol: Any, declared: int, limit: int, flag: str
    ) -> bytes:
        if declared > limit:
            raise too_large(declared, limit, flag)
        if declared == 0 and "transfer-encoding" not in headers:
            body: bytes = b""
        elif 0 < declared <= WHOLE_BODY_BYTES:
            body = await self._whole(protocol, declared)
        else:  # large or chunked: into one buffer as it streams in (never held twice)
            buffer = bytearray(declared) if declared else bytearray()
            size = 0
            async for chunk in self._chunks(protocol, limit, flag, counted=not declared):
                end = size + len(chunk)
                if declared:
                    if end > declared:
                        raise InvalidInput("the request body is longer than its Content-Length")
                    buffer[size:end] = chunk
                else:
                    buffer += chunk
                size = end
            if declared and size != declared:
                raise InvalidInput("the request body is shorter than its Content-Length")
            body = buffer  # type: ignore[assignment]  # a bytearray reads as bytes
        encoding = headers.get("content-encoding")
        if encoding and body:
            body = decompress(encoding, body, limit)
        return body

    async def _whole(self, protocol: Any, declared: int, task: Any = None) -> bytes:
        """A body of ``declared`` bytes read in one call, within the timeout and the rate."""
        rate = self.limits.body_rate
        until = rate.deadline(time.monotonic(), declared) if rate.min_bytes_per_s else None
        return await self._deadlines.read(protocol(), task, until, self._too_slow)

    async def _chunks(
        self, protocol: Any, limit: int, flag: str, counted: bool = False
    ) -> AsyncIterator[bytes]:
        """The body chunk by chunk: each must come within the body timeout and the minimum
        rate, all within limit. ``counted``: a body with no Content-Length, whose bytes count
        against --max-inflight-bytes as they arrive."""
        size = 0
        stream = protocol.__aiter__()
        rate = self.limits.body_rate
        started = time.monotonic()
        try:
            while True:
                until = rate.deadline(started, size)
                try:
                    chunk: bytes = await self._deadlines.read(
                        stream.__anext__(), until=until, why=self._too_slow
                    )
                except StopAsyncIteration:
                    return
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(
                        f"request body exceeds the limit of {limit} bytes ({flag})"
                    )
                if counted:
                    self.inflight_bytes += len(chunk)
                    if self.inflight_bytes > self._max_bytes:
                        raise Overloaded(
                            f"the server holds {self.inflight_bytes} bytes of request bodies "
                            f"in progress (--max-inflight-bytes {self.limits.max_inflight_bytes})"
                            "; retry later"
                        )
                yield chunk
        finally:
            if counted:
                self.inflight_bytes -= size


class _Preflight(Exception):
    """Answered from the guard's CORS headers, with no route."""


def cancel_on_disconnect(request: HttpRequest, work: Awaitable[T]) -> Awaitable[T]:
    """``work``, cancelled (``ClientGone``, answered 499 to nobody) when the client hangs up
    before it is done: work still queued is then dropped, not executed (``protocols.watch``)."""
    watch = request.watch
    if watch is None:
        return work
    return watch.guard(request, work)


def _send(protocol: Any, response: HttpResponse) -> int:
    """Answer; returns the body bytes sent."""
    body = response.body
    headers = [("content-type", response.content_type), *response.headers]
    encoding = response.encoding if body else ""
    if encoding == "gzip":
        body = gzip.compress(body, compresslevel=5)
    elif encoding == "deflate":
        body = zlib.compress(body, 5)
    if encoding:
        headers.append(("content-encoding", encoding))
    protocol.response_bytes(response.status, headers, body)
    return len(body)
