"""KServe v2 gRPC control-plane calls of the bench: ModelMetadata, ModelConfig, ModelStatistics.

Uses inferd's generated stubs on a blocking channel; kept apart so that an HTTP run never
imports grpc in the parent process.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format

from inferd.bench.options import BenchError, Target
from inferd.bench.specs import ModelSpec, StatsSnapshot, TensorSpec, snapshot_from_doc
from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols import grpc_service_pb2_grpc as pb_grpc

_TIMEOUT_S = 10.0


class GrpcServerClient:
    def __init__(self, target: Target, model: str, version: str) -> None:
        self.target, self.model, self.version = target, model, version
        self.channel = grpc.insecure_channel(f"{target.host}:{target.port}")
        self.stub: Any = pb_grpc.GRPCInferenceServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def model_spec(self) -> ModelSpec:
        try:
            meta = self.stub.ModelMetadata(
                pb.ModelMetadataRequest(name=self.model, version=self.version),
                timeout=_TIMEOUT_S,
            )
        except grpc.RpcError as exc:
            raise BenchError(self._describe(exc, "ModelMetadata")) from None
        inputs = tuple(TensorSpec(i.name, i.datatype, tuple(i.shape)) for i in meta.inputs)
        try:
            config = self.stub.ModelConfig(
                pb.ModelConfigRequest(name=self.model, version=self.version), timeout=_TIMEOUT_S
            )
            max_batch: int | None = int(config.config.max_batch_size)
        except grpc.RpcError:
            max_batch = None
        return ModelSpec(self.model, self.version, inputs, max_batch)

    def stats(self) -> StatsSnapshot | None:
        try:
            response = self.stub.ModelStatistics(
                pb.ModelStatisticsRequest(name=self.model, version=self.version),
                timeout=_TIMEOUT_S,
            )
        except grpc.RpcError:
            return None  # UNIMPLEMENTED (no statistics extension) or the server went away
        doc = json_format.MessageToDict(response, preserving_proto_field_name=True)
        return snapshot_from_doc(doc, self.version)

    def close(self) -> None:
        self.channel.close()

    def _describe(self, exc: grpc.RpcError, call: str) -> str:
        code: grpc.StatusCode = exc.code()
        details: str = exc.details() or ""
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and (
            "connect" in details.lower() or code is grpc.StatusCode.DEADLINE_EXCEEDED
        ):
            return f"cannot reach gRPC server {self.target.address}: {details.splitlines()[0]}"
        first = details.splitlines()[0] if details else "no details"
        return f"model '{self.model}' at {self.target.address}: {call}: {code.name}: {first}"
