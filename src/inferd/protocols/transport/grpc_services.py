"""A gRPC service as every API hands it to the server: its full name, each method's handler and
each method's access class, and the one function that serves a list of them on a port.

The access class of a method is declared beside its handler (as an HTTP route's is, by
``Router.add(..., access=...)``): a method without one is refused when the service is built,
so a new service cannot reach a port unchecked. The server's interceptor reads the classes
from the services it serves (``access_table``); security keeps no list of service names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpc_reflection.v1alpha import reflection, reflection_pb2

from inferd.protocols.pool import POOL
from inferd.protocols.transport.grpc_servers import bind, new_server
from inferd.protocols.transport.h2grpc.host import Limits
from inferd.security.access import Access, AccessPolicy
from inferd.security.grpc_auth import AuthInterceptor
from inferd.security.tls import Tls

REFLECTION_ACCESS = {"ServerReflectionInfo": Access.INFERENCE}


@dataclass(frozen=True, slots=True)
class GrpcService:
    """One gRPC service: ``name`` (``package.Service``), ``handlers`` (method name ->
    ``grpc.RpcMethodHandler``) and ``access`` (method name -> its access class), which must
    name every method of ``handlers`` and no other."""

    name: str
    handlers: Mapping[str, Any]
    access: Mapping[str, Access]

    def __post_init__(self) -> None:
        undeclared = sorted(set(self.handlers) - set(self.access))
        if undeclared:
            raise TypeError(
                f"gRPC service {self.name}: no access class declared for "
                f"{', '.join(undeclared)} (declare each method's class beside its handler)"
            )
        stray = sorted(set(self.access) - set(self.handlers))
        if stray:
            raise TypeError(
                f"gRPC service {self.name}: an access class for {', '.join(stray)}, "
                "which it does not serve"
            )


def access_table(services: Iterable[GrpcService]) -> Callable[[str], Access]:
    """``/package.Service/Method`` -> the access class its service declares. A path no service
    serves is inference: it needs a token where tokens are configured, then the server answers
    UNIMPLEMENTED."""
    table = {f"/{s.name}/{m}": access for s in services for m, access in s.access.items()}
    table |= {f"/{reflection.SERVICE_NAME}/{m}": a for m, a in REFLECTION_ACCESS.items()}

    def access_of(method: str) -> Access:
        return table.get("/" + method.lstrip("/"), Access.INFERENCE)

    return access_of


def grpc_server(
    services: Sequence[GrpcService],
    address: str,
    *,
    kind: str,
    max_message_bytes: int,
    tls: Tls | None = None,
    access: AccessPolicy | None = None,
    max_concurrent_rpcs: int | None = None,
    reuse_port: bool = False,
    limits: Limits | None = None,
    reflect: bool = True,
    what: str = "gRPC",
) -> Any:
    """A gRPC server (``new_server``'s ``kind``) serving ``services`` on ``address``, each call
    checked against ``access`` (default: open) by the class its method declares; ``reflect``:
    server reflection lists them. Not started."""
    interceptor = AuthInterceptor(access or AccessPolicy.open(), access_table(services))
    server = new_server(
        kind,
        max_message_bytes,
        [interceptor] if interceptor.active else [],
        max_concurrent_rpcs,
        reuse_port,
        limits,
    )
    # Registered (not generic) handlers: grpc core matches the method, no Python lookup per call.
    for service in services:
        server.add_registered_method_handlers(service.name, dict(service.handlers))
    if reflect:
        # Reflection reads our pool, which must then hold the reflection file too.
        try:
            POOL.FindFileByName(reflection_pb2.DESCRIPTOR.name)
        except KeyError:
            POOL.AddSerializedFile(reflection_pb2.DESCRIPTOR.serialized_pb)
        names = (*(s.name for s in services), reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, server, pool=POOL)
    bind(server, address, tls, what)
    return server
