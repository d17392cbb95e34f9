"""The network frontends of one server core: the HTTP app (KServe v2 and TF Serving REST,
repository, admin, trace and log settings, shared memory, generate, OpenAPI, dashboard), the
gRPC server, and ``--metrics-port``, started and stopped on the core's event loop.

``inferd serve`` (``inferd.app.server``) and ``inferd.Server.serve_http`` / ``serve_grpc`` both
build them here, on an ``inferd.Server``. They reach the core only through ``Core``: the data
plane every request is decoded into, and the settings, logs, metrics and observers of the
core; nothing here loads a model or touches a scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, start_http_server

from inferd.app import edge
from inferd.app.settings import Settings
from inferd.core.errors import ConfigError
from inferd.observability.log_settings import LogSettings
from inferd.observability.logging import Logs
from inferd.observability.metrics import EndpointStats
from inferd.observability.requests import RequestObserver
from inferd.observability.trace_settings import TraceSettings
from inferd.observability.tracing import Tracer
from inferd.plane.dataplane import DataPlane
from inferd.protocols import openapi
from inferd.protocols.admin_http import AdminHttp
from inferd.protocols.apis import Api, grpc_services, openapi_paths, register_routes
from inferd.protocols.dashboard_http import Dashboard, DashboardOptions, page_url
from inferd.protocols.openapi import OpenApi
from inferd.protocols.tfserving import openapi as tfserving_openapi
from inferd.protocols.tfserving.grpc import TfServingGrpc
from inferd.protocols.tfserving.http import TfServingHttp
from inferd.protocols.transport.grpc_services import grpc_server
from inferd.protocols.transport.h2grpc.server import NativeGrpcServer
from inferd.protocols.transport.http import HttpApp
from inferd.protocols.transport.http_listen import Listener, listen
from inferd.protocols.transport.http_routes import Router
from inferd.protocols.v2.generate_http import GenerateHttp
from inferd.protocols.v2.grpc import V2Grpc, health_service
from inferd.protocols.v2.http import V2Http
from inferd.protocols.v2.repository_http import RepositoryHttp
from inferd.protocols.v2.settings_grpc import SettingsGrpc
from inferd.protocols.v2.settings_http import SettingsHttp
from inferd.protocols.v2.shm_http import SharedMemoryHttp
from inferd.repository.manager import ModelManager
from inferd.security.tokens import TokenStore

log = logging.getLogger("inferd.server")

GRPC_STOP_GRACE_S = 5.0  # in-flight gRPC calls get this long to finish at shutdown


class Core(Protocol):
    """What the frontends use of a server core (``inferd.Server``)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def plane(self) -> DataPlane: ...
    @property
    def manager(self) -> ModelManager: ...  # the dashboard's repository facts and files
    @property
    def metrics(self) -> CollectorRegistry: ...
    @property
    def logs(self) -> Logs: ...
    @property
    def endpoints(self) -> EndpointStats: ...
    @property
    def tracer(self) -> Tracer | None: ...
    @property
    def trace_settings(self) -> TraceSettings: ...
    @property
    def log_settings(self) -> LogSettings: ...
    @property
    def tokens(self) -> TokenStore: ...
    @property
    def announces(self) -> bool: ...  # says "listening" (one worker of several does)


def free_port(address: str) -> int:
    """A port free on ``address`` now, for a frontend asked to listen on port 0 (its server
    binds with SO_REUSEPORT, which cannot say which port it got)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as exc:
            raise ConfigError(f"cannot listen on address '{address}': {exc}") from None
        port: int = probe.getsockname()[1]
        return port


class Frontends:
    """The HTTP app and gRPC server of one core; ``start_http`` / ``start_grpc`` listen."""

    def __init__(
        self,
        core: Core,
        *,
        metrics_text: Callable[[], Awaitable[bytes]] | None = None,
        metrics_registry: CollectorRegistry | None = None,
        workers: int = 1,
    ) -> None:
        """``metrics_text`` / ``metrics_registry``: what ``/metrics`` and ``--metrics-port``
        serve instead of the core's own figures (several workers: their totals);
        ``workers``: this is one of that many serving processes sharing the ports (each takes
        its share of the in-flight limit)."""
        settings = core.settings
        self.core = core
        self.settings = settings
        self.plane = core.plane
        self.workers = workers
        self.reuse_port = workers > 1
        self.metrics_registry = metrics_registry or core.metrics
        self.observer = RequestObserver(
            core.endpoints, core.logs, core.tracer, settings.node_name, core.trace_settings
        )
        plane = self.plane
        # GET / is KServe v1's liveness; where the dashboard's page is, it answers it (and sends
        # browsers to the page).
        page_here = settings.allow_dashboard and not settings.dashboard_port
        tfserving_http = TfServingHttp(plane)
        # Several workers: ``log_lines`` is set to theirs (``NetworkServer``).
        self.admin = AdminHttp(
            core.metrics if settings.allow_metrics else None, core.logs, metrics_text
        )
        repository = RepositoryHttp(
            plane, settings.max_upload_bytes, settings.max_concurrent_uploads
        )
        # Every API this server offers: the HTTP router and the gRPC port read this list.
        self.apis: list[Api] = [
            Api(
                "KServe v2",
                V2Http(plane).register,
                grpc=lambda: [
                    V2Grpc(
                        plane,
                        self.observer,
                        SettingsGrpc(core.trace_settings, core.log_settings),
                    ).service(),
                    health_service(plane),
                ],
                openapi=openapi.v2_paths,
            ),
            Api(
                "TF Serving",
                lambda router: tfserving_http.register(router, root=not page_here),
                grpc=lambda: TfServingGrpc(
                    plane, self.observer, settings.tfserving_tensor_content
                ).grpc_services(),
                openapi=lambda: {
                    **tfserving_openapi.tfserving_paths(),
                    **({} if page_here else tfserving_openapi.kserve_v1_live_paths()),
                },
            ),
            Api("model repository", repository.register),
            Api(
                "admin",
                self.admin.register,
                openapi=openapi.metrics_paths if settings.allow_metrics else None,
            ),
            Api(
                "trace and log settings",
                SettingsHttp(core.trace_settings, core.log_settings).register,
                openapi=openapi.settings_paths,
            ),
            Api(
                "shared memory",
                SharedMemoryHttp(plane.shared_memory).register,
                openapi=openapi.shared_memory_paths,
            ),
            Api("generate", GenerateHttp(plane).register, openapi=openapi.generate_paths),
            Api("OpenAPI", OpenApi(lambda: openapi_paths(self.apis)).register),
        ]
        self.granian_options = edge.granian_options(settings)
        self.grpc_tls = edge.grpc_tls(settings)
        http_access = edge.access_policy(settings, core.tokens, settings.http_address)
        self.dashboard = (
            Dashboard(
                DashboardOptions(
                    server_name=settings.server_name,
                    node_name=settings.node_name,
                    envoy_admin=settings.envoy_admin,
                    dashboard_port=settings.dashboard_port,
                    dashboard_trace_url=settings.dashboard_trace_url,
                    http_address=settings.http_address,
                ),
                self.plane,
                core.manager,
                access_log=core.logs.access_enabled,
                tracing=core.tracer is not None,
                access=http_access,
            )
            if settings.allow_dashboard
            else None
        )
        if self.dashboard is not None:
            self.apis.append(
                Api(
                    "dashboard",
                    self.dashboard.register,
                    openapi=lambda: openapi.dashboard_paths(page_here),
                )
            )
        router = Router()
        register_routes(self.apis, router)
        self.http_app = HttpApp(
            router,
            observer=self.observer,
            guard=edge.http_guard(settings, http_access),
            limits=edge.http_limits(settings, workers),
        )
        self._http: list[Listener] = []
        self._grpc: list[Any] = []
        self._dashboard_started = False
        self._metrics_server: Any = None

    # ------------------------------------------------------------------ HTTP

    async def start_http(self, port: int) -> int:
        """Listen on ``--http-address``:``port`` (0: a free port) and return the port; the
        first also starts the dashboard and ``--metrics-port``. A port that cannot be bound
        is a ConfigError."""
        port = port or free_port(self.settings.http_address)
        listener = await listen(
            self.http_app, self.settings.http_address, port, self.granian_options, what="HTTP"
        )
        scheme = "HTTPS" if "ssl_cert" in self.granian_options else "HTTP"
        level = logging.INFO if self.core.announces else logging.DEBUG
        log.log(level, "listening: %s (KServe v2, TF Serving REST) on %s", scheme, listener.address)
        if self.dashboard is not None and not self.settings.dashboard_port and not self._http:
            where = page_url(scheme.lower(), self.settings.http_address, port)
            log.log(level, "dashboard: %s", where)
        self._http.append(listener)
        if len(self._http) == 1:
            self._start_metrics_port()
            if self.dashboard is not None:
                await self.dashboard.start(self.http_app, self.observer, self.granian_options)
                self._dashboard_started = True
        return port

    def stop_http(self) -> None:
        """Ask every HTTP server to stop (they finish their requests); see ``http_stopped``."""
        for listener in self._http:
            listener.stop()

    async def http_stopped(self) -> None:
        """Wait until every HTTP server has stopped; an error that stopped one is raised."""
        for listener in self._http:
            await listener.task

    def _start_metrics_port(self) -> None:
        settings = self.settings
        if not (settings.allow_metrics and settings.metrics_port):
            return
        try:
            self._metrics_server, _ = start_http_server(
                settings.metrics_port, settings.http_address, registry=self.metrics_registry
            )
        except OSError as exc:
            where = f"{settings.http_address}:{settings.metrics_port}"
            raise ConfigError(f"cannot serve metrics on {where}: {exc}") from None
        log.info("metrics on %s:%d/metrics", settings.http_address, settings.metrics_port)

    # ------------------------------------------------------------------ gRPC

    async def start_grpc(self, port: int) -> int:
        """Serve gRPC (KServe v2 / Triton, TF Serving) on ``--grpc-address``:``port`` (0: a
        free port) and return the port."""
        settings = self.settings
        port = port or free_port(settings.grpc_address)
        address = f"{settings.grpc_address}:{port}"
        policy = edge.access_policy(settings, self.core.tokens, settings.grpc_address)
        server = grpc_server(
            grpc_services(self.apis),
            address,
            kind=settings.grpc_server,
            max_message_bytes=settings.grpc_max_message_bytes,
            tls=self.grpc_tls,
            access=policy,
            max_concurrent_rpcs=edge.inflight_share(settings, self.workers) or None,
            reuse_port=self.reuse_port,
            limits=edge.grpc_limits(settings),
        )
        await server.start()
        self._grpc.append(server)
        log.log(
            logging.INFO if self.core.announces else logging.DEBUG,
            "listening: gRPC (KServe v2 / Triton, TF Serving)%s on %s (%s server)",
            " over TLS" if self.grpc_tls else "",
            address,
            "native" if isinstance(server, NativeGrpcServer) else "grpcio",
        )
        return port

    # ------------------------------------------------------------------ all of them

    async def stop(self) -> None:
        """Stop every frontend: HTTP servers finish their requests, gRPC calls get
        ``GRPC_STOP_GRACE_S``."""
        self.stop_http()
        for listener in self._http:
            await listener.stopped()
        self._http.clear()
        for server in self._grpc:
            await server.stop(grace=GRPC_STOP_GRACE_S)
        self._grpc.clear()
        if self.dashboard is not None and self._dashboard_started:
            await self.dashboard.stop()
            self._dashboard_started = False
        if self._metrics_server is not None:
            metrics, self._metrics_server = self._metrics_server, None
            await asyncio.to_thread(metrics.shutdown)  # waits for its thread's next poll
            metrics.server_close()
