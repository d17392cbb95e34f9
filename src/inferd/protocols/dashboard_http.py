"""The web dashboard over HTTP: its page at ``/dashboard/`` and the JSON it needs.

The page (``GET /`` redirects a browser to it; an API client gets KServe v1's liveness) is
static files from ``inferd/dashboard/static``; it reads inferd's public APIs (repository index,
statistics, ``/metrics``, ``/v2/logs``, routing) and these, which they lack:
``/v2/dashboard/models`` (the models table), ``/v2/dashboard/series`` (recent traffic, sampled
once a second), ``/v2/dashboard/cluster`` (Envoy's view of the nodes) and
``/v2/repository/models/{m}/files[/{path}]`` (a model's folder). The page's files are open to
anyone who reaches the port (they hold no data); the JSON routes need the inference scope, a
model's files the admin scope, like every other route (``http_guard``). With
``--dashboard-port`` the page moves to a port of its own, which also answers every other route,
so the page there reaches the same APIs under the same rules, Host checks and TLS included.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from inferd.core.errors import ConfigError, InvalidInput, NotFound
from inferd.dashboard import envoy
from inferd.dashboard.assets import CSP, Asset, load_assets
from inferd.dashboard.files import list_model, read_model_file
from inferd.dashboard.overview import Overview, ServerFacts
from inferd.dashboard.series import TrafficSeries
from inferd.observability.requests import RequestObserver
from inferd.plane.dataplane import DataPlane
from inferd.protocols.tfserving.http import kserve_live
from inferd.protocols.transport.http import HttpApp
from inferd.protocols.transport.http_body import Limits
from inferd.protocols.transport.http_listen import Listener, listen
from inferd.protocols.transport.http_routes import HttpRequest, HttpResponse, Router, json_response
from inferd.repository.manager import ModelManager
from inferd.security.access import Access, AccessPolicy

log = logging.getLogger("inferd.dashboard")

PAGE = "/dashboard/"
_FILES = r"/v2/repository/models/(?P<model>[^/]+)/files"
_SECURITY_HEADERS = [
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
]
_TEXT_SUFFIXES = (".pbtxt", ".txt", ".json", ".py", ".yaml", ".yml", ".md", ".csv")


def _query(request: HttpRequest) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(request.query, keep_blank_values=True).items()}


def _redirect(location: str, status: int = 302) -> HttpResponse:
    return HttpResponse(b"", status, content_type="text/plain", headers=[("location", location)])


def page_url(scheme: str, address: str, port: int) -> str:
    """Where a browser on this machine opens the page: a wildcard address as localhost."""
    host = "localhost" if address in ("", "0.0.0.0", "::", "[::]") else address
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}{PAGE}"


def admin_state(policy: AccessPolicy) -> str:
    """What the page may expect of the admin routes: "open", "token" (an admin token is
    needed) or "off" (refused whatever it sends), so it asks only where it can get an answer."""
    if policy.admin_off():
        return "off"
    return "token" if policy.needs_token(Access.ADMIN) else "open"


class PortApp:
    """The dashboard's own port: the page here, every other route answered by the main app."""

    def __init__(self, page: HttpApp, main: Any) -> None:
        self.page = page
        self.main = main

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        path: str = scope.path
        if path == "/" or path == "/dashboard" or path.startswith(PAGE):
            await self.page.__rsgi__(scope, protocol)
        else:
            await self.main.__rsgi__(scope, protocol)


@dataclass(frozen=True, slots=True)
class DashboardOptions:
    """What the dashboard needs of the server's settings (``--server-name``, ``--node-name``,
    ``--envoy-admin``, ``--dashboard-port``, ``--dashboard-trace-url``, ``--http-address``)."""

    server_name: str = "inferd"
    node_name: str = ""
    envoy_admin: str = ""
    dashboard_port: int = 0
    dashboard_trace_url: str = ""
    http_address: str = "0.0.0.0"


class Dashboard:
    """The dashboard's routes, its traffic sampler, and its port when it has one."""

    def __init__(
        self,
        settings: DashboardOptions,
        plane: DataPlane,
        manager: ModelManager,
        *,
        access_log: bool,
        tracing: bool,
        access: AccessPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.plane = plane
        self.manager = manager
        self.envoy_admin = (
            envoy.check_admin_url(settings.envoy_admin) if settings.envoy_admin else ""
        )
        if settings.dashboard_port < 0 or settings.dashboard_port > 65535:
            raise ConfigError(f"--dashboard-port must be 0..65535, got {settings.dashboard_port}")
        self.assets: dict[str, Asset] = load_assets()
        if "index.html" not in self.assets:
            raise ConfigError("the dashboard's files are missing from the installed package")
        self.series = TrafficSeries(plane.registry)
        facts = ServerFacts(
            name=settings.server_name,
            node=settings.node_name,
            control_mode=manager.mode.value,
            repositories=tuple(s.uri for s in manager.storages),
            writable=bool(manager.storages),  # uploads go to the model's store, or the first
            access_log=access_log,
            tracing=tracing,
            trace_url=settings.dashboard_trace_url,
            envoy_admin=bool(self.envoy_admin),
            started_s=time.time(),
            admin=admin_state(access or AccessPolicy.open()),
        )
        self.overview = Overview(plane.registry, manager, facts, plane.on_demand)
        self._port: Listener | None = None
        # Several workers: the traffic of all of them (see inferd.workers); else this one's.
        self.traffic_totals: Callable[[float, str], Awaitable[dict[str, Any]]] | None = None

    # ------------------------------------------------------------------ routes

    def register(self, router: Router) -> None:
        """The JSON routes, and the page too unless it has a port of its own."""
        router.add("GET", "/v2/dashboard/models", self.models)
        router.add("GET", "/v2/dashboard/series", self.traffic)
        router.add("GET", "/v2/dashboard/cluster", self.cluster)
        router.add("GET", _FILES, self.files, access=Access.ADMIN)
        router.add("GET", _FILES + r"/(?P<path>.+)", self.file, access=Access.ADMIN)
        if not self.settings.dashboard_port:
            self.register_page(router)

    def register_page(self, router: Router) -> None:
        public = Access.PUBLIC
        router.add("GET", "/", self.root, access=public)
        router.add("GET", "/dashboard", self.to_page, access=public)
        router.add("GET", r"/dashboard/(?P<asset>[A-Za-z0-9_.\-/]*)", self.asset, access=public)

    async def to_page(self, request: HttpRequest) -> HttpResponse:
        return _redirect(PAGE)

    async def root(self, request: HttpRequest) -> HttpResponse:
        """A browser (Accept: text/html) goes to the page; an API client gets KServe v1's
        liveness, as a KServe server answers ``GET /``."""
        if "text/html" in request.headers.get("accept", ""):
            response = _redirect(PAGE)
            response.headers.append(("vary", "accept"))
            return response
        return kserve_live()

    async def asset(self, request: HttpRequest) -> HttpResponse:
        name = request.params.get("asset", "") or "index.html"
        found = self.assets.get(name)
        if found is None:
            raise NotFound(f"the dashboard has no file '{name}'")
        headers = [
            ("etag", found.etag),
            ("cache-control", "no-cache"),
            ("vary", "accept-encoding"),
            *_SECURITY_HEADERS,
        ]
        if name.endswith(".html"):
            headers.append(("content-security-policy", CSP))
        if request.headers.get("if-none-match") == found.etag:
            return HttpResponse(b"", 304, content_type=found.content_type, headers=headers)
        if "gzip" in request.headers.get("accept-encoding", ""):
            headers.append(("content-encoding", "gzip"))
            return HttpResponse(found.gzipped, content_type=found.content_type, headers=headers)
        return HttpResponse(found.body, content_type=found.content_type, headers=headers)

    async def models(self, request: HttpRequest) -> HttpResponse:
        return json_response(await self.overview.as_json(self.plane.ready))

    async def traffic(self, request: HttpRequest) -> HttpResponse:
        query = _query(request)
        text = query.get("after", "0")
        try:
            after = float(text)
        except ValueError:
            after = math.nan
        if not math.isfinite(after):
            raise InvalidInput(f"after must be a number of seconds, got '{text[:100]}'")
        model = query.get("model", "")
        if self.traffic_totals is not None:
            return json_response(await self.traffic_totals(after, model))
        return json_response(self.series.as_json(after, model))

    async def cluster(self, request: HttpRequest) -> HttpResponse:
        if not self.envoy_admin:
            return json_response({"enabled": False, "hint": envoy.HINT, "clusters": []})
        return json_response(await envoy.clusters(self.envoy_admin))

    async def files(self, request: HttpRequest) -> HttpResponse:
        return json_response(await list_model(self.manager, request.params["model"]))

    async def file(self, request: HttpRequest) -> HttpResponse:
        name, path = request.params["model"], request.params["path"]
        data = await read_model_file(self.manager, name, path)
        filename = path.rsplit("/", 1)[-1].replace('"', "")
        content_type = (
            "text/plain; charset=utf-8"
            if filename.endswith(_TEXT_SUFFIXES)
            else "application/octet-stream"
        )
        disposition = f'attachment; filename="{filename}"'
        return HttpResponse(
            data,
            content_type=content_type,
            headers=[("content-disposition", disposition), *_SECURITY_HEADERS],
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(
        self,
        main_app: HttpApp,
        observer: RequestObserver | None,
        server_options: dict[str, Any] | None = None,
    ) -> None:
        """Start sampling, and serve the dashboard's own port if it has one: behind the main
        app's guard, with the HTTP port's ``server_options`` (TLS, connection limits)."""
        self.series.start()
        port = self.settings.dashboard_port
        if not port:
            return
        router = Router()
        self.register_page(router)
        page = HttpApp(
            router,
            observer=observer,
            guard=main_app.guard,
            limits=Limits(max_body_bytes=1024, body_timeout_s=main_app.limits.body_timeout_s),
        )
        address = self.settings.http_address
        self._port = await listen(
            PortApp(page, main_app),
            address,
            port,
            server_options or {},
            what="the dashboard",
            backlog=256,
        )
        scheme = "https" if "ssl_cert" in (server_options or {}) else "http"
        log.info("listening: dashboard on %s", page_url(scheme, address, port))

    async def stop(self) -> None:
        await self.series.stop()
        if self._port is not None:
            self._port.stop()
            await self._port.stopped()
            self._port = None
