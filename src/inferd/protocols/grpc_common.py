"""What every gRPC servicer of inferd shares: error codes to gRPC statuses, and the guard that
answers errors with their status and reports each call to the request observer."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from inferd.errors import ErrorCode, InferdError
from inferd.observability.requests import Finished, RequestObserver, new_request_id
from inferd.protocols.v2_grpc_codec import EncodedInferResponse, WireInferRequest

log = logging.getLogger("inferd.grpc")

Handler = Callable[[Any], Awaitable[Any]]

STATUS_OF: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.PAYLOAD_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}


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
            response = await handler(request)
            return response
        except InferdError as exc:
            status = STATUS_OF[exc.code]
            await context.abort(status, exc.message)
        except Exception as exc:  # a bug must answer INTERNAL, not hang the call
            status = grpc.StatusCode.INTERNAL
            log.exception("unhandled error in %s", method)
            await context.abort(status, f"internal error: {exc}")
        finally:
            if observer is not None:
                _observe(observer, service, method, status, start_ns, request, response, context)

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
        observer.endpoints.observe("grpc", method, status.name, ns)
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
