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
import sys
import time
import zlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from inferd.core.errors import (
    ErrorCode,
    InferdError,
    InternalError,
    InvalidInput,
    Overloaded,
    PayloadTooLarge,
)
from inferd.observability.requests import Finished, RequestObserver, new_request_id
from inferd.protocols.transport.deadlines import BodyDeadlines
from inferd.protocols.transport.http_body import (
    DEFAULT_MAX_BODY_BYTES,
    Limits,
    decompress,
    fill,
    finish,
    send_stream,
    too_large,
)
from inferd.protocols.transport.http_routes import (
    STATUS_OF,
    ErrorRenderer,
    Headers,
    HttpRequest,
    HttpResponse,
    MethodNotAllowed,
    Router,
    error_response,
    json_response,
)
from inferd.protocols.transport.watch import ClientWatch
from inferd.security.http_guard import NO_CORS, HttpGuard

log = logging.getLogger("inferd.http")

T = TypeVar("T")

# Bodies up to this size are read in one call; larger ones chunk by chunk into one buffer.
WHOLE_BODY_BYTES = 1 << 20
# A request refused before its body was read has a body up to this size read and dropped
# (never held), so its client gets the answer; a larger one's connection is closed instead.
DRAIN_MAX_BYTES = 8 << 20


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
        render_error: ErrorRenderer | None = None,
        route_options: bool = False,
    ) -> None:
        self.router = router
        # Another API's error bodies (TorchServe's ports); None: inferd's {"error": ...}.
        self.render_error = render_error
        # OPTIONS goes to the routes unless it is a CORS preflight (TorchServe's OPTIONS /).
        self.route_options = route_options
        self.limits = limits or Limits(max_body_bytes=max_body_bytes)
        self._deadlines = BodyDeadlines(self.limits.body_timeout_s)
        self._too_slow = self.limits.body_rate.describe()
        self._watch = ClientWatch()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop requests last came on
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
        received = 0  # the body's length (the request holds the body: a handler may drop it)
        cors = NO_CORS
        counted = False  # in the request count
        held: _Held | None = None  # its body's bytes that arrived, in the byte count
        declared = 0
        unread = True  # the body is still on the wire
        try:
            if (
                method == "OPTIONS"
                and self.guard is not None
                and (not self.route_options or "access-control-request-method" in headers)
            ):
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
                # A body that cannot fit beside the bytes that other bodies hold is refused
                # before it is read; nothing is reserved for it: it counts as it arrives.
                if self.inflight[pool] >= self._max_requests or (
                    declared
                    and self.inflight_bytes + declared > self._max_bytes
                    and self.inflight_bytes > 0
                ):
                    self._refuse(pool)
                held = _Held()
                if route.stream:  # it runs while its body streams in: counted from now
                    self.inflight[pool] += 1
                    counted = True
            if route.admit is not None:
                route.admit(params)
            limit = route.max_body_bytes or self.limits.max_body_bytes
            if declared > limit:  # refused before its body is read: a small one is drained
                raise too_large(declared, limit, route.limit_flag)
            # With the loop named, current_task skips get_running_loop (and its getpid call).
            loop = self._loop
            task = asyncio.current_task(loop) if loop is not None else None
            if task is None:  # the first request, or one on another loop
                task = asyncio.current_task()
                self._loop = task.get_loop() if task is not None else None
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
            if route.stream:  # the handler consumes it chunk by chunk: never held whole
                request.chunks = self._chunks(protocol, limit, route.limit_flag)
            elif (
                0 < declared <= WHOLE_BODY_BYTES
                and declared <= limit
                and ("content-encoding" not in headers)
            ):  # the usual body, read in one call (as ``_read_body`` would, one frame less)
                request.body = await self._whole(protocol, declared, task)
                if held is not None:
                    held.bytes = declared
                    self.inflight_bytes += declared
            else:
                request.body = await self._read_body(
                    headers, protocol, declared, limit, route.limit_flag, held
                )
            received = len(request.body)
            if held is not None and not counted:  # counted once its body is in: slow bodies
                # never are
                if self.inflight[pool] >= self._max_requests:
                    self._refuse(pool)
                self.inflight[pool] += 1
                counted = True
            response = await handler(request)
        except _Preflight:
            response = HttpResponse(b"", 204)
        except MethodNotAllowed as exc:
            if self.render_error is not None:
                response = self.render_error(exc, "", 405)
            else:
                response = json_response({"error": exc.message}, 405)
            response.headers.append(("allow", exc.allow))
        except InferdError as exc:
            if unread and 0 < declared <= DRAIN_MAX_BYTES:
                await self._discard(protocol)
            request_id = headers.get("x-request-id") or new_request_id()
            if exc.code is ErrorCode.INTERNAL:
                log.error("%s %s failed (request id %s): %s", method, path, request_id, exc.message)
            if self.render_error is not None:
                response = self.render_error(exc, request_id, STATUS_OF[exc.code])
            else:
                response = error_response(exc, request_id)
            response.request_id = request_id
        except Exception:  # a bug must answer 500, not drop the connection
            request_id = headers.get("x-request-id") or new_request_id()
            log.exception("unhandled error on %s %s (request id %s)", method, path, request_id)
            message = f"internal error (request id {request_id}); the server log has more"
            if self.render_error is not None:
                response = self.render_error(InternalError(message), request_id, 500)
            else:
                response = json_response({"error": message}, 500)
            response.request_id = request_id
        finally:
            if counted:
                self.inflight[route.pool] -= 1
            if held is not None:
                self.inflight_bytes -= held.bytes
        request_id = headers.get("x-request-id") or response.request_id or new_request_id()
        response.headers.append(("x-request-id", request_id))
        if cors:
            response.headers.extend(cors)
        sent = 0
        if response.stream is not None:
            head = (
                [("content-type", response.content_type), *response.headers]
                if response.content_type
                else response.headers
            )
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
                    received,
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
        self,
        headers: Headers,
        protocol: Any,
        declared: int,
        limit: int,
        flag: str,
        held: _Held | None = None,
    ) -> bytes:
        if declared > limit:
            raise too_large(declared, limit, flag)
        if declared == 0 and "transfer-encoding" not in headers:
            body: bytes = b""
        elif 0 < declared <= WHOLE_BODY_BYTES:
            body = await self._whole(protocol, declared)
            if held is not None:
                held.bytes = declared
                self.inflight_bytes += declared
        else:  # large or chunked: into one buffer as it streams in (never held twice), grown
            # with the bytes that arrived, never allocated at the length the head declared
            buffer = bytearray()
            size = 0
            async for chunk in self._chunks(protocol, limit, flag, held):
                if declared and size + len(chunk) > declared:
                    raise InvalidInput("the request body is longer than its Content-Length")
                size = fill(buffer, size, chunk, declared)
            if declared and size != declared:
                raise InvalidInput("the request body is shorter than its Content-Length")
            body = finish(buffer, size)  # type: ignore[assignment]  # reads as bytes
        encoding = headers.get("content-encoding")
        if encoding and body:
            body = decompress(encoding, body, limit)
        return body

    async def _whole(self, protocol: Any, declared: int, task: Any = None) -> bytes:
        """A body of ``declared`` bytes read in one call, within the timeout and the rate."""
        deadlines = self._deadlines
        if task is None:
            return await deadlines.read(protocol(), None)  # not in a task: nothing to cancel
        now = time.monotonic()
        due = now + deadlines.timeout_s
        rate = self.limits.body_rate
        if rate.min_bytes_per_s:
            until = now + rate.grace_s + declared / rate.min_bytes_per_s  # rate.deadline's
            if until < due:
                return await deadlines.read_by(protocol(), task, until, self._too_slow)
        return await deadlines.read_by(protocol(), task, due)

    async def _chunks(
        self, protocol: Any, limit: int, flag: str, held: _Held | None = None
    ) -> AsyncIterator[bytes]:
        """The body chunk by chunk: each must come within the body timeout and the minimum
        rate, all within limit. ``held``: a body kept whole, whose bytes count against
        --max-inflight-bytes as they arrive (until its request ends)."""
        size = 0
        stream = protocol.__aiter__()
        rate = self.limits.body_rate
        started = time.monotonic()
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
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes ({flag})")
            if held is not None:
                held.bytes += len(chunk)
                self.inflight_bytes += len(chunk)
                if self.inflight_bytes > self._max_bytes:
                    raise Overloaded(
                        f"the server holds {self.inflight_bytes} bytes of request bodies "
                        f"in progress (--max-inflight-bytes {self.limits.max_inflight_bytes})"
                        "; retry later"
                    )
            yield chunk


class _Held:
    """The bytes of one request's body that arrived and count against --max-inflight-bytes
    until the request ends."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class _Preflight(Exception):
    """Answered from the guard's CORS headers, with no route."""


def cancel_on_disconnect(request: HttpRequest, work: Awaitable[T]) -> Awaitable[T]:
    """``work``, cancelled (``ClientGone``, answered 499 to nobody) when the client hangs up
    before it is done: work still queued is then dropped, not executed (``transport.watch``)."""
    watch = request.watch
    if watch is None:
        return work
    return watch.guard(request, work)


def _send(protocol: Any, response: HttpResponse) -> int:
    """Answer; returns the body bytes sent."""
    body = response.body
    headers = (
        [("content-type", response.content_type), *response.headers]
        if response.content_type
        else response.headers
    )
    encoding = response.encoding
    if encoding and body:  # mostly not compressed
        if encoding == "gzip":
            body = gzip.compress(body, compresslevel=5)
        elif encoding == "deflate":
            body = zlib.compress(body, 5)
        headers.append(("content-encoding", encoding))
    protocol.response_bytes(response.status, headers, body)
    return len(body)
