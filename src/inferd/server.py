"""Builds the server from Settings: repository, registry, data plane and frontends, on one loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from dataclasses import replace
from typing import Any

from granian.constants import Interfaces
from granian.server.embed import Server as GranianServer
from prometheus_client import start_http_server

from inferd import security
from inferd.dataplane import DataPlane
from inferd.drain import Drain
from inferd.errors import ConfigError
from inferd.observability.log_settings import LogSettings
from inferd.observability.logging import Logs
from inferd.observability.metrics import EndpointStats, build_registry
from inferd.observability.requests import RequestObserver
from inferd.observability.trace_settings import TraceSettings
from inferd.observability.tracing import Tracer
from inferd.protocols.admin_http import AdminHttp
from inferd.protocols.dashboard_http import Dashboard
from inferd.protocols.generate_http import GenerateHttp
from inferd.protocols.h2grpc.server import NativeGrpcServer
from inferd.protocols.http import HttpApp, Router
from inferd.protocols.openapi import OpenApi
from inferd.protocols.repository_http import RepositoryHttp
from inferd.protocols.settings_grpc import SettingsGrpc
from inferd.protocols.settings_http import SettingsHttp
from inferd.protocols.shm_http import SharedMemoryHttp
from inferd.protocols.tfserving_http import TfServingHttp
from inferd.protocols.v2_grpc import build_server
from inferd.protocols.v2_http import V2Http
from inferd.registry import Registry
from inferd.repository.control import RepositoryControl
from inferd.repository.manager import ControlMode, ModelManager
from inferd.repository.poller import Poller
from inferd.scheduling.cache import ResponseCache
from inferd.settings import Settings
from inferd.workers.control import SharedControl
from inferd.workers.node import WorkerNode, merged_registry
from inferd.workers.peers import Peers, WorkerRole
from inferd.workers.sizing import worker_count
from inferd.workers.supervisor import Supervisor

log = logging.getLogger("inferd.server")

GRPC_STOP_GRACE_S = 5.0  # in-flight gRPC calls get this long to finish at shutdown


class Server:
    def __init__(
        self, settings: Settings, logs: Logs | None = None, worker: WorkerRole | None = None
    ) -> None:
        if not settings.model_repository:
            raise ConfigError("--model-repository is required (or INFERD_MODEL_REPOSITORY)")
        self.settings = settings
        self.worker = worker  # one of several processes on the port (--http-workers)
        self.registry = Registry()
        cache = ResponseCache(settings.cache_size) if settings.cache_size > 0 else None
        self.tokens = security.token_store(settings)
        self.manager = ModelManager.from_settings(
            settings, self.registry, cache, security.code_policy(settings, self.tokens)
        )
        peers = Peers(worker) if worker is not None else None
        control = (
            SharedControl(self.manager, self.registry, peers, settings.max_upload_bytes)
            if peers is not None
            else RepositoryControl(self.manager, settings.max_upload_bytes)
        )
        self.plane = DataPlane(self.registry, settings.server_name, control)
        if settings.strict_readiness:
            self.plane.models_ready = self.manager.ready
        # Models in worker processes (Python models) call other models through the data plane.
        lifecycle = self.manager.lifecycle
        lifecycle.options = replace(lifecycle.options, call_model=self.plane.infer)
        self.logs = logs or logs_from(settings)
        self.endpoints = EndpointStats()
        self.metrics = build_registry(self.registry, self.endpoints, self.manager.status)
        self.node: WorkerNode | None = None
        if peers is not None and isinstance(control, SharedControl):
            self.node = WorkerNode(peers, control, self.plane, self.metrics)
            control.share_regions(self.plane.shared_memory)
            self.plane.total_statistics = self.node.statistics
        self.tracer = (
            Tracer(settings.trace_exporter, settings.trace_endpoint, settings.server_name)
            if settings.trace_exporter
            else None
        )
        self.poller: Poller[Any] | None = None
        self.drain: Drain | None = None  # set by run(): SIGTERM drains, SIGINT stops at once
        # Triton's trace and log settings APIs change these at run time.
        self.trace_settings = TraceSettings(self.tracer is not None, self.registry.record)
        self.log_settings = LogSettings(self.logs)
        if isinstance(control, SharedControl):
            control.share_settings(self.trace_settings, self.log_settings)
        self.observer = RequestObserver(
            self.endpoints, self.logs, self.tracer, settings.node_name, self.trace_settings
        )
        router = Router()
        V2Http(self.plane).register(router)
        TfServingHttp(self.plane).register(router)
        RepositoryHttp(
            self.plane, settings.max_upload_bytes, settings.max_concurrent_uploads
        ).register(router)
        AdminHttp(
            self.metrics if settings.allow_metrics else None,
            self.logs,
            self.node.metrics_text if self.node is not None else None,
        ).register(router)
        SettingsHttp(self.trace_settings, self.log_settings).register(router)
        SharedMemoryHttp(self.plane.shared_memory).register(router)
        GenerateHttp(self.plane).register(router)
        OpenApi(settings.allow_dashboard, not settings.dashboard_port).register(router)
        self.granian_options = security.granian_options(settings)
        self.grpc_tls = security.grpc_tls(settings)
        self.dashboard = (
            Dashboard(
                settings,
                self.plane,
                self.manager,
                access_log=self.logs.access_enabled,
                tracing=self.tracer is not None,
            )
            if settings.allow_dashboard
            else None
        )
        if self.dashboard is not None:
            self.dashboard.register(router)
            if self.node is not None:
                self.node.series = self.dashboard.series
                self.dashboard.traffic_totals = self.node.traffic
        self.http_app = HttpApp(
            router,
            observer=self.observer,
            guard=security.http_guard(
                settings, security.access_policy(settings, self.tokens, settings.http_address)
            ),
            limits=security.http_limits(settings, worker.count if worker else 1),
        )

    async def _load_models(self) -> None:
        try:
            await self.manager.start(self.settings.load_model)
            if self.node is not None:
                await self.node.control.replay()
        finally:
            self.plane.started = True
            ready = [r.name for r in self.registry.records() if r.versions]
            log.info("server ready; models ready: %s", ", ".join(ready) or "none")
        if self.manager.mode is ControlMode.POLL:
            self.poller = Poller(
                self.manager.scan, self.manager.apply, self.manager.poll_interval_s
            )
            self.poller.start()

    async def run(self) -> None:
        http = GranianServer(
            self.http_app,
            address=self.settings.http_address,
            port=self.settings.http_port,
            interface=Interfaces.RSGI,
            runtime_threads=1,
            backlog=2048,
            log_enabled=False,
            **self.granian_options,
        )
        loop = asyncio.get_running_loop()
        self.drain = Drain(self.plane, self.registry, self.settings.drain_timeout_s, http.stop)
        loop.add_signal_handler(signal.SIGINT, http.stop)
        loop.add_signal_handler(signal.SIGTERM, self.drain.begin)
        address = f"{self.settings.http_address}:{self.settings.http_port}"
        bound = False
        scheme = "HTTPS" if "ssl_cert" in self.granian_options else "HTTP"

        def listening() -> None:  # granian calls this once its socket is bound
            nonlocal bound
            bound = True
            log.info("listening: %s (KServe v2, TF Serving REST) on %s", scheme, address)

        http.on_startup(listening)
        # A worker other than the first, or a replacement, takes connections once it can serve.
        late = self.worker is not None and (self.worker.index > 0 or self.worker.restarted)
        if self.node is not None:
            await self.node.start()
            if late:
                await self._load_models()
        security.warn_if_open(self.settings, self.tokens)
        grpc_server = await self._start_grpc()
        if self.settings.allow_metrics and self.settings.metrics_port:
            start_http_server(
                self.settings.metrics_port,
                self.settings.http_address,
                registry=self.metrics
                if self.node is None
                else merged_registry(self.node, asyncio.get_running_loop()),
            )
            log.info(
                "metrics on %s:%d/metrics", self.settings.http_address, self.settings.metrics_port
            )
        if self.dashboard is not None:
            await self.dashboard.start(self.http_app, self.observer, self.granian_options)
        loader = asyncio.create_task(asyncio.sleep(0) if late else self._load_models())
        try:
            try:
                await http.serve()
            except (OSError, RuntimeError) as exc:
                if bound:
                    raise
                raise ConfigError(f"cannot serve HTTP on {address}: {exc}") from None
        finally:
            self.plane.started = False
            loader.cancel()
            if self.poller is not None:
                await self.poller.stop()
            if grpc_server is not None:
                await grpc_server.stop(grace=GRPC_STOP_GRACE_S)
            if self.dashboard is not None:
                await self.dashboard.stop()
            await self.manager.close()
            self.plane.shared_memory.close()
            if self.tracer is not None:
                self.tracer.close()
            if self.node is not None:
                await self.node.close()
            log.info("server stopped")

    async def _start_grpc(self) -> Any:
        """The gRPC server, bound and started; None with --allow-grpc=false."""
        if not self.settings.allow_grpc:
            return None
        address = f"{self.settings.grpc_address}:{self.settings.grpc_port}"
        policy = security.access_policy(self.settings, self.tokens, self.settings.grpc_address)
        server = build_server(
            self.plane,
            address,
            self.settings.grpc_max_message_bytes,
            tls=self.grpc_tls,
            observer=self.observer,
            kind=self.settings.grpc_server,
            access=policy,
            max_concurrent_rpcs=security.inflight_share(
                self.settings, self.worker.count if self.worker else 1
            )
            or None,
            tfserving_tensor_content=self.settings.tfserving_tensor_content,
            reuse_port=self.worker is not None,
            settings=SettingsGrpc(self.trace_settings, self.log_settings),
            limits=security.grpc_limits(self.settings),
        )
        await server.start()
        log.info(
            "listening: gRPC (KServe v2 / Triton, TF Serving)%s on %s (%s server)",
            " over TLS" if self.grpc_tls else "",
            address,
            "native" if isinstance(server, NativeGrpcServer) else "grpcio",
        )
        return server


def set_gil_switch_interval(interval_us: int) -> None:
    """The event loop and the instance threads hand the GIL to each other on every batch: with
    Python's 5 ms switch interval a thread whose model call returned may wait that long behind a
    loop busy decoding (batched digits at c=64: +40 % req/s at 500 us). 0 keeps Python's."""
    if interval_us > 0:
        sys.setswitchinterval(interval_us * 1e-6)


def set_gc_threshold(threshold: int) -> None:
    """Python's young generation is collected every 700 net container allocations: with 64
    requests in flight (a dynamic batcher filling) that is several collections per batch, each
    traversing the requests' live objects and promoting them to older generations that are
    traversed again (batched 4 KiB binary requests at c=64: 298,000 CPU instructions per
    request on the event loop at 700, 268,000 at 5,000). Reference counting still frees what
    a request leaves behind; the collector runs for cycles only. 0 keeps Python's."""
    if threshold > 0:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(threshold, older, oldest)


def run(settings: Settings, worker: WorkerRole | None = None) -> None:
    """Serve until stopped: one process, or (``--http-workers``) a supervisor of several."""
    if worker is None:
        count, why = worker_count(settings)
        if count > 1:
            if not settings.model_repository:
                raise ConfigError("--model-repository is required (or INFERD_MODEL_REPOSITORY)")
            Logs(verbose=settings.log_verbose, log_format=settings.log_format)
            log.info("%d HTTP workers (%s)", count, why)
            if Supervisor(settings, count).run() != 0:
                raise ConfigError("a worker could not start (its error is above)")
            return
    # OpenMP worker threads (PyTorch, XGBoost, LightGBM) spin while waiting by default, which
    # steals the CPU the event loop needs to decode the next request; a user's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    set_gil_switch_interval(settings.gil_switch_interval_us)
    set_gc_threshold(settings.gc_threshold)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(Server(settings, worker=worker).run())
    else:
        uvloop.run(Server(settings, worker=worker).run())


def logs_from(settings: Settings) -> Logs:
    return Logs(
        verbose=settings.log_verbose,
        log_format=settings.log_format,
        log_file=settings.log_file,
        access_log=settings.access_log,
        access_log_file=settings.access_log_file,
        max_bytes=settings.log_max_bytes,
        backup_count=settings.log_backup_count,
    )
