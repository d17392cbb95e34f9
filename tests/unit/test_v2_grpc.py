"""gRPC adapter tables: every error code has a status, every RPC of the service a handler."""

from __future__ import annotations

import grpc

from inferd.dataplane import DataPlane
from inferd.errors import ErrorCode
from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols.grpc_common import STATUS_OF
from inferd.protocols.v2_grpc import V2Grpc
from inferd.registry import Registry


def test_every_error_code_has_a_status() -> None:
    assert set(STATUS_OF) == set(ErrorCode)
    assert STATUS_OF[ErrorCode.NOT_FOUND] is grpc.StatusCode.NOT_FOUND
    assert STATUS_OF[ErrorCode.PAYLOAD_TOO_LARGE] is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_every_rpc_has_a_handler() -> None:
    handlers = V2Grpc(DataPlane(Registry())).method_handlers()
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert set(handlers) == {m.name for m in service.methods}
    assert len(handlers) == 20
    assert handlers["ModelStreamInfer"].request_streaming
    assert handlers["ModelStreamInfer"].response_streaming
    assert not handlers["ModelInfer"].request_streaming
