"""Each gRPC service declares the access class of each of its methods: a method without one is
refused when the service is built, and the port's interceptor reads the classes from the
services it serves."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from inferd.plane.dataplane import DataPlane
from inferd.plane.registry import Registry
from inferd.protocols.apis import Api, grpc_services
from inferd.protocols.tfserving.grpc import TfServingGrpc
from inferd.protocols.torchserve.grpc import TorchServeGrpc
from inferd.protocols.transport.grpc_services import GrpcService, access_table
from inferd.protocols.v2.grpc import SERVICE, V2Grpc, health_service
from inferd.security.access import Access


def _handler() -> Any:
    async def answer(request: bytes, context: Any) -> bytes:
        return request

    return grpc.unary_unary_rpc_method_handler(answer)


def test_a_method_without_an_access_class_is_refused_at_build() -> None:
    handlers = {"Get": _handler(), "Put": _handler()}
    with pytest.raises(TypeError, match=r"my\.Service: no access class declared for Put"):
        GrpcService("my.Service", handlers, {"Get": Access.INFERENCE})


def test_an_access_class_for_a_method_not_served_is_refused() -> None:
    with pytest.raises(TypeError, match="Gone, which it does not serve"):
        GrpcService("my.Service", {}, {"Gone": Access.ADMIN})


def test_a_service_offered_twice_is_refused() -> None:
    service = GrpcService("my.Service", {"Get": _handler()}, {"Get": Access.INFERENCE})
    with pytest.raises(TypeError, match=r"offered twice: my\.Service"):
        grpc_services([Api("a", grpc=lambda: [service]), Api("b", grpc=lambda: [service])])


def test_the_table_reads_each_services_declarations() -> None:
    plane = DataPlane(Registry())
    services = [
        V2Grpc(plane).service(),
        health_service(plane),
        *TfServingGrpc(plane).grpc_services(),
    ]
    access_of = access_table(services)
    assert access_of(f"/{SERVICE}/ModelInfer") is Access.INFERENCE
    assert access_of(f"/{SERVICE}/ServerLive") is Access.HEALTH
    assert access_of(f"/{SERVICE}/RepositoryModelLoad") is Access.ADMIN
    assert access_of(f"/{SERVICE}/LogSettings") is Access.ADMIN
    assert access_of(f"/{SERVICE}/SystemSharedMemoryRegister") is Access.INFERENCE
    assert access_of("/grpc.health.v1.Health/Check") is Access.HEALTH
    assert access_of("/tensorflow.serving.PredictionService/Predict") is Access.INFERENCE
    assert access_of("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") is (
        Access.INFERENCE
    )
    # A path no service serves needs an inference token; the server then answers UNIMPLEMENTED.
    assert access_of("/no.Such/Method") is Access.INFERENCE


def test_torchserve_declares_ping_health_and_management_admin() -> None:
    torchserve = TorchServeGrpc(models=None, management=None)  # type: ignore[arg-type]
    inference, management = torchserve.inference_service(), torchserve.management_service()
    access_of = access_table([inference, management])
    assert access_of(f"/{inference.name}/Ping") is Access.HEALTH
    assert access_of(f"/{inference.name}/Predictions") is Access.INFERENCE
    assert {access_of(f"/{management.name}/{m}") for m in management.handlers} == {Access.ADMIN}
