"""Builds the server from Settings: repository, registry, data plane and frontends, on one loop."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

from granian.constants import Interfaces
from granian.server.embed import Server as GranianServer

from inferd.dataplane import DataPlane
from inferd.protocols.http import HttpApp, Router
from inferd.protocols.tfserving_http import TfServingHttp
from inferd.protocols.v2_grpc import build_server
from inferd.protocols.v2_http import V2Http
from inferd.registry import Registry
from inferd.repository.manager import ModelManager
from inferd.scheduling.cache import ResponseCache
from inferd.settings import Settings

log = logging.getLogger("inferd.server")

GRPC_STOP_GRACE_S = 5.0  # in-flight gRPC calls get this long to finish at shutdown


class Server:
    def __init__(self, settings: Settings) -> None:
        if not settings.model_repository:
            raise SystemExit("inferd: --model-repository is required (or INFERD_MODEL_REPOSITORY)")
        self.settings = settings
        self.registry = Registry()
        self.manager = ModelManager(
            [Path(p) for p in settings.model_repository],
            self.registry,
            default_max_batch_size=settings.default_max_batch_size,
            auto_complete=not settings.disable_auto_complete_config,
            cache=ResponseCache(settings.cache_size) if settings.cache_size > 0 else None,
        )
        self.plane = DataPlane(self.registry, settings.server_name)
        router = Router()
        V2Http(self.plane).register(router)
        TfServingHttp(self.plane).register(router)
        self.http_app = HttpApp(router, max_body_bytes=settings.http_max_body_bytes)

    async def _load_models(self) -> None:
        try:
            await self.manager.load_all(self.settings.models_to_load())
        finally:
            self.plane.ready = True
            ready = [r.name for r in self.registry.records() if r.versions]
            log.info("server ready; models ready: %s", ", ".join(ready) or "none")

    async def run(self) -> None:
        http = GranianServer(
            self.http_app,
            address=self.settings.http_address,
            port=self.settings.http_port,
            interface=Interfaces.RSGI,
            runtime_threads=1,
            backlog=2048,
            log_enabled=False,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, http.stop)
        log.info(
            "HTTP (KServe v2, TF Serving REST) on %s:%d",
            self.settings.http_address,
            self.settings.http_port,
        )
        grpc_server = await self._start_grpc()
        loader = asyncio.create_task(self._load_models())
        try:
            await http.serve()
        finally:
            self.plane.ready = False
            loader.cancel()
            if grpc_server is not None:
                await grpc_server.stop(grace=GRPC_STOP_GRACE_S)
            await self.manager.close()
            log.info("server stopped")

    async def _start_grpc(self) -> Any:
        """The gRPC server, bound and started; None with --allow-grpc=false."""
        if not self.settings.allow_grpc:
            return None
        address = f"{self.settings.grpc_address}:{self.settings.grpc_port}"
        server = build_server(self.plane, address, self.settings.grpc_max_message_bytes)
        await server.start()
        log.info("gRPC (KServe v2 / Triton) on %s", address)
        return server


def run(settings: Settings) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(Server(settings).run())
    else:
        uvloop.run(Server(settings).run())
