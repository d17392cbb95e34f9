"""What every gRPC servicer of inferd shares: error codes to gRPC statuses, the guard that
answers errors with their status and reports each call (unary or stream) to the request
observer, and deserializers that turn a malformed message into INVALID_ARGUMENT."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from inferd.core.errors import ErrorCode, InferdError, InvalidInput
from inferd.observability.requests import Finished, RequestObserver, new_request_id
from inferd.protocols.v2.grpc_codec import EncodedInferResponse, WireInferRequest
from inferd.security.redact import redact

log = logging.getLogger("inferd.grpc")

Handler = Callable[[Any], Awaitable[Any]]

STATUS_OF: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.PAYLOAD_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.REQUEST_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}


_OK = grpc.StatusCode.OK


class Malformed:
    """A request message that did not parse; the guard answers INVALID_ARGUMENT."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def safe_deserializer(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``parse``, with a malformed message becoming ``Malformed`` (not UNKNOWN and a Python
    exception name, as grpc answers when a deserializer raises)."""

    def run(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:
            return Malformed(f"the request message does not parse ({type(exc).__name__})")

    return run


def public_message(exc: InferdError, method: str) -> str:
    """An error's message for the client: internal ones without paths, with an id to find
    the full text in the log."""
    if exc.code is not ErrorCode.INTERNAL:
        return exc.message
    request_id = new_request_id()
    log.error("%s failed (request id %s): %s", method, request_id, exc.message)
    return f"{redact(exc.message)} (request id {request_id})"


def _internal(method: str) -> str:
    request_id = new_request_id()
    log.exception("unhandled error in %s (request id %s)", method, request_id)
    return f"internal error (request id {request_id}); the server log has more"


def guarded(
    service: str, method: str, handler: Handler, observer: RequestObserver | None = None
) -> Callable[[Any, Any], Awaitable[Any]]:
    """A grpc.aio unary handler that answers errors with their status code and message,
    and reports each call to the observer (endpoint metrics, access log, trace)."""

    async def run(request: Any, context: Any) -> Any:
        start_ns = time.perf_counter_ns()
        status = grpc.StatusCode.OK
        response: Any = None
        try:
            if isinstance(request, Malformed):
                raise InvalidInput(request.reason)
            response = await handler(request)
            return response
        except InferdError as exc:
            status = STATUS_OF[exc.code]
            await context.abort(status, public_message(exc, method))
        except asyncio.CancelledError:  # the client left (or its deadline passed)
            status = grpc.StatusCode.CANCELLED
            raise
        except Exception:  # a bug must answer INTERNAL, not hang the call
            status = grpc.StatusCode.INTERNAL
            await context.abort(status, _internal(method))
        finally:
            if observer is not None:
                _observe(observer, service, method, status, start_ns, request, response, context)

    return run


StreamHandler = Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]


def guarded_stream(
    service: str, method: str, handler: StreamHandler, observer: RequestObserver | None = None
) -> Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]:
    """The streaming counterpart of ``guarded``: one observation per stream, errors that end
    the stream answered with their status."""

    async def run(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        start_ns = time.perf_counter_ns()
        status = grpc.StatusCode.OK
        try:
            async for response in handler(requests, context):
                yield response
        except InferdError as exc:
            status = STATUS_OF[exc.code]
            await context.abort(status, public_message(exc, method))
        except asyncio.CancelledError:
            status = grpc.StatusCode.CANCELLED
            raise
        except Exception:
            status = grpc.StatusCode.INTERNAL
            await context.abort(status, _internal(method))
        finally:
            if observer is not None:
                _observe(observer, service, method, status, start_ns, None, None, context)

    return run


def _observe(
    observer: RequestObserver,
    service: str,
    method: str,
    status: grpc.StatusCode,
    start_ns: int,
    request: Any,
    response: Any,
    context: Any,
) -> None:
    if not observer.detailed:
        ns = time.perf_counter_ns() - start_ns
        name = "OK" if status is _OK else status.name  # an Enum's .name is a Python property
        observer.endpoints.observe("grpc", method, name, ns)
        return
    model = version = request_id = ""
    bytes_in = bytes_out = 0
    if isinstance(request, WireInferRequest):
        message = request.message
        model, version, request_id = message.model_name, message.model_version, message.id
        bytes_in = message.ByteSize() + sum(len(raw) for raw in request.raw_inputs)
    else:
        if hasattr(request, "model_spec"):  # TF Serving
            model = request.model_spec.name
        elif hasattr(request, "name"):
            model, version = request.name, getattr(request, "version", "")
        bytes_in = request.ByteSize() if hasattr(request, "ByteSize") else 0
    if isinstance(response, EncodedInferResponse):
        version = response.header.model_version
        bytes_out = response.header.ByteSize() + sum(len(raw) for raw in response.raw_outputs)
    elif response is not None:
        if hasattr(response, "model_spec") and response.model_spec.HasField("version"):
            version = str(response.model_spec.version.value)
        bytes_out = response.ByteSize()
    done = Finished(
        "grpc",
        method,
        f"/{service}/{method}",
        method,
        status.name,
        start_ns,
        bytes_in,
        bytes_out,
        context.peer(),
        request_id or new_request_id(),
        model,
        version,
    )
    observer.finish(done, dict(context.invocation_metadata() or ()))
