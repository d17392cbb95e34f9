"""TorchServe's gRPC APIs: ``InferenceAPIsService`` and ``ManagementAPIsService``, each on its
own port (TorchServe's 7070 and 7071), with TorchServe's messages (``protocols/torchserve``).

A prediction's ``input`` map holds the handler's parameters by name (no content types, as in
TorchServe); the answer is the handler's bytes in ``prediction``. Management answers carry
TorchServe's JSON or status text in ``msg``. Errors use TorchServe's status codes and its
message form (the message, a new line, the exception's class): a model that is not there is
INTERNAL on the inference service and NOT_FOUND on the management one, a handler's own HTTP
status is mapped as TorchServe maps it (503 UNAVAILABLE, 4xx FAILED_PRECONDITION...).
``StreamPredictions`` answers with one message and ends; ``StreamPredictions2`` answers each
request of its stream in order, an error as that response's ``status``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.rpc import status_pb2

from inferd.core.errors import InferdError, ModelFailed
from inferd.observability.requests import RequestObserver
from inferd.protocols.grpc_common import Malformed, safe_deserializer
from inferd.protocols.torchserve import inference_pb2 as ipb
from inferd.protocols.torchserve import management_pb2 as mpb
from inferd.protocols.transport.grpc_services import GrpcService
from inferd.security.access import Access
from inferd.torchserve.errors import Answer, TorchServeError, answer
from inferd.torchserve.management import Management, ModelApiDisabled, Registration
from inferd.torchserve.models import Prediction, TorchServeModels, new_request_id

log = logging.getLogger("inferd.grpc")

INFERENCE_SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
MANAGEMENT_SERVICE = "org.pytorch.serve.grpc.management.ManagementAPIsService"
_SERVER_ERROR = "org.pytorch.serve.http.InternalServerException"
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    416: grpc.StatusCode.OUT_OF_RANGE,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code(http_status: int) -> grpc.StatusCode:
    """TorchServe's gRPC status for an HTTP status (``GRPCUtils.getGRPCStatusCode``)."""
    found = _CODES.get(http_status)
    if found is not None:
        return found
    if 200 <= http_status < 300:
        return grpc.StatusCode.OK
    if 400 <= http_status < 500:
        return grpc.StatusCode.FAILED_PRECONDITION
    if 500 <= http_status < 600:
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.UNKNOWN


def inference_status(exc: InferdError) -> tuple[grpc.StatusCode, str]:
    """How TorchServe's inference service fails a prediction."""
    found = answer(exc)
    if isinstance(exc, ModelFailed) or found.kind == "InternalServerException":
        return status_code(found.status), f"{found.message}\n{_SERVER_ERROR}"
    if found.kind == "ServiceUnavailableException":  # no worker: the job was not queued
        return grpc.StatusCode.INTERNAL, f"{found.message}\nInternalServerException.()"
    if found.kind == "BadRequestException":
        return grpc.StatusCode.INTERNAL, f"{found.message}\nBadRequestException.()"
    if found.kind in ("ModelNotFoundException", "ModelVersionNotFoundException"):
        return grpc.StatusCode.INTERNAL, found.grpc_message()
    return status_code(found.status), found.grpc_message()


def management_status(exc: InferdError) -> tuple[grpc.StatusCode, str]:
    """How TorchServe's management service fails a call."""
    if isinstance(exc, ModelApiDisabled):
        disabled = Answer(403, "ModelException", "Model API disabled")
        return grpc.StatusCode.PERMISSION_DENIED, disabled.grpc_message()
    found = answer(exc)
    if found.kind == "ConflictStatusException":  # escapes TorchServe's handlers: UNKNOWN
        return grpc.StatusCode.UNKNOWN, found.message
    if found.status in (400, 405) or found.kind.endswith("ModelException"):
        return grpc.StatusCode.INVALID_ARGUMENT, found.grpc_message()
    if found.kind == "InternalServerException":
        return grpc.StatusCode.INTERNAL, found.grpc_message()
    return status_code(found.status), found.grpc_message()


Mapper = Callable[[InferdError], tuple[grpc.StatusCode, str]]


def _guarded(
    method: str,
    handler: Callable[[Any], Awaitable[Any]],
    mapper: Mapper,
    observer: RequestObserver | None,
) -> Callable[[Any, Any], Awaitable[Any]]:
    async def run(request: Any, context: Any) -> Any:
        start_ns = time.perf_counter_ns()
        status = "OK"
        try:
            if isinstance(request, Malformed):
                raise TorchServeError(400, "BadRequestException", request.reason)
            return await handler(request)
        except InferdError as exc:
            code, message = mapper(exc)
            status = code.name
            await context.abort(code, message)
        except asyncio.CancelledError:
            status = "CANCELLED"
            raise
        except Exception:
            status = "INTERNAL"
            log.exception("unhandled error in %s", method)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}")
        finally:
            if observer is not None:
                ns = time.perf_counter_ns() - start_ns
                observer.endpoints.observe("grpc", method, status, ns)

    return run


class TorchServeGrpc:
    def __init__(
        self,
        models: TorchServeModels,
        management: Management,
        observer: RequestObserver | None = None,
    ) -> None:
        self.models = models
        self.management = management
        self.observer = observer

    # ------------------------------------------------------------------ services

    def inference_handlers(self) -> dict[str, Any]:
        def unary(name: str, handler: Any, message: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                _guarded(name, handler, inference_status, self.observer),
                request_deserializer=safe_deserializer(message.FromString),
                response_serializer=_serialize,
            )

        return {
            "Ping": unary("Ping", self.ping, _Empty),
            "Predictions": unary("Predictions", self.predictions, ipb.PredictionsRequest),
            "StreamPredictions": grpc.unary_stream_rpc_method_handler(
                self.stream_predictions,
                request_deserializer=safe_deserializer(ipb.PredictionsRequest.FromString),
                response_serializer=_serialize,
            ),
            "StreamPredictions2": grpc.stream_stream_rpc_method_handler(
                self.stream_predictions2,
                request_deserializer=safe_deserializer(ipb.PredictionsRequest.FromString),
                response_serializer=_serialize,
            ),
        }

    def inference_service(self) -> GrpcService:
        """The inference service: Ping is health, the predictions inference."""
        handlers = self.inference_handlers()
        access = {m: Access.HEALTH if m == "Ping" else Access.INFERENCE for m in handlers}
        return GrpcService(INFERENCE_SERVICE, handlers, access)

    def management_service(self) -> GrpcService:
        """The management service: every call admin."""
        handlers = self.management_handlers()
        return GrpcService(MANAGEMENT_SERVICE, handlers, {m: Access.ADMIN for m in handlers})

    def management_handlers(self) -> dict[str, Any]:
        calls: dict[str, tuple[Callable[[Any], Awaitable[Any]], Any]] = {
            "DescribeModel": (self.describe, mpb.DescribeModelRequest),
            "ListModels": (self.list_models, mpb.ListModelsRequest),
            "RegisterModel": (self.register, mpb.RegisterModelRequest),
            "ScaleWorker": (self.scale, mpb.ScaleWorkerRequest),
            "SetDefault": (self.set_default, mpb.SetDefaultRequest),
            "UnregisterModel": (self.unregister, mpb.UnregisterModelRequest),
        }
        return {
            name: grpc.unary_unary_rpc_method_handler(
                _guarded(name, handler, management_status, self.observer),
                request_deserializer=safe_deserializer(message.FromString),
                response_serializer=_serialize,
            )
            for name, (handler, message) in calls.items()
        }

    # ------------------------------------------------------------------ inference

    async def ping(self, request: Any) -> ipb.TorchServeHealthResponse:
        status = "Healthy" if self.models.healthy() else "Unhealthy"
        return ipb.TorchServeHealthResponse(health=json.dumps({"status": status}, indent=2))

    async def _predict(self, request: ipb.PredictionsRequest) -> bytes:
        """The handler's answer (a streaming handler's final one)."""
        found = await self._answers(request)
        if isinstance(found, Prediction):
            return found.body
        body = b""
        async for prediction in found:
            body = prediction.body
        return body

    async def _answers(
        self, request: ipb.PredictionsRequest
    ) -> Prediction | AsyncIterator[Prediction]:
        if not request.model_name:
            raise TorchServeError(400, "BadRequestException", "Parameter model_name is required.")
        names = list(request.input.keys())
        values = [request.input[n] for n in names]
        headers: dict[str, Any] = {}
        if request.HasField("sequence_id"):
            headers["ts_request_sequence_id"] = request.sequence_id
        return await self.models.answers(
            request.model_name,
            request.model_version,
            values,
            names,
            [""] * len(names),
            headers,
            new_request_id(),
        )

    async def predictions(self, request: ipb.PredictionsRequest) -> ipb.PredictionResponse:
        return ipb.PredictionResponse(prediction=await self._predict(request))

    async def stream_predictions(
        self, request: Any, context: Any
    ) -> AsyncIterator[ipb.PredictionResponse]:
        """A streaming handler's answers, one message each; any other handler's one."""
        try:
            if isinstance(request, Malformed):
                raise TorchServeError(400, "BadRequestException", request.reason)
            found = await self._answers(request)
            if isinstance(found, Prediction):
                yield ipb.PredictionResponse(prediction=found.body)
                return
            async for prediction in found:
                yield ipb.PredictionResponse(prediction=prediction.body)
        except InferdError as exc:
            code, message = inference_status(exc)
            await context.abort(code, message)

    async def stream_predictions2(
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[ipb.PredictionResponse]:
        async for request in requests:
            response = ipb.PredictionResponse()
            try:
                if isinstance(request, Malformed):
                    raise TorchServeError(400, "BadRequestException", request.reason)
                response.prediction = await self._predict(request)
            except InferdError as exc:
                code, message = inference_status(exc)
                response.status.CopyFrom(status_pb2.Status(code=code.value[0], message=message))
            if isinstance(request, ipb.PredictionsRequest) and request.HasField("sequence_id"):
                response.sequence_id = request.sequence_id
            yield response

    # ------------------------------------------------------------------ management

    async def describe(self, request: mpb.DescribeModelRequest) -> mpb.ManagementResponse:
        found = await self.management.describe(
            request.model_name, request.model_version, request.customized
        )
        return mpb.ManagementResponse(msg=json.dumps(found, indent=2, ensure_ascii=False))

    async def list_models(self, request: mpb.ListModelsRequest) -> mpb.ManagementResponse:
        found = self.management.list_models(request.limit, request.next_page_token)
        return mpb.ManagementResponse(msg=json.dumps(found, indent=2, ensure_ascii=False))

    async def register(self, request: mpb.RegisterModelRequest) -> mpb.ManagementResponse:
        registration = Registration(
            url=request.url or None,
            model_name=request.model_name or None,
            handler=request.handler or None,
            batch_size=request.batch_size if request.batch_size > 0 else None,
            max_batch_delay=request.max_batch_delay if request.max_batch_delay > 0 else None,
            initial_workers=request.initial_workers if request.initial_workers > 0 else None,
            response_timeout=request.response_timeout if request.response_timeout > 0 else None,
            startup_timeout=request.startup_timeout if request.startup_timeout > 0 else None,
            synchronous=request.synchronous,
        )
        _, message = await self.management.register(registration)
        return mpb.ManagementResponse(msg=message)

    async def scale(self, request: mpb.ScaleWorkerRequest) -> mpb.ManagementResponse:
        low = request.min_worker if request.min_worker > 0 else 1
        high = request.max_worker if request.max_worker > 0 else low
        _, message = await self.management.scale(
            request.model_name, request.model_version, low, high, request.synchronous
        )
        return mpb.ManagementResponse(msg=message)

    async def set_default(self, request: mpb.SetDefaultRequest) -> mpb.ManagementResponse:
        message = await self.management.set_default(request.model_name, request.model_version)
        return mpb.ManagementResponse(msg=message)

    async def unregister(self, request: mpb.UnregisterModelRequest) -> mpb.ManagementResponse:
        message = await self.management.unregister(request.model_name, request.model_version)
        return mpb.ManagementResponse(msg=message)


class _Empty:
    """``google.protobuf.Empty``'s parser (Ping takes no fields)."""

    @staticmethod
    def FromString(data: bytes) -> Any:
        from google.protobuf import empty_pb2

        return empty_pb2.Empty.FromString(data)


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data
