"""The APIs a server offers, each as one ``Api``: its HTTP routes and its gRPC services (each
method with its access class) and its part of the OpenAPI document. The frontends build the
list once (``inferd.app.frontends``); the HTTP router, the gRPC port, ``/v2/openapi.json`` and
the endpoint reference all read that list, so a new protocol is one more entry there."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from inferd.protocols.openapi_schemas import Schema
from inferd.protocols.transport.grpc_services import GrpcService
from inferd.protocols.transport.http_routes import Router


@dataclass(frozen=True, slots=True)
class Api:
    """One API: ``routes`` registers its HTTP routes (each with its access class) on a router;
    ``grpc`` builds its gRPC services (each method with its access class), once per port;
    ``openapi``: its HTTP routes' paths in the OpenAPI document."""

    name: str
    routes: Callable[[Router], None] | None = None
    grpc: Callable[[], Sequence[GrpcService]] | None = None
    openapi: Callable[[], dict[str, Schema]] | None = None


def register_routes(apis: Iterable[Api], router: Router) -> None:
    """Every API's HTTP routes on ``router``, in the APIs' order."""
    for api in apis:
        if api.routes is not None:
            api.routes(router)


def grpc_services(apis: Iterable[Api]) -> list[GrpcService]:
    """Every API's gRPC services, in the APIs' order; a service name twice is an error."""
    services: list[GrpcService] = []
    for api in apis:
        if api.grpc is not None:
            services += api.grpc()
    names = [s.name for s in services]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TypeError(f"gRPC services offered twice: {', '.join(twice)}")
    return services


def openapi_paths(apis: Iterable[Api]) -> list[dict[str, Schema]]:
    """Every API's part of the OpenAPI document, in the APIs' order."""
    return [api.openapi() for api in apis if api.openapi is not None]
