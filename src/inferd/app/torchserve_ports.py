"""TorchServe's four ports, started and stopped with the server: the inference and management
HTTP APIs and their gRPC services, over the same data plane and repository as inferd's own.

The HTTP ports answer every error in TorchServe's shape and route ``OPTIONS`` (TorchServe's
API description) unless it is a CORS preflight. The management ports are of the admin scope:
with no admin token they are open on loopback only (TorchServe binds its management API to
127.0.0.1), and registering needs the model API (``--enable-model-api``). At start, the
``--models`` archives are written into the repository before it loads.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from inferd.app import edge
from inferd.app.repository import storage_options
from inferd.app.settings import Settings
from inferd.core.errors import ConfigError, InferdError
from inferd.observability.requests import RequestObserver
from inferd.plane.dataplane import DataPlane
from inferd.protocols.torchserve.grpc import (
    MANAGEMENT_SERVICE,
    TorchServeGrpc,
)
from inferd.protocols.torchserve.http import TorchServeInferenceHttp, render_error
from inferd.protocols.torchserve.management_http import TorchServeManagementHttp
from inferd.protocols.transport.grpc_services import GrpcService, grpc_server
from inferd.protocols.transport.http import HttpApp
from inferd.protocols.transport.http_listen import Listener, listen
from inferd.protocols.transport.http_routes import Router
from inferd.repository.manager import ControlMode, ModelManager
from inferd.security.access import AccessPolicy, is_loopback
from inferd.security.http_guard import HttpGuard
from inferd.security.tokens import TokenStore
from inferd.torchserve import config_properties
from inferd.torchserve.management import Management
from inferd.torchserve.models import TorchServeModels
from inferd.torchserve.sources import ModelStore

log = logging.getLogger("inferd.torchserve")


def enabled(settings: Settings) -> bool:
    return settings.allow_torchserve or bool(settings.model_store) or bool(settings.ts_config)


def prepare(settings: Settings) -> tuple[Settings, Path | None]:
    """The settings TorchServe's flags imply: ``--enable-model-api`` is explicit model
    control; a model store with no repository gets a temporary one (returned, to remove)."""
    if not enabled(settings):
        return settings, None
    if settings.ts_config:
        settings = config_properties.apply(settings, settings.ts_config)
    if settings.enable_model_api:
        settings = replace(settings, model_control_mode="explicit")
    if settings.model_repository:
        return settings, None
    folder = Path(tempfile.mkdtemp(prefix="inferd-torchserve-"))
    log.info("TorchServe's registered models are kept in %s until the server stops", folder)
    return replace(settings, model_repository=[str(folder)]), folder


def parse_models(entries: list[str]) -> list[tuple[str | None, str]]:
    """``--models`` entries as (name or None, url); ``all`` stays ``(None, "all")``."""
    found: list[tuple[str | None, str]] = []
    for entry in entries:
        for item in (p for p in entry.split(",") if p):
            name, sep, url = item.partition("=")
            found.append((name, url) if sep else (None, item))
    return found


class TorchServePorts:
    def __init__(
        self,
        settings: Settings,
        plane: DataPlane,
        manager: ModelManager,
        tokens: TokenStore,
        observer: RequestObserver | None,
        granian_options: dict[str, Any],
    ) -> None:
        ports = [
            settings.torchserve_inference_port,
            settings.torchserve_management_port,
            settings.torchserve_grpc_inference_port,
            settings.torchserve_grpc_management_port,
        ]
        taken = {settings.http_port, settings.grpc_port if settings.allow_grpc else -1}
        clash = sorted({p for p in ports if p and (p in taken or ports.count(p) > 1)})
        if clash:
            raise ConfigError(
                f"TorchServe port(s) {clash} are taken by another of the server's ports: choose "
                "others with --torchserve-inference-port, --torchserve-management-port, "
                "--torchserve-grpc-inference-port, --torchserve-grpc-management-port"
            )
        self.settings = settings
        self.observer = observer
        self.granian_options = granian_options
        self.models = TorchServeModels(plane)
        self.store = ModelStore(
            Path(settings.model_store) if settings.model_store else None,
            settings.allowed_urls,
            storage_options(settings),
            settings.max_upload_bytes,
        )
        self.management = Management(
            self.models,
            manager,
            self.store,
            settings.default_workers_per_model,
            model_api=manager.mode is ControlMode.EXPLICIT,
        )
        limits = edge.http_limits(settings)
        inference = Router()
        TorchServeInferenceHttp(self.models).register(inference)
        address = settings.http_address
        self.inference_app = HttpApp(
            inference,
            observer=observer,
            guard=edge.http_guard(settings, edge.access_policy(settings, tokens, address)),
            limits=limits,
            render_error=render_error,
            route_options=True,
        )
        management = Router()
        TorchServeManagementHttp(self.management, settings.default_workers_per_model).register(
            management
        )
        private = settings.torchserve_management_address
        self.management_app = HttpApp(
            management,
            observer=observer,
            guard=HttpGuard(
                self._admin_policy(tokens, private),
                bind_address=private,
                allowed_hosts=settings.allowed_hosts,
                cors_allow_origin=settings.cors_allow_origin,
            ),
            limits=limits,
            render_error=render_error,
            route_options=True,
        )
        self.grpc = TorchServeGrpc(self.models, self.management, observer)
        self.tokens = tokens
        self._servers: list[Listener] = []
        self._grpc: list[Any] = []

    def _admin_policy(self, tokens: TokenStore, address: str) -> AccessPolicy:
        """The management ports: with no admin token, open on loopback only."""
        base = edge.access_policy(self.settings, tokens, address)
        open_ = self.settings.allow_unauthenticated_admin or is_loopback(address)
        return AccessPolicy(tokens, base.auth_health, base.auth_metrics, open_)

    # ------------------------------------------------------------------ startup models

    async def register_at_start(self) -> list[str]:
        """Write the ``--models`` archives into the repository; the models' names."""
        names: list[str] = []
        for name, url in parse_models(self.settings.models):
            urls = self.store.archives() if url == "all" else [url]
            for each in urls:
                try:
                    source = await asyncio.to_thread(self.store.resolve, each)
                    try:
                        names.append(await self.management.install_at_start(source, name))
                    finally:
                        await asyncio.to_thread(source.discard)
                except InferdError as exc:
                    log.error("cannot register %s at start: %s", each, exc.message)
        return names

    # ------------------------------------------------------------------ ports

    async def start(self) -> None:
        settings = self.settings
        for address, port, app, what in (
            (
                settings.http_address,
                settings.torchserve_inference_port,
                self.inference_app,
                "inference",
            ),
            (
                settings.torchserve_management_address,
                settings.torchserve_management_port,
                self.management_app,
                "management",
            ),
        ):
            if port:
                await self._serve_http(app, address, port, what)
        for port, service in (
            (settings.torchserve_grpc_inference_port, self.grpc.inference_service()),
            (settings.torchserve_grpc_management_port, self.grpc.management_service()),
        ):
            if port:
                await self._serve_grpc(port, service)

    async def _serve_http(self, app: HttpApp, address: str, port: int, what: str) -> None:
        listener = await listen(
            app, address, port, self.granian_options, what=f"TorchServe's {what} API"
        )
        self._servers.append(listener)
        log.info("listening: TorchServe %s API on %s", what, listener.address)

    async def _serve_grpc(self, port: int, service: GrpcService) -> None:
        settings = self.settings
        management = service.name == MANAGEMENT_SERVICE
        host = settings.torchserve_management_address if management else settings.grpc_address
        address = f"{host}:{port}"
        policy = (
            self._admin_policy(self.tokens, host)
            if management
            else edge.access_policy(settings, self.tokens, host)
        )
        server = grpc_server(
            [service],
            address,
            kind=settings.grpc_server,
            max_message_bytes=settings.grpc_max_message_bytes,
            tls=edge.grpc_tls(settings),
            access=policy,
            max_concurrent_rpcs=edge.inflight_share(settings) or None,
            limits=edge.grpc_limits(settings),
            reflect=False,
            what="TorchServe's gRPC",
        )
        await server.start()
        self._grpc.append(server)
        log.info("listening: TorchServe gRPC %s on %s", service.name.rpartition(".")[2], address)

    async def stop(self) -> None:
        for server in self._grpc:
            await server.stop(grace=2.0)
        for listener in self._servers:
            listener.stop()
            await listener.stopped()
        self._servers.clear()
        self._grpc.clear()
