"""KServe v2 / Triton gRPC: the GRPCInferenceService on grpc.aio, with health and reflection.

A thin adapter over the DataPlane, as v2_http.py is: messages are decoded into the same
InferRequest (v2_grpc_codec.py) and every check lives in the core. Errors carry their
ErrorCode and the same one-line message as on HTTP, mapped here to a gRPC status code; in
ModelStreamInfer one request's error is that response's ``error_message`` and the stream goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from inferd.core.errors import InferdError, InvalidInput, NotFound, Unimplemented
from inferd.core.stats import ModelStatistics, StatDuration
from inferd.core.types import InferResponse
from inferd.observability.requests import RequestObserver
from inferd.plane.dataplane import DataPlane
from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols.grpc_common import (
    Handler,
    Malformed,
    guarded,
    guarded_stream,
    public_message,
    safe_deserializer,
)
from inferd.protocols.pool import POOL
from inferd.protocols.transport.grpc_services import GrpcService
from inferd.protocols.v2 import shm_tensors
from inferd.protocols.v2.grpc_codec import (
    EncodedInferResponse,
    StreamResponse,
    WireInferRequest,
    decode_request,
    encode_response,
    error_header,
    parse_infer_request,
)
from inferd.protocols.v2.settings_grpc import SettingsGrpc
from inferd.protocols.v2.shm_grpc import SharedMemoryGrpc
from inferd.security.access import Access

log = logging.getLogger("inferd.grpc")

SERVICE = "inference.GRPCInferenceService"
# Each RPC's access class. Changes to the server (trace and log settings name files it writes)
# are admin; shared-memory registration is part of inference, as in Triton.
ACCESS: dict[str, Access] = {
    **{
        m.name: Access.INFERENCE
        for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    },
    **{m: Access.HEALTH for m in ("ServerLive", "ServerReady")},
    **{
        m: Access.ADMIN
        for m in ("RepositoryModelLoad", "RepositoryModelUnload", "TraceSetting", "LogSettings")
    },
}


# Requests of one stream that may run at once; reading the stream waits beyond that.
STREAM_MAX_IN_FLIGHT = 256
_HEALTH_WATCH_INTERVAL_S = 1.0


class V2Grpc:
    """The GRPCInferenceService handlers."""

    def __init__(
        self,
        plane: DataPlane,
        observer: RequestObserver | None = None,
        settings: SettingsGrpc | None = None,
    ) -> None:
        self.plane = plane
        self.observer = observer
        self.settings = settings

    def method_handlers(self) -> dict[str, Any]:
        """Every RPC's handler, with inferd's own (de)serializers for the infer calls."""
        unary: dict[str, Handler] = {
            "ServerLive": self.server_live,
            "ServerReady": self.server_ready,
            "ModelReady": self.model_ready,
            "ServerMetadata": self.server_metadata,
            "ModelMetadata": self.model_metadata,
            "ModelConfig": self.model_config,
            "ModelStatistics": self.model_statistics,
            "RepositoryIndex": self.repository_index,
            "RepositoryModelLoad": self.repository_model_load,
            "RepositoryModelUnload": self.repository_model_unload,
        }
        shm = SharedMemoryGrpc(self.plane.shared_memory)
        unary |= {
            "SystemSharedMemoryStatus": shm.status,
            "SystemSharedMemoryRegister": shm.register,
            "SystemSharedMemoryUnregister": shm.unregister,
            "CudaSharedMemoryStatus": shm.cuda_status,
            "CudaSharedMemoryRegister": shm.cuda_register,
            "CudaSharedMemoryUnregister": shm.cuda_unregister,
        }
        if self.settings is not None:
            unary["TraceSetting"] = self.settings.trace_setting
            unary["LogSettings"] = self.settings.log_settings
        else:
            for name in ("TraceSetting", "LogSettings"):
                unary[name] = _unimplemented(f"{name}: not offered by this server")
        service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        handlers: dict[str, Any] = {}
        for name, handler in unary.items():
            method = service.methods_by_name[name]
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                guarded(SERVICE, name, handler, self.observer),
                request_deserializer=safe_deserializer(
                    getattr(pb, method.input_type.name).FromString
                ),
                response_serializer=_serialize_message,
            )
        handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
            guarded(SERVICE, "ModelInfer", self.model_infer, self.observer),
            request_deserializer=safe_deserializer(parse_infer_request),
            response_serializer=EncodedInferResponse.serialize,
        )
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            guarded_stream(SERVICE, "ModelStreamInfer", self.model_stream_infer, self.observer),
            request_deserializer=safe_deserializer(parse_infer_request),
            response_serializer=StreamResponse.serialize,
        )
        missing = {m.name for m in service.methods} - set(handlers)
        assert not missing, f"no handler for {missing}"
        return handlers

    def service(self) -> GrpcService:
        """The GRPCInferenceService with each method's access class."""
        return GrpcService(SERVICE, self.method_handlers(), ACCESS)

    async def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.plane.live())

    async def server_ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.ready)

    async def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.plane.model_ready(request.name, request.version))

    async def server_metadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        meta = self.plane.server_metadata()
        return pb.ServerMetadataResponse(
            name=meta.name, version=meta.version, extensions=meta.extensions
        )

    async def model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        meta = await self.plane.model_metadata(_model_name(request.name), request.version)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta.name,
            versions=meta.versions,
            platform=meta.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.outputs],
        )

    async def model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        config = await self.plane.model_config(_model_name(request.name), request.version)
        response = pb.ModelConfigResponse()
        # inferd.ModelConfig lives in the default pool and the response's in ours: same wire.
        response.config.MergeFromString(config.SerializeToString())
        return response

    async def repository_index(
        self, request: pb.RepositoryIndexRequest
    ) -> pb.RepositoryIndexResponse:
        entry = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(
            models=[
                entry(name=e.name, version=e.version, state=e.state, reason=e.reason)
                for e in await self.plane.index(request.ready)
            ]
        )

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        config: str | None = None
        files: dict[str, bytes] = {}
        for key, param in request.parameters.items():
            choice = param.WhichOneof("parameter_choice")
            if key == "config":
                if choice != "string_param":
                    raise InvalidInput("parameter 'config' must be a string (the config JSON)")
                config = param.string_param
            elif key.startswith("file:"):
                if choice != "bytes_param":
                    raise InvalidInput(f"parameter '{key}' must carry bytes")
                files[key[len("file:") :]] = param.bytes_param
        await self.plane.load_model(_model_name(request.model_name), config, files)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        dependents = request.parameters.get("unload_dependents")
        if dependents is not None and dependents.WhichOneof("parameter_choice") != "bool_param":
            raise InvalidInput("parameter 'unload_dependents' must be a boolean")
        unload_dependents = dependents is not None and dependents.bool_param
        await self.plane.unload_model(_model_name(request.model_name), unload_dependents)
        return pb.RepositoryModelUnloadResponse()

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        name = _model_name(request.name) if request.name else ""
        stats = await self.plane.total_statistics(name, request.version)
        return pb.ModelStatisticsResponse(model_stats=[_statistics(s) for s in stats])

    async def model_infer(self, wire: WireInferRequest) -> EncodedInferResponse:
        regions = self.plane.shared_memory
        request = decode_request(wire, regions)
        answered = self.plane.answer(request)
        response = answered if isinstance(answered, InferResponse) else await answered
        written: Collection[str] = ()
        if request.outputs is not None:
            written = shm_tensors.write_outputs(regions, response, request.outputs)
        return encode_response(response, written)

    async def model_stream_infer(
        self, requests: AsyncIterator[WireInferRequest], context: Any
    ) -> AsyncIterator[StreamResponse]:
        """Runs the stream's requests concurrently (started in arrival order), answers each:
        once, or for a decoupled model with every response it sends.

        A slot is held from a request's arrival until its last answer is handed to gRPC, so a
        client that does not read its answers stops the reading of its requests.
        """
        answers: asyncio.Queue[StreamResponse | _Done | None] = asyncio.Queue()
        slots = asyncio.Semaphore(STREAM_MAX_IN_FLIGHT)
        running: set[asyncio.Task[None]] = set()

        async def answer(wire: WireInferRequest | Malformed) -> None:
            try:
                async for response in self._stream_one(wire):
                    answers.put_nowait(response)
            finally:
                answers.put_nowait(_DONE)

        async def read() -> None:
            try:
                async for wire in requests:
                    await slots.acquire()
                    task = asyncio.create_task(answer(wire))
                    running.add(task)
                    task.add_done_callback(running.discard)
                if running:
                    await asyncio.wait(list(running))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await answers.get()) is not None:
                if isinstance(item, _Done):
                    slots.release()
                else:
                    yield item
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _stream_one(
        self, wire: WireInferRequest | Malformed
    ) -> AsyncIterator[StreamResponse]:
        if isinstance(wire, Malformed):
            yield StreamResponse(EncodedInferResponse(pb.ModelInferResponse()), wire.reason)
            return
        try:
            regions = self.plane.shared_memory
            request = decode_request(wire, regions)
            empty_final = request.parameters.get("triton_enable_empty_final_response") is True
            async for response in self.plane.infer_stream(request):
                final = response.parameters.pop("triton_final_response", None)
                if final is not None and not response.outputs and not empty_final:
                    continue  # a decoupled model's bare final flag
                if final is not None and empty_final:
                    response.parameters["triton_final_response"] = final
                written: Collection[str] = ()
                if request.outputs is not None:
                    written = shm_tensors.write_outputs(regions, response, request.outputs)
                yield StreamResponse(encode_response(response, written))
        except InferdError as exc:
            yield StreamResponse(error_header(wire), public_message(exc, "ModelStreamInfer"))
        except Exception:
            log.exception("unhandled error in ModelStreamInfer")
            yield StreamResponse(error_header(wire), "internal error; the server log has more")


class _Done:
    """Marks the end of one request's answers in a stream."""


_DONE = _Done()


def _duration(value: StatDuration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=value.count, ns=value.ns)


def _statistics(stats: ModelStatistics) -> pb.ModelStatistics:
    infer = stats.inference_stats
    return pb.ModelStatistics(
        name=stats.name,
        version=stats.version,
        last_inference=stats.last_inference,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(infer.success),
            fail=_duration(infer.fail),
            queue=_duration(infer.queue),
            compute_input=_duration(infer.compute_input),
            compute_infer=_duration(infer.compute_infer),
            compute_output=_duration(infer.compute_output),
            cache_hit=_duration(infer.cache_hit),
            cache_miss=_duration(infer.cache_miss),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b.batch_size,
                compute_input=_duration(b.compute_input),
                compute_infer=_duration(b.compute_infer),
                compute_output=_duration(b.compute_output),
            )
            for b in stats.batch_stats
        ],
    )


def _model_name(name: str) -> str:
    if not name:
        raise InvalidInput("'name' (the model name) is missing")
    return name


def _unimplemented(message: str) -> Handler:
    async def handler(request: Any) -> Any:
        raise Unimplemented(message)

    return handler


def _serialize_message(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


class Health:
    """``grpc.health.v1.Health``: the server ("" or the inference service), or one model."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def status(self, service: str) -> int | None:
        """The serving status of a service name; None when the name is unknown."""
        serving: int = health_pb2.HealthCheckResponse.SERVING
        not_serving: int = health_pb2.HealthCheckResponse.NOT_SERVING
        if service in ("", SERVICE):
            return serving if self.plane.ready else not_serving
        try:
            return serving if self.plane.model_ready(service) else not_serving
        except NotFound:
            return None

    async def Check(self, request: Any, context: Any) -> Any:  # gRPC's method name
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        last: int | None = -1
        while True:
            status = self.status(request.service)
            if status is None:
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(_HEALTH_WATCH_INTERVAL_S)


HEALTH_ACCESS = {"Check": Access.HEALTH, "Watch": Access.HEALTH}


def health_service(plane: DataPlane) -> GrpcService:
    """``grpc.health.v1.Health`` over ``plane``, its calls of the health class."""
    _add_to_pool(health_pb2.DESCRIPTOR)  # reflection reads our pool
    servicer = Health(plane)
    request = health_pb2.HealthCheckRequest.FromString
    reply = health_pb2.HealthCheckResponse.SerializeToString
    name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
    handlers = {
        "Check": grpc.unary_unary_rpc_method_handler(
            servicer.Check, request_deserializer=request, response_serializer=reply
        ),
        "Watch": grpc.unary_stream_rpc_method_handler(
            servicer.Watch, request_deserializer=request, response_serializer=reply
        ),
    }
    return GrpcService(name, handlers, HEALTH_ACCESS)


def _add_to_pool(file_descriptor: Any) -> None:
    try:
        POOL.FindFileByName(file_descriptor.name)
    except KeyError:
        POOL.AddSerializedFile(file_descriptor.serialized_pb)
