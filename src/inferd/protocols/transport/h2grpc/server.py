"""The native gRPC server: gRPC over libnghttp2 on the asyncio loop, behind grpc.aio's Server API.

It hosts the same handlers grpcio would (``grpc.RpcMethodHandler`` objects, registered or through
generic handlers, with ``grpc.aio.ServerInterceptor``s), so the KServe and TF Serving servicers,
health and reflection plug in unchanged. Why it exists, measured: a grpc.aio call costs more CPU
than inferd's whole HTTP request path; here a call costs about what an HTTP request does, since
HTTP/2 framing, HPACK and flow control run in nghttp2's C code and the rest is one protocol
callback and one write per call, with a task only for calls that wait (eager.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import dataclasses
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from inferd.core.errors import ConfigError
from inferd.protocols.transport.h2grpc import nghttp2
from inferd.protocols.transport.h2grpc.calls import Context, Stream
from inferd.protocols.transport.h2grpc.connection import Connection
from inferd.protocols.transport.h2grpc.host import Budget, Limits

TRIM_AFTER_BYTES = 4 * 1024 * 1024  # a connection that received this much is trimmed after


class _CallDetails(grpc.HandlerCallDetails):  # type: ignore[misc]
    def __init__(self, method: str, invocation_metadata: Any) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


def available() -> bool:
    """Whether libnghttp2 can be loaded (else grpcio serves gRPC)."""
    return nghttp2.load() is not None


class NativeGrpcServer(grpc.aio.Server):  # type: ignore[misc]
    def __init__(
        self,
        *,
        max_message_bytes: int | None = None,
        interceptors: Sequence[Any] = (),
        max_concurrent_rpcs: int | None = None,
        reuse_port: bool = False,
        limits: Limits | None = None,
    ) -> None:
        """``limits``: every limit and timeout of the connections (``host.Limits``);
        ``max_message_bytes``, when given, replaces its largest message."""
        lib = nghttp2.load()
        if lib is None:
            raise ConfigError("the native gRPC server needs libnghttp2 (Debian: libnghttp2-14)")
        self.lib = lib
        limits = limits or Limits()
        if max_message_bytes is not None:
            limits = dataclasses.replace(limits, max_message_bytes=max_message_bytes)
        self.limits = limits
        self.max_message_bytes = limits.max_message_bytes
        self.budget = Budget(limits.max_buffered_bytes)
        self.clock = 0.0
        self._sweeping: asyncio.TimerHandle | None = None
        self._trim = False
        self.reuse_port = reuse_port
        self.interceptors = list(interceptors)
        checks = [c for i in self.interceptors if callable(c := getattr(i, "refusal", None))]
        self.refusal: Callable[[str, str | None], tuple[Any, str] | None] | None = (
            _first_refusal(checks) if checks else None
        )
        # Calls in progress on every connection; past the limit a call is refused at once
        # (RESOURCE_EXHAUSTED, as grpcio's maximum_concurrent_rpcs answers).
        self.max_concurrent_rpcs = max_concurrent_rpcs or 0
        self.active_calls = 0
        self.connections: set[Connection] = set()
        self._methods: dict[str, Any] = {}
        self._intercepts: dict[str, bool] = {}  # registered method -> any interceptor runs
        self._generic: list[Any] = []
        self._sockets: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self._servers: list[asyncio.AbstractServer] = []
        self._stopped: asyncio.Event | None = None

    # ------------------------------------------------------------------ handlers

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Sequence[Any]) -> None:
        self._generic.extend(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: Any) -> None:
        for method, handler in method_handlers.items():
            self._methods[f"/{service_name}/{method}"] = handler

    def handler_for(self, path: str, stream: Stream) -> Any:
        handler = self._methods.get(path)
        if handler is not None or not self._generic:
            return handler
        details = _CallDetails(path, ())
        for generic in self._generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None

    def intercepts(self, path: str) -> bool:
        """Whether the interceptors must see a call to ``path``. An interceptor with a
        ``passes(method)`` that answers True for it would only call its continuation."""
        found = self._intercepts.get(path)
        if found is None:
            found = any(
                not (callable(passes := getattr(i, "passes", None)) and passes(path))
                for i in self.interceptors
            )
            if path in self._methods:  # a bounded set, unlike the paths clients send
                self._intercepts[path] = found
        return found

    async def intercepted(self, handler: Any, stream: Stream, context: Context) -> Any:
        """The handler after the interceptors had their say (None: no such method)."""
        if not self.interceptors:
            return handler
        details = _CallDetails(stream.path, context.invocation_metadata())

        async def terminal(_: Any) -> Any:
            return handler

        continuation = terminal
        for interceptor in reversed(self.interceptors):
            continuation = _chain(interceptor, continuation)
        return await continuation(details)

    # ------------------------------------------------------------------ ports

    def add_insecure_port(self, address: str) -> int:
        return self._bind(address, None)

    def add_secure_port(self, address: str, server_credentials: Any) -> int:
        if isinstance(server_credentials, ssl.SSLContext):
            return self._bind(address, server_credentials)
        raise ConfigError(
            "the native gRPC server takes TLS as an ssl.SSLContext (add_secure_port(address, "
            "context)); grpc.ssl_server_credentials objects are for grpcio"
        )

    def _bind(self, address: str, context: ssl.SSLContext | None) -> int:
        host, _, port_text = address.rpartition(":")
        host = host.strip("[]")
        try:
            port = int(port_text)
        except ValueError:
            raise ConfigError(f"cannot serve gRPC on {address}: not HOST:PORT") from None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.reuse_port:  # the workers of one server share the port
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host or "0.0.0.0", port))
            sock.listen(2048)
        except OSError as exc:
            sock.close()
            raise RuntimeError(f"Failed to bind to address {address}: {exc.strerror}") from None
        sock.setblocking(False)
        if context is not None:
            context.set_alpn_protocols(["h2"])
        self._sockets.append((sock, context))
        bound: int = sock.getsockname()[1]
        return bound

    # ------------------------------------------------------------------ connections

    def opened(self, connection: asyncio.Protocol) -> None:
        assert isinstance(connection, Connection)
        self.connections.add(connection)
        if self._sweeping is None:
            loop = asyncio.get_running_loop()
            self.clock = loop.time()
            self._sweeping = loop.call_later(self.limits.sweep_s(), self._sweep)

    def closed(self, connection: asyncio.Protocol) -> None:
        assert isinstance(connection, Connection)
        self.connections.discard(connection)
        if connection.received >= TRIM_AFTER_BYTES:
            self._trim = True  # at the next sweep: what it held goes back to the system

    def _sweep(self) -> None:
        """Every connection's timeouts, checked by one timer for them all."""
        loop = asyncio.get_running_loop()
        self.clock = now = loop.time()
        for connection in list(self.connections):
            connection.sweep(now)
        if self._trim:
            self._trim = False
            release_freed_memory()
        self._sweeping = (
            loop.call_later(self.limits.sweep_s(), self._sweep) if self.connections else None
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.clock = loop.time()
        self._stopped = asyncio.Event()
        for sock, context in self._sockets:
            server = await loop.create_server(lambda: Connection(self), sock=sock, ssl=context)
            self._servers.append(server)

    async def stop(self, grace: float | None) -> None:
        """Stop accepting; calls in flight get ``grace`` seconds to finish, then are cancelled."""
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.goaway()
        if grace:
            deadline = asyncio.get_running_loop().time() + grace
            while self._busy() and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
        for connection in list(self.connections):
            for stream in list(connection.streams.values()):
                if stream.call is not None and not stream.call.done():
                    stream.call.cancel()
            if connection.transport is not None:
                connection.transport.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None
        if self._stopped is not None:
            self._stopped.set()

    def _busy(self) -> bool:
        return any(
            s.call is not None and not s.call.done()
            for c in self.connections
            for s in c.streams.values()
        )

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        if self._stopped is None:
            return True
        try:
            await asyncio.wait_for(self._stopped.wait(), timeout)
        except TimeoutError:
            return False
        return True


def release_freed_memory() -> None:
    """Hand the memory freed by closed connections back to the system: glibc keeps freed
    blocks in its heaps (a hostile connection's buffers would stay in the RSS)."""
    if _libc is not None:
        _libc.malloc_trim(0)


def _load_libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):  # not glibc
        return None
    return libc


_libc = _load_libc()


def _first_refusal(
    checks: list[Callable[[str, str | None], tuple[Any, str] | None]],
) -> Callable[[str, str | None], tuple[Any, str] | None]:
    def refusal(path: str, authorization: str | None) -> tuple[Any, str] | None:
        for check in checks:
            refused = check(path, authorization)
            if refused is not None:
                return refused
        return None

    return checks[0] if len(checks) == 1 else refusal


def _chain(interceptor: Any, continuation: Any) -> Any:
    async def call(details: Any) -> Any:
        return await interceptor.intercept_service(continuation, details)

    return call
