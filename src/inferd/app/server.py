"""``inferd serve``: an ``inferd.Server`` (the core: repository, registry, data plane, metrics)
with the network frontends on it, signals (SIGTERM drains, SIGINT stops), and with
``--http-workers`` its place among the serving processes on the port."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import signal
import sys
from dataclasses import replace
from functools import partial

from inferd.app import edge, torchserve_ports
from inferd.app.drain import STOP_GRACE_S, Drain
from inferd.app.embedded import Server
from inferd.app.settings import Settings
from inferd.core.errors import ConfigError
from inferd.observability.logging import Logs
from inferd.observability.residency_metrics import RequestCounts
from inferd.repository.manager import ControlMode
from inferd.repository.schemes import check_folders
from inferd.workers.control import SharedControl
from inferd.workers.demand_frontend import RemoteDemand
from inferd.workers.demand_host import HostDemand
from inferd.workers.forward import HostLink
from inferd.workers.frontend import FrontendControl
from inferd.workers.host import ModelHost
from inferd.workers.node import WorkerNode, merged_registry
from inferd.workers.peers import Peers, WorkerRole
from inferd.workers.sizing import worker_count
from inferd.workers.supervisor import Supervisor

log = logging.getLogger("inferd.server")


class NetworkServer:
    """One serving process: the core, its HTTP and gRPC frontends, and (one of several
    workers) the link to the other workers."""

    def __init__(
        self, settings: Settings, logs: Logs | None = None, worker: WorkerRole | None = None
    ) -> None:
        settings, self.temporary_repository = torchserve_ports.prepare(settings)
        self.settings = settings
        self.worker = worker  # one of several processes on the port (--http-workers)
        self.core = Server(settings, logs=logs)
        core = self.core
        # The first worker speaks for the server ("server ready", "listening", the warnings
        # about its ports); each other one says only that it takes connections.
        core.announces = worker is None or worker.index == 0
        self.plane = core.plane
        self.node: WorkerNode | None = None
        self.host: ModelHost | None = None  # worker 0 of several: the models live here
        self.link: HostLink | None = None  # any other worker: its requests go to worker 0
        if worker is not None:
            control = self._worker_control(worker)
            core.plane.repository = control
            self.node = WorkerNode(control.peers, control, core.plane, core.metrics, core.logs)
            self._share_budget(self.node)
            control.share_regions(core.plane.shared_memory)
            control.share_settings(core.trace_settings, core.log_settings)
            core.plane.total_statistics = self.node.statistics
            core.plane.total_shadow_stats = self.node.shadow_stats
        self.frontends = core.frontends(
            metrics_text=self.node.metrics_text if self.node is not None else None,
            workers=worker.count if worker is not None else 1,
        )
        self.http_app = self.frontends.http_app
        if self.node is not None:
            self.frontends.admin.log_lines = self.node.log_lines
        dashboard = self.frontends.dashboard
        if dashboard is not None and self.node is not None and worker is not None:
            self.node.series = dashboard.series
            dashboard.traffic_totals = self.node.traffic
            dashboard.overview.shadow_totals = self.node.shadow_stats
            if worker.started_unix_s:  # the server's uptime, a replaced worker's too
                facts = dashboard.overview.facts
                dashboard.overview.facts = replace(facts, started_s=worker.started_unix_s)
        # TorchServe's inference, management and gRPC APIs on ports of their own.
        self.torchserve = (
            torchserve_ports.TorchServePorts(
                settings,
                core.plane,
                core.manager,
                core.tokens,
                self.frontends.observer,
                self.frontends.granian_options,
            )
            if torchserve_ports.enabled(settings)
            else None
        )
        self.drain: Drain | None = None  # set by run(): SIGTERM drains, SIGINT stops at once
        self.stopping = False
        self._starting: asyncio.Task[Server] | None = None  # the core's start, while it runs
        # Startup loading ended in a configuration error (a repository folder that cannot be
        # read, --exit-on-error): the server stops and exits with it.
        self.startup_error: ConfigError | None = None
        core.on_startup_error = self._startup_failed

    def _worker_control(self, worker: WorkerRole) -> SharedControl:
        """The repository API of one worker among several, and its part: the model host
        (worker 0), or a frontend that forwards every request to it."""
        core, settings = self.core, self.settings
        peers = Peers(worker)
        if worker.index == 0:
            host = self.host = ModelHost(
                core.registry,
                worker.run_dir,
                core.manager.status,
                lambda: core.plane.models_ready(),
                # Lazy serving: no copies, every model lives within the host's budget.
                0 if core.residency is not None else settings.http_workers_copy_bytes,
            )
            control = SharedControl(core.manager, core.registry, peers, settings.max_upload_bytes)
            control.published = host.sync

            async def replay_then_publish() -> None:
                await control.replay()
                host.open_table()

            core.after_startup_loads = replay_then_publish
            return control
        link = self.link = HostLink(worker.run_dir, worker.index, core.registry)
        frontend = FrontendControl(
            core.manager, core.registry, peers, settings.max_upload_bytes, link
        )
        core.startup_loads = link.start
        core.after_startup_loads = frontend.replay
        core.plane.models_ready = link.ready
        return frontend

    def _share_budget(self, node: WorkerNode) -> None:
        """Lazy serving: one budget for the server, the host's. A frontend asks the host to
        load what its requests need (``workers.demand_frontend``) and exports only its hits
        and misses; the host answers (``workers.demand_host``)."""
        core = self.core
        if core.residency is None:
            return
        if self.host is not None:
            node.handlers.update(HostDemand(core.residency, self.host, node.peers).handlers())
            return
        assert self.link is not None and core.residency_metrics is not None
        remote = RemoteDemand(node.peers, self.link, core.registry)
        core.plane.on_demand = remote
        core.metrics.unregister(core.residency_metrics)
        core.metrics.register(RequestCounts(remote.counts))
        core.residency = core.residency_metrics = None
        node.handlers.update(remote.handlers())

    async def run(self) -> None:
        settings, core, frontends = self.settings, self.core, self.frontends
        loop = asyncio.get_running_loop()
        self.drain = Drain(core.plane, core.registry, settings.drain_timeout_s, self.stop)
        if self.host is not None:
            self.drain.forwarded = self.host.activity
        loop.add_signal_handler(signal.SIGINT, self.stop)
        loop.add_signal_handler(signal.SIGTERM, self.drain.begin)
        # A worker other than the first, or a replacement, takes connections once it can serve.
        late = self.worker is not None and (self.worker.index > 0 or self.worker.restarted)
        try:
            if self.node is not None:
                await self.node.start()
                frontends.metrics_registry = merged_registry(self.node, loop)
            if self.torchserve is not None:
                registered = await self.torchserve.register_at_start()
                # Loaded with the repository, unless only some models load (explicit mode).
                if settings.load_model or core.manager.mode is ControlMode.EXPLICIT:
                    core.also_load = registered
            if self.host is not None:
                await self.host.start()
            # A stop while waiting for the models ends the wait (a frontend waits for a host,
            # which may be gone for good: the supervisor stops every worker when one cannot
            # start).
            self._starting = loop.create_task(core.start(wait_for_models=late))
            try:
                await self._starting
            except asyncio.CancelledError:
                if not self.stopping:
                    raise
                return
            if core.announces:
                edge.warn_if_open(settings, core.tokens)
            if settings.allow_grpc:
                await frontends.start_grpc(settings.grpc_port)
            if self.torchserve is not None:
                await self.torchserve.start()
            await frontends.start_http(settings.http_port)
            if self.worker is not None and not core.announces:
                log.info("worker %d takes connections", self.worker.index)
            if self.stopping:  # a signal came while starting
                frontends.stop_http()
            await frontends.http_stopped()
            if self.host is not None and self.startup_error is None:
                # The other workers' requests run here until they have drained and stopped.
                await self.host.wait_frontends(settings.drain_timeout_s + STOP_GRACE_S)
        finally:
            if self.torchserve is not None:
                await self.torchserve.stop()
            if self.host is not None:
                await self.host.close()
            await core.stop()  # the frontends first
            if self.link is not None:
                await self.link.close()
            if self.temporary_repository is not None:
                shutil.rmtree(self.temporary_repository, ignore_errors=True)
            if self.node is not None:
                await self.node.close()
        if self.startup_error is not None:
            raise self.startup_error

    def _startup_failed(self, error: ConfigError) -> None:
        self.startup_error = error
        self.stop()

    def stop(self) -> None:
        """Stop now (SIGINT, or the end of a drain): HTTP first, then the rest."""
        self.stopping = True
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        self.frontends.stop_http()


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
        if settings.exit_on_error:  # before any port is bound or worker started
            check_folders(settings.model_repository)
        count, why = worker_count(settings.http_workers, settings.lazy_serving())
        if count > 1 and torchserve_ports.enabled(settings):
            count = 1  # TorchServe's ports and its registrations live in one serving process
        if count > 1:
            if not settings.model_repository:
                raise ConfigError("--model-repository is required (or INFERD_MODEL_REPOSITORY)")
            Logs(verbose=settings.log_verbose, log_format=settings.log_format)
            log.info("%d HTTP workers (%s)", count, why)
            entry = partial(_serve_as, settings)
            if Supervisor(count, entry).run() != 0:
                raise ConfigError("a worker could not start (its error is above)")
            return
    # OpenMP worker threads (PyTorch, XGBoost, LightGBM) spin while waiting by default, which
    # steals the CPU the event loop needs to decode the next request; a user's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    set_gil_switch_interval(settings.gil_switch_interval_us)
    set_gc_threshold(settings.gc_threshold)
    server = NetworkServer(settings, worker=worker)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(server.run())
    else:
        uvloop.run(server.run())


def worker_settings(settings: Settings, index: int) -> Settings:
    """One worker's settings: only worker 0 serves the separate metrics port. Every worker
    shares the dashboard's port as it shares the HTTP port (a frontend told of no dashboard
    port would serve the page on the HTTP port, which the operator moved it off)."""
    if index == 0:
        return replace(settings, http_workers="1")
    return replace(settings, http_workers="1", metrics_port=0)


def _serve_as(settings: Settings, role: WorkerRole) -> int:
    """What the supervisor runs in each worker process."""
    return serve(worker_settings(settings, role.index), role)


def serve(settings: Settings, worker: WorkerRole | None = None) -> int:
    """``inferd serve``: run until stopped; the exit code (2: a configuration error)."""
    try:
        run(settings, worker)  # the server configures the engine and access logs from its settings
    except ConfigError as exc:
        print(f"inferd: {exc.message}", file=sys.stderr)
        return 2
    return 0
