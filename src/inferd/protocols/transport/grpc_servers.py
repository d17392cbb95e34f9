"""The two gRPC servers behind one function: the native one (HTTP/2 in libnghttp2, calls on our
loop) and grpcio's, with the same limits given to each (grpcio: those its core has, as channel
arguments)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import grpc

from inferd.core.errors import ConfigError
from inferd.protocols.transport.h2grpc.host import Limits
from inferd.protocols.transport.h2grpc.server import NativeGrpcServer
from inferd.protocols.transport.h2grpc.server import available as native_available
from inferd.security.tls import Tls

GRPC_SERVERS = ("auto", "native", "grpcio")


def new_server(
    kind: str,
    max_message_bytes: int,
    interceptors: Sequence[Any] = (),
    max_concurrent_rpcs: int | None = None,
    reuse_port: bool = False,
    limits: Limits | None = None,
) -> Any:
    """An empty gRPC server: ``native`` (HTTP/2 in libnghttp2, calls on our loop; the fast one),
    ``grpcio``, or ``auto`` (native when libnghttp2 loads, else grpcio). Both run
    ``interceptors`` on every call and answer RESOURCE_EXHAUSTED at once beyond
    ``max_concurrent_rpcs`` calls in progress, and both enforce ``limits`` (grpcio: those its
    core has, as channel arguments). ``reuse_port``: the port is shared with the other workers
    of the server (SO_REUSEPORT)."""
    if kind not in GRPC_SERVERS:
        raise ConfigError(f"--grpc-server must be one of {', '.join(GRPC_SERVERS)}, not '{kind}'")
    limits = dataclasses.replace(limits or Limits(), max_message_bytes=max_message_bytes)
    if kind == "native" or (kind == "auto" and native_available()):
        return NativeGrpcServer(
            interceptors=interceptors,
            max_concurrent_rpcs=max_concurrent_rpcs,
            reuse_port=reuse_port,
            limits=limits,
        )
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # A port in use is an error, not a silently shared port, unless workers share it.
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        *grpcio_options(limits),
    ]
    return grpc.aio.server(
        options=options,
        interceptors=list(interceptors) or None,
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )


def grpcio_options(limits: Limits) -> list[tuple[str, int]]:
    """The limits grpc's core has, as its channel arguments."""

    def ms(seconds: float) -> int:
        return min(int(seconds * 1000), 2**31 - 1)

    return [
        ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        ("grpc.max_metadata_size", limits.max_header_list_bytes),
        ("grpc.absolute_max_metadata_size", limits.max_header_list_bytes),
        ("grpc.server_handshake_timeout_ms", ms(limits.header_timeout_s)),
        ("grpc.max_connection_idle_ms", ms(limits.idle_timeout_s)),
        ("grpc.keepalive_time_ms", ms(limits.keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", ms(limits.keepalive_timeout_s)),
        ("grpc.keepalive_permit_without_calls", int(limits.keepalive_permit_without_calls)),
        ("grpc.http2.min_ping_interval_without_data_ms", ms(limits.min_ping_interval_s)),
        ("grpc.http2.max_ping_strikes", limits.max_ping_strikes),
    ]


def bind(server: Any, address: str, tls: Tls | None, what: str) -> None:
    """Add ``address`` to either kind of server, over TLS when given; a ConfigError naming
    ``what`` when it cannot be bound."""
    try:
        if tls is None:
            server.add_insecure_port(address)
        elif isinstance(server, NativeGrpcServer):
            server.add_secure_port(address, tls.ssl_context())
        else:
            server.add_secure_port(address, tls.grpc_credentials())
    except RuntimeError as exc:
        raise ConfigError(f"cannot serve {what} on {address}: {exc}") from None
