"""``inferd.Server``: the server core in your process. A model repository, the registry of
loaded models, the data plane, metrics and logs on one event loop, called directly (numpy in,
numpy out) and, when asked, over HTTP and gRPC as well.

``inferd serve`` is this object with the network frontends started on it
(``inferd.app.server``): an in-process call and a network request to the same model go through
the same data plane, scheduler and instances, so they are batched together.

It runs one of two ways. ``with Server(...)`` (or ``open()`` / ``close()``) starts it on an
event loop of its own, on a thread, and every plain method blocks until answered.
``async with Server(...)`` (or ``await start()`` / ``await stop()``) runs it on the caller's
loop, where the ``async_`` methods are awaited. Either way the plain methods work from any
thread but the server's loop. Errors are inferd's exceptions (``inferd.core.errors``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Mapping,
    Sequence,
)
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from inferd.app import edge
from inferd.app.bind import BoundFunctions
from inferd.app.calls import Outputs, OutputsWanted, build_request
from inferd.app.direct import infer_now
from inferd.app.flags import from_keywords
from inferd.app.loop_thread import LoopThread
from inferd.app.reporting import log_readiness, logs_from
from inferd.app.repository import lazy_serving, model_manager
from inferd.app.server_streams import StreamCalls
from inferd.app.settings import Settings
from inferd.backends.function import InferFunction
from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import ConfigError
from inferd.core.stats import ModelStatistics
from inferd.core.types import InferRequest
from inferd.core.views import IndexEntry, ModelMetadata, ServerMetadata
from inferd.observability.log_settings import LogSettings
from inferd.observability.logging import Logs
from inferd.observability.metrics import EndpointStats, build_registry
from inferd.observability.model_metrics import ModelMetrics
from inferd.observability.rate_limiter_metrics import RateLimiterCollector
from inferd.observability.trace_settings import TraceSettings
from inferd.observability.tracing import Tracer
from inferd.plane.dataplane import DataPlane
from inferd.plane.registry import Registry
from inferd.repository.control import RepositoryControl
from inferd.repository.manager import ControlMode
from inferd.repository.poller import Poller
from inferd.scheduling.cache import ResponseCache
from inferd.scheduling.rate_limiter import limiter_from

if TYPE_CHECKING:
    from inferd.app.frontends import Frontends
    from inferd.observability.residency_metrics import ResidencyCollector
    from inferd.repository.residency import Residency

log = logging.getLogger("inferd.server")


class Server(StreamCalls):
    """An inferd server in this process: ``Server(model_repository="models", **settings)``.

    The keyword arguments are ``inferd serve``'s settings (``--model-control-mode`` ->
    ``model_control_mode``...), or pass one ``Settings``. The environment is not read.
    Its streaming calls are ``inferd.app.server_streams``'s; how its methods reach its event
    loop, ``inferd.app.server_loop``'s."""

    def __init__(
        self, settings: Settings | None = None, /, *, logs: Logs | None = None, **options: Any
    ) -> None:
        if settings is None or options:
            settings = from_keywords(options, settings)
        if not settings.model_repository:
            raise ConfigError(
                "--model-repository is required (or INFERD_MODEL_REPOSITORY; "
                "model_repository= in Python)"
            )
        self.settings = settings
        # Whether this process says "server ready" and "listening" at info level: one worker of
        # several does (``inferd.app.server``), so that the server says each once.
        self.announces = True
        self.registry = Registry()
        cache = ResponseCache(settings.cache_size) if settings.cache_size > 0 else None
        self.tokens = edge.token_store(settings)
        self.manager = model_manager(
            settings, self.registry, cache, edge.code_policy(settings, self.tokens)
        )
        repository = RepositoryControl(self.manager, settings.max_upload_bytes)
        self.plane = DataPlane(self.registry, settings.server_name, repository)
        if settings.strict_readiness:
            self.plane.models_ready = self.manager.ready
        # Models in worker processes (Python models) call other models through the data plane;
        # metrics a model's own code records (TorchServe handlers) join the server's.
        self.model_metrics = ModelMetrics()
        self.functions = BoundFunctions(self.manager, settings.max_upload_bytes)  # ``bind``
        lifecycle = self.manager.lifecycle
        # Triton's rate limiter: one per process, over every model this process runs.
        self.rate_limiter = limiter_from(settings.rate_limit, settings.rate_limit_resource)
        lifecycle.options = replace(
            lifecycle.options,
            call_model=self.plane.infer,
            model_metrics=self.model_metrics.record,
            rate_limiter=self.rate_limiter,
        )
        self.logs = logs or logs_from(settings)
        self.endpoints = EndpointStats()
        # The repository's status through the data plane: a frontend worker's is its host's.
        self.metrics = build_registry(self.registry, self.endpoints, self.plane.repository_status)
        self.metrics.register(self.model_metrics)
        if self.rate_limiter is not None:
            self.metrics.register(RateLimiterCollector(self.rate_limiter))
        lazy = lazy_serving(settings, self.manager, self.plane, self.metrics)
        # Lazy serving's budget and its metrics (a frontend worker's host has them instead).
        self.residency: Residency | None = lazy[0] if lazy is not None else None
        self.residency_metrics: ResidencyCollector | None = lazy[1] if lazy is not None else None
        self.tracer = (
            Tracer(settings.trace_exporter, settings.trace_endpoint, settings.server_name)
            if settings.trace_exporter
            else None
        )
        # Triton's trace and log settings APIs change these at run time.
        self.trace_settings = TraceSettings(self.tracer is not None, self.registry.record)
        self.log_settings = LogSettings(self.logs)
        # Loaded at start beside --load-model (models registered by a frontend at start).
        self.also_load: list[str] = []
        # Run after the startup loads, before the server is ready (workers replay changes).
        self.after_startup_loads: Callable[[], Coroutine[Any, Any, None]] | None = None
        # Instead of loading the repository at start (and polling it): a frontend worker,
        # whose models are its host's, waits for the host's table here.
        self.startup_loads: Callable[[], Coroutine[Any, Any, None]] | None = None
        # Told when startup loading ends in a ConfigError (``inferd serve`` stops with it).
        self.on_startup_error: Callable[[ConfigError], None] | None = None
        self.poller: Poller[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id = 0
        self._thread: LoopThread | None = None  # ``open``'s loop
        self._loader: asyncio.Task[None] | None = None
        self._frontends: Frontends | None = None
        self._stopped = False

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running" if self._loop else "not started"
        return f"<inferd.Server {', '.join(self.settings.model_repository)} ({state})>"

    # ------------------------------------------------------------------ lifecycle

    async def start(self, *, wait_for_models: bool = True) -> Server:
        """Start on the running event loop and load the repository's models (returns once
        startup loading has settled, unless ``wait_for_models`` is false). A model that fails
        to load is UNAVAILABLE with its reason (``models()``); the others serve."""
        if self._loop is not None or self._stopped:
            raise RuntimeError("an inferd.Server starts once: make a new one")
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._loader = self._loop.create_task(self._load_models(), name="inferd startup loads")
        # Its error is raised by ``start`` or handed to ``on_startup_error``, not left unread.
        self._loader.add_done_callback(lambda task: task.cancelled() or task.exception())
        if wait_for_models:
            try:
                await asyncio.shield(self._loader)
            except BaseException:
                await self.stop()
                raise
        return self

    async def _load_models(self) -> None:
        cancelled = False
        try:
            if self.startup_loads is not None:
                await self.startup_loads()
            else:
                load = [*self.settings.load_model, *self.also_load]
                await self.manager.start(load)
                if self.residency is not None:  # lazy serving: pinned and --load-model models
                    await self.residency.start(load)
            if self.after_startup_loads is not None:
                await self.after_startup_loads()
        except asyncio.CancelledError:
            cancelled = True  # the server stops before startup loading settled
            raise
        except ConfigError as exc:  # a repository that cannot be read (--exit-on-error)
            cancelled = True  # never ready: the server stops with this error
            if self.on_startup_error is not None:
                self.on_startup_error(exc)
            raise
        finally:
            if not cancelled and not self._stopped:
                self.plane.started = True
                if not self.plane.draining:
                    log_readiness(self.registry, self.plane.ready, self.announces)
        polls = self.manager.mode is ControlMode.POLL and self.startup_loads is None
        if polls and not self._stopped:
            self.poller = Poller(
                self.manager.scan, self.manager.apply, self.manager.poll_interval_s
            )
            self.poller.start()

    async def stop(self) -> None:
        """Stop serving: the frontends, the repository poller, then every model (requests
        queued in them finish first). Calling it again does nothing."""
        if self._loop is None or self._stopped:
            return
        self._stopped = True
        self.plane.started = False
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()
            await asyncio.gather(self._loader, return_exceptions=True)
        if self._frontends is not None:
            await self._frontends.stop()
        if self.poller is not None:
            await self.poller.stop()
        await self.manager.close()
        self.functions.close()
        self.plane.shared_memory.close()
        if self.tracer is not None:
            self.tracer.close()
        log.info("server stopped")

    def open(self) -> Server:
        """Start on an event loop of its own (a thread) and load the models; ``close`` ends
        it. ``with Server(...) as server`` does both."""
        if self._loop is not None or self._stopped:
            raise RuntimeError("an inferd.Server starts once: make a new one")
        thread = LoopThread()
        try:
            thread.call(self.start())
        except BaseException:
            thread.close()
            raise
        self._thread = thread
        return self

    def close(self) -> None:
        """Stop (as ``stop``) and end ``open``'s thread; from another thread, stop a server
        started with ``await start()``."""
        thread, self._thread = self._thread, None
        if thread is None:
            if self._loop is not None and not self._stopped:
                self._block(self.stop())
            return
        try:
            thread.call(self.stop())
        finally:
            thread.close()

    def __enter__(self) -> Server:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Server:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ inference

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | int = "",
        outputs: OutputsWanted | None = None,
        parameters: Mapping[str, Any] | None = None,
        request_id: str = "",
    ) -> Outputs:
        """Run one request: ``inputs`` maps each input's name to a numpy array (batch first
        when the model batches); returns each output's array by name. ``version``: a version
        number (default: routing's choice); ``outputs``: only these (or ``{name:
        {"classification": k}}``); ``parameters``: the request's (``priority``, ``timeout``
        in µs, ``sequence_id``...), as the v2 protocol names them.

        A model that neither batches nor needs the event loop runs on this thread
        (``inferd.app.direct``); any other request waits for the server's loop to answer."""
        request = build_request(model, inputs, version, outputs, parameters, request_id)
        self._blocking_loop()
        response = infer_now(self.plane, request)
        if response is not None:
            return Outputs(response)
        return self._block(self._infer(request))

    async def async_infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | int = "",
        outputs: OutputsWanted | None = None,
        parameters: Mapping[str, Any] | None = None,
        request_id: str = "",
    ) -> Outputs:
        """``infer``, awaited on the server's event loop."""
        self._check_loop()
        request = build_request(model, inputs, version, outputs, parameters, request_id)
        return Outputs(await self.plane.infer(request))

    async def _infer(self, request: InferRequest) -> Outputs:
        return Outputs(await self.plane.infer(request))

    # ------------------------------------------------------------------ models

    def models(self, ready_only: bool = False) -> list[IndexEntry]:
        """The repository index: every model version with its state (READY, LOADING,
        UNAVAILABLE) and why; models not loaded have no version ("unloaded")."""
        return self._block(self.async_models(ready_only))

    async def async_models(self, ready_only: bool = False) -> list[IndexEntry]:
        self._check_loop()
        return await self.plane.index(ready_only)

    def load(
        self,
        name: str,
        config: Mapping[str, Any] | str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load (or reload) a model from the repository (``model_control_mode="explicit"``);
        ``config``: a model config to use instead (a dict or JSON, Triton's form), with
        ``files`` ({"1/model.onnx": bytes...}) to load a model that is in no repository."""
        self._block(self.async_load(name, config, files))

    async def async_load(
        self,
        name: str,
        config: Mapping[str, Any] | str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        self._check_loop()
        text = config if isinstance(config, str) or config is None else orjson.dumps(config)
        config_json = text.decode() if isinstance(text, bytes) else text
        await self.plane.load_model(name, config_json, dict(files) if files else None)

    def bind(
        self,
        name: str,
        infer_func: InferFunction | Sequence[InferFunction],
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        **options: Any,
    ) -> None:
        """Serve a Python function of this process as model ``name`` (no files): it takes a
        list of requests (mappings of input name to array, with ``.parameters``) and returns
        one dict of output arrays per request. ``inputs``/``outputs``: ``(name, dtype,
        shape)`` each, the shape past the batch dimension; a list of functions runs one
        instance each. ``options``: ``max_batch_size``, ``dynamic_batching`` (on, or Triton's
        fields), ``config`` (more of Triton's config fields, JSON form), ``version``."""
        self._block(self.async_bind(name, infer_func, inputs, outputs, **options))

    async def async_bind(
        self,
        name: str,
        infer_func: InferFunction | Sequence[InferFunction],
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        **options: Any,
    ) -> None:
        self._check_loop()
        await self.functions.bind(name, infer_func, inputs, outputs, **options)

    def unload(self, name: str, unload_dependents: bool = False) -> list[str]:
        """Unload a model (and, with ``unload_dependents``, the ensembles that use it);
        returns the models unloaded. Requests already queued finish first."""
        return self._block(self.async_unload(name, unload_dependents))

    async def async_unload(self, name: str, unload_dependents: bool = False) -> list[str]:
        self._check_loop()
        return await self.plane.unload_model(name, unload_dependents)

    def model_metadata(self, name: str, version: str | int = "") -> ModelMetadata:
        """A model's versions, platform, and inputs and outputs (name, datatype, shape)."""
        return self._block(self.plane.model_metadata(name, str(version or "")))

    async def async_model_metadata(self, name: str, version: str | int = "") -> ModelMetadata:
        """``model_metadata``, awaited (under lazy serving it may load the model)."""
        self._check_loop()
        return await self.plane.model_metadata(name, str(version or ""))

    def model_config(self, name: str, version: str | int = "") -> ModelConfig:
        """A copy of the model's completed config (a ``ModelConfig`` message)."""
        return self._block(self.plane.model_config(name, str(version or "")))

    async def async_model_config(self, name: str, version: str | int = "") -> ModelConfig:
        """``model_config``, awaited (under lazy serving it may load the model)."""
        self._check_loop()
        return await self.plane.model_config(name, str(version or ""))

    def model_ready(self, name: str, version: str | int = "") -> bool:
        return self._here(self.plane.model_ready, name, str(version or ""))

    def statistics(self, name: str = "", version: str | int = "") -> tuple[ModelStatistics, ...]:
        """Triton's statistics of every ready version, or of a model's, or of one version:
        requests, executions (batches), and time queued and computing."""
        return self._here(self.plane.statistics, name, str(version or ""))

    def metadata(self) -> ServerMetadata:
        return self._here(self.plane.server_metadata)

    @property
    def ready(self) -> bool:
        """Started, startup loading done, and (``strict_readiness``) every model READY."""
        return self._loop is not None and self._here(lambda: self.plane.ready)

    # ------------------------------------------------------------------ the network

    def serve_http(self, port: int | None = None) -> int:
        """Also serve this server over HTTP (KServe v2, TF Serving REST, the dashboard...) on
        ``http_address``:``port`` (default ``http_port``; 0: a free port) until it stops;
        returns the port."""
        return self._block(self.async_serve_http(port))

    async def async_serve_http(self, port: int | None = None) -> int:
        self._check_loop()
        return await self.frontends().start_http(self.settings.http_port if port is None else port)

    def serve_grpc(self, port: int | None = None) -> int:
        """Also serve this server over gRPC (KServe v2 / Triton, TF Serving) on
        ``grpc_address``:``port`` (default ``grpc_port``; 0: a free port) until it stops;
        returns the port."""
        return self._block(self.async_serve_grpc(port))

    async def async_serve_grpc(self, port: int | None = None) -> int:
        self._check_loop()
        return await self.frontends().start_grpc(self.settings.grpc_port if port is None else port)

    def frontends(
        self,
        *,
        metrics_text: Callable[[], Awaitable[bytes]] | None = None,
        workers: int = 1,
    ) -> Frontends:
        """The network frontends on this server: built on first use (with these options, see
        ``Frontends``), stopped with it."""
        if self._frontends is None:
            from inferd.app.frontends import Frontends

            self._frontends = Frontends(self, metrics_text=metrics_text, workers=workers)
        return self._frontends
