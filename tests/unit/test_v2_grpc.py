"""gRPC adapter tables: every error code has a status, every RPC of the service a handler."""

from __future__ import annotations

import grpc
import orjson
from google.protobuf import json_format

from inferd.core.errors import ErrorCode
from inferd.core.stats import ModelStats
from inferd.plane.dataplane import DataPlane
from inferd.plane.registry import Registry
from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols.grpc_common import STATUS_OF
from inferd.protocols.v2.grpc import V2Grpc, _statistics
from inferd.security.grpc_auth import REFUSAL_STATUS


def test_every_error_code_has_a_status() -> None:
    assert set(STATUS_OF) == set(ErrorCode)
    assert STATUS_OF[ErrorCode.NOT_FOUND] is grpc.StatusCode.NOT_FOUND
    assert STATUS_OF[ErrorCode.PAYLOAD_TOO_LARGE] is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_interceptors_refusals_answer_the_servicers_statuses() -> None:
    """The access interceptor (below the protocols) keeps the statuses of its two refusals;
    they are those every servicer answers for the same codes."""
    assert set(REFUSAL_STATUS) == {ErrorCode.UNAUTHENTICATED, ErrorCode.PERMISSION_DENIED}
    for code, status in REFUSAL_STATUS.items():
        assert STATUS_OF[code] is status


def test_every_rpc_has_a_handler() -> None:
    handlers = V2Grpc(DataPlane(Registry())).method_handlers()
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert set(handlers) == {m.name for m in service.methods}
    assert len(handlers) == 20
    assert handlers["ModelStreamInfer"].request_streaming
    assert handlers["ModelStreamInfer"].response_streaming
    assert not handlers["ModelInfer"].request_streaming


def test_statistics_message_matches_the_http_json() -> None:
    """gRPC builds ModelStatistics from the same view HTTP writes as JSON: one document."""
    stats = ModelStats()
    stats.success.add(1_000)
    stats.record_execution(4, 2, 10, 20, 30)
    view = stats.snapshot("m", "3")
    message = _statistics(view)
    from_json = json_format.ParseDict(orjson.loads(orjson.dumps(view)), pb.ModelStatistics())
    assert message == from_json
    assert message.batch_stats[0].compute_infer.ns == 20
    assert message.inference_stats.compute_output.count == 2
