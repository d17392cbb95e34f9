"""The protocol-neutral data plane: what every frontend (v2 HTTP, v2 gRPC, TF Serving) calls.

Adapters decode their wire format into an InferRequest, call here, and encode what comes
back: an InferResponse, or a read-only view (``inferd.core.views``, ``stats.ModelStatistics``,
``routing.RoutingView``); never a registry record or a model version. Routing decides which
version serves a request (once per request) and whether to mirror it; the data plane runs the
request and its shadow copy. TF Serving's predict, classify and regress live in
``inferd.plane.tfserving`` (``DataPlane.tfserving``). This module knows nothing of HTTP or gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from collections.abc import Set as AbstractSet
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import InferdError, InvalidInput, NotFound, Unavailable, Unimplemented
from inferd.core.stats import ModelStatistics
from inferd.core.types import LABEL_PARAMETER, InferRequest, InferResponse
from inferd.core.views import (
    IndexEntry,
    ModelMetadata,
    ModelStatus,
    ServerMetadata,
    TensorMetadata,
    VersionState,
)
from inferd.plane import demand as lazy
from inferd.plane.model import ModelState, ModelVersion
from inferd.plane.registry import Registry, parse_version, unknown_model
from inferd.plane.routing import (
    RoutingPolicy,
    RoutingView,
    ShadowCounts,
    check_label,
    check_version,
    routing_fields,
    with_labels,
)
from inferd.plane.shadows import Shadows
from inferd.plane.shared_memory import SystemSharedMemory
from inferd.plane.tfserving import TfServing
from inferd.version import __version__

if TYPE_CHECKING:
    from inferd.plane.control import RepositoryControl, RepositoryStatus

log = logging.getLogger("inferd.dataplane")

# How many times a request is routed again when the version it was routed to retires first.
REROUTES = 3

# Triton's server extensions that inferd implements, in Triton's order; GET /v2 and gRPC
# ServerMetadata list them (tests check each one listed works and each one left out is absent).
LEADING_EXTENSIONS: tuple[str, ...] = ("classification",)  # before the repository's, as Triton
EXTENSIONS: tuple[str, ...] = (
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)
REPOSITORY_EXTENSIONS: tuple[str, ...] = ("model_repository", "model_repository(unload_dependents)")
SEQUENCE_EXTENSION = "sequence"  # right after classification, as Triton lists it


class DataPlane:
    def __init__(
        self,
        registry: Registry,
        server_name: str = "inferd",
        repository: RepositoryControl | None = None,
    ) -> None:
        self.registry = registry
        self.server_name = server_name
        self.repository = repository  # None: no repository API (load, unload, upload)
        self.started = False  # set once startup loading has settled
        self.draining = False  # set by a SIGTERM: the balancer must stop sending
        # Strict readiness: every model that should load is READY (see --strict-readiness).
        self.models_ready: Callable[[], bool] = lambda: True
        # Several workers on one port: their statistics added up (see inferd.workers).
        self.total_statistics: Callable[[str, str], Awaitable[tuple[ModelStatistics, ...]]] = (
            self._own_statistics
        )
        # ... and each model's shadow counts, by name (those of the routing document).
        self.total_shadow_stats: Callable[[list[str]], Awaitable[dict[str, ShadowCounts]]] = (
            self._own_shadow_stats
        )
        self._routing_changes = asyncio.Lock()
        self.tfserving = TfServing(self.registry, self.start)
        self.shadows = Shadows(registry)  # copies of requests to shadow versions
        # Regions clients registered (Triton's system shared memory extension).
        self.shared_memory = SystemSharedMemory()
        # The model names whose queue has a size limit, kept current by the registry: only
        # these need ``admit`` before a frontend reads a body (read-only here).
        self.queue_limited: AbstractSet[str] = registry.queue_limited
        # Lazy serving (a memory budget): loads models on first use; None: all are loaded.
        self.on_demand: lazy.OnDemand | None = None

    # ------------------------------------------------------------------ health and metadata

    @property
    def ready(self) -> bool:
        return self.started and not self.draining and self.models_ready()

    def live(self) -> bool:
        return True

    def server_metadata(self) -> ServerMetadata:
        extensions = EXTENSIONS
        if self.repository is not None:
            extensions = REPOSITORY_EXTENSIONS + extensions
        return ServerMetadata(
            self.server_name, __version__, (*LEADING_EXTENSIONS, SEQUENCE_EXTENSION, *extensions)
        )

    def model_ready(self, name: str, version: str = "") -> bool:
        """Loaded and READY; with lazy serving, also a model a request would load."""
        demand = self.on_demand
        if demand is None or not demand.serves(name):
            self.registry.record(name)  # unknown model -> NotFound
        if version:
            parse_version(version)  # a malformed version is a client error
        if self.registry.is_ready(name, version):
            return True
        return demand is not None and demand.serves(name) and demand.available(name)

    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        """A loaded version's metadata; with lazy serving, from the model's config when that
        says enough, else after loading it."""
        try:
            return self._metadata(name, version)
        except (NotFound, Unavailable) as exc:
            demand = self._lazy(name, exc)
        return await lazy.answer(
            demand, name, lambda: self._metadata(name, version), lazy.metadata, version
        )

    async def model_config(self, name: str, version: str = "") -> ModelConfig:
        """A copy of the version's completed config; with lazy serving, the repository's
        config of a model that is not loaded when it says enough (else it is loaded)."""
        try:
            return self._config(name, version)
        except (NotFound, Unavailable) as exc:
            demand = self._lazy(name, exc)
        return await lazy.answer(
            demand, name, lambda: self._config(name, version), lazy.config, version
        )

    def _lazy(self, name: str, error: InferdError) -> lazy.OnDemand:
        """The on-demand loader when it serves ``name``; else ``error`` (routing's) raised."""
        demand = self.on_demand
        if demand is None or not demand.serves(name):
            raise error
        return demand

    def _metadata(self, name: str, version: str = "") -> ModelMetadata:
        model = self.registry.get(name, version)
        record = self.registry.record(name)
        spec = model.spec
        batch = spec.max_batch_size
        return ModelMetadata(
            name=name,
            versions=tuple(str(v) for v in sorted(record.versions)),
            platform=spec.platform or spec.backend,  # Triton's rule: the backend, if no platform
            inputs=tuple(
                TensorMetadata(t.name, t.datatype.name, tuple(t.shape(batch))) for t in spec.inputs
            ),
            outputs=tuple(
                TensorMetadata(t.name, t.datatype.name, tuple(t.shape(batch))) for t in spec.outputs
            ),
        )

    def _config(self, name: str, version: str = "") -> ModelConfig:
        config = ModelConfig()
        config.CopyFrom(self.registry.get(name, version).config)
        return config

    def version_of(self, name: str, version: str = "", label: str = "") -> str:
        """The version number a label names (or ``version`` itself when no label is given)."""
        if not label:
            return version
        if version:
            raise InvalidInput("a request names a version or a version label, not both")
        self.registry.record(name)  # unknown model -> NotFound
        return str(self.registry.routing(name).label_version(label))

    def model_status(self, name: str, version: str = "") -> ModelStatus:
        """Every known version of a model with its state (or one version's)."""
        record = self.registry.record(name)
        statuses = list(record.status.values())
        if version:
            number = parse_version(version)
            statuses = [s for s in statuses if s.version == number]
            if not statuses:
                raise NotFound(unknown_model(name, number))
        if not statuses:
            raise Unavailable(f"model '{record.name}' is {record.state.value}: {record.reason}")
        return ModelStatus(
            record.name,
            tuple(
                VersionState(s.version, s.state.value, s.reason)
                for s in sorted(statuses, key=lambda s: s.version, reverse=True)
            ),
        )

    async def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model version with its state; models in the repository but not loaded are
        listed with no version as UNAVAILABLE 'unloaded', as Triton does. With lazy serving
        every row carries its model's residency."""
        entries: list[IndexEntry] = []
        loaded = set(self.registry.names())
        notes: dict[str, str] = {}
        residency = await self.on_demand.survey() if self.on_demand is not None else {}
        if self.repository is not None:
            view = await self.repository.view()  # the last listing: never waits on a store
            notes = view.notes
            for name in view.names:
                if name not in loaded:
                    entries.append(
                        IndexEntry(name, "", "UNAVAILABLE", "unloaded", residency.get(name))
                    )
        for record in self.registry.records():
            note = notes.get(record.name, "")
            where = residency.get(record.name)
            if not record.status:
                entries.append(
                    IndexEntry(record.name, "", record.state.value, note or record.reason, where)
                )
            for status in record.status.values():
                reason = note or status.reason
                entries.append(
                    IndexEntry(record.name, str(status.version), status.state.value, reason, where)
                )
        if ready_only:
            entries = [e for e in entries if e.state == "READY"]
        return sorted(entries, key=lambda e: (e.name, int(e.version or 0)))

    def statistics(self, name: str = "", version: str = "") -> tuple[ModelStatistics, ...]:
        """Triton's statistics extension: every ready version, or one model's, or one version."""
        if not name:
            versions = [v for r in self.registry.records() for v in r.versions.values()]
        elif version:
            versions = [self.registry.get(name, version)]
        else:
            versions = list(self.registry.record(name).versions.values())
        return tuple(
            v.stats.snapshot(v.name, str(v.version))
            for v in sorted(versions, key=lambda v: (v.name, v.version))
        )

    async def _own_statistics(self, name: str, version: str) -> tuple[ModelStatistics, ...]:
        return self.statistics(name, version)

    # ------------------------------------------------------------------ inference

    def admit(self, name: str, version: str = "") -> None:
        """Unavailable at once when the model's queue is full (checked before a frontend
        reads and decodes the body); anything else wrong is left to ``infer`` to say."""
        if name not in self.queue_limited:
            return
        try:
            model = self.registry.get(name, version)
        except InferdError:
            return
        queue_full = getattr(model.scheduler, "queue_full", None)
        error = queue_full() if queue_full is not None else None
        if error is not None:
            raise error

    def max_values(self, name: str, version: str = "") -> int | None:
        """The most numeric values one request to the model can hold (its inputs at
        ``max_batch_size``), for a frontend's cheap check of a large body before decoding it;
        None when there is no bound (strings, variable dimensions) or no such model."""
        try:
            spec = self.registry.get(name, version).spec
        except InferdError:
            return None
        most = 0
        for tensor in spec.inputs:
            if tensor.datatype.is_bytes or any(d < 0 for d in tensor.dims):
                return None
            most += math.prod(tensor.dims) * max(spec.max_batch_size, 1)
        return most

    def infer(self, request: InferRequest) -> Coroutine[Any, Any, InferResponse]:
        """Route a request now (version, label or traffic split): ``run``'s coroutine, to await."""
        return cast("Coroutine[Any, Any, InferResponse]", self.answer(request, inline=False))

    def answer(
        self, request: InferRequest, inline: bool = True
    ) -> InferResponse | Coroutine[Any, Any, InferResponse]:
        """``infer``, answered at once (no coroutine, future or task) when the version routing
        chose runs on the event loop now (``start``); else, or not ``inline``, its coroutine."""
        label = request.parameters.get(LABEL_PARAMETER, "")
        if not isinstance(label, str):
            raise InvalidInput(f"parameter '{LABEL_PARAMETER}' must be a string")
        try:
            model = self.registry.route(
                request.model_name, request.model_version, label, request.id
            )
        except (NotFound, Unavailable):
            if self.on_demand is None:
                raise
            return self._run_loaded(request, label)
        if self.on_demand is not None:
            self.on_demand.hits += 1
        return self.start(model, request, label) if inline else self.run(model, request, label)

    def start(
        self, model: ModelVersion, request: InferRequest, label: str = "", signature: str = ""
    ) -> InferResponse | Coroutine[Any, Any, InferResponse]:
        """``run``, answered at once when the version runs on the event loop now (its own
        inputs and outputs, no shadow to mirror to: ``ModelVersion.infer_inline``)."""
        pool = model.inline_pool
        if pool is not None and not signature and self.registry.shadowing(model.name) is None:
            answered = model.infer_inline(request, pool)
            if answered is not None:
                return answered
        return self.run(model, request, label, signature)

    async def _run_loaded(self, request: InferRequest, label: str) -> InferResponse:
        return await self.run(await self._route(request, label, False), request, label)

    async def _route(self, request: InferRequest, label: str, hit: bool = True) -> ModelVersion:
        """Route a request; with lazy serving, load its model first when it is not loaded
        (``hit``: count a request that finds it loaded)."""
        name, version = request.model_name, request.model_version
        try:
            model = self.registry.route(name, version, label, request.id)
        except (NotFound, Unavailable) as exc:
            demand = self._lazy(name, exc)
        else:
            if hit and self.on_demand is not None:
                self.on_demand.hits += 1
            return model
        await demand.ensure(name, lazy.timeout_s(request))
        return self.registry.route(name, version, label, request.id)

    async def loaded(self, name: str) -> None:
        """With lazy serving, load a model served on demand that is not loaded yet (for the
        adapters that route by themselves: TF Serving's)."""
        demand = self.on_demand
        if demand is None or not demand.serves(name):
            return
        if self.registry.is_ready(name):
            demand.hits += 1
            return
        await demand.ensure(name, None)

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """The responses to one request: a decoupled model's 0..N as it sends them (parameter
        ``triton_final_response`` on each), any other model's one."""
        label = request.parameters.get(LABEL_PARAMETER, "")
        if not isinstance(label, str):
            raise InvalidInput(f"parameter '{LABEL_PARAMETER}' must be a string")
        model = await self._route(request, label)
        if not model.decoupled:
            yield await self.run(model, request, label)
            return
        async for response in model.infer_stream(request):
            yield response

    async def run(
        self, model: ModelVersion, request: InferRequest, label: str = "", signature: str = ""
    ) -> InferResponse:
        """Run a request on the version routing chose for it, then mirror it if asked."""
        try:
            response = await model.infer(request, signature)
        except (Unavailable, NotFound):
            if model.state is ModelState.READY or _given_up(request):
                raise
            model, response = await self._rerun(request, label, signature)
        routing = self.registry.shadowing(model.name)
        if routing is not None and not signature and not _given_up(request):
            self.shadows.mirror(routing, model, request, response)
        return response

    async def _rerun(
        self, request: InferRequest, label: str, signature: str
    ) -> tuple[ModelVersion, InferResponse]:
        """A request whose version was retired between routing and running (a version swap,
        an eviction; in a frontend worker, on the model host): route it again, loading the
        model again if it was evicted, while each version it is routed to retires under it
        (uploads in quick succession), at most ``REROUTES`` times."""
        tries = 0
        while True:
            tries += 1
            model = await self._route(request, label, False)
            try:
                return model, await model.infer(request, signature)
            except (Unavailable, NotFound):
                if model.state is ModelState.READY or tries >= REROUTES:
                    raise

    # ------------------------------------------------------------------ repository API

    def _control(self) -> RepositoryControl:
        if self.repository is None:
            raise Unimplemented("this server has no repository API")
        return self.repository

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """Load (or reload) a model; a failure says ``failed to load '<name>', <why>``."""
        try:
            await self._control().load(name, config_json, files)
        except Unimplemented:
            raise
        except InferdError as exc:
            why = exc.message
            ours = f"failed to load model '{name}': "
            if why.startswith(ours):
                why = why[len(ours) :]
            raise type(exc)(f"failed to load '{name}', {why}") from None

    async def unload_model(self, name: str, unload_dependents: bool = False) -> list[str]:
        """Unload a model (and the models that need it); returns the models unloaded."""
        return await self._control().unload(name, unload_dependents)

    def repository_status(self) -> RepositoryStatus:
        """When the stores were last listed, how each answered, the models held."""
        return self._control().status()

    async def _change_routing(
        self, name: str, change: Callable[[RoutingPolicy], RoutingPolicy], keys: set[str]
    ) -> None:
        """Apply ``change`` to a model's routing, writing the changed ``keys`` into the model's
        store first so replicas follow; one change at a time, so none is lost."""
        async with self._routing_changes:
            routing = self.registry.routing(name)
            policy = change(routing.policy)
            if self.repository is not None:
                await self.repository.persist_routing(name, policy, keys)
            routing.set(policy)

    async def upload_model(
        self, name: str, archive: bytes | AsyncIterator[bytes]
    ) -> list[IndexEntry]:
        await self._control().upload(name, archive)
        return [e for e in await self.index() if e.name == name]

    def routing(self, name: str) -> RoutingView:
        """Labels, traffic split, shadow policy and shadow counts of a model (this process's
        counts: ``total_routing`` has the server's)."""
        self.registry.record(name)
        return self.registry.routing(name).view()

    async def total_routing(self, name: str) -> RoutingView:
        """``routing`` with the shadow counts of every serving process added up."""
        view = self.routing(name)
        totals = await self.total_shadow_stats([name])
        return replace(view, shadow_stats=totals.get(name, view.shadow_stats))

    async def _own_shadow_stats(self, names: list[str]) -> dict[str, ShadowCounts]:
        return self.registry.shadow_counts(names)

    async def set_labels(self, name: str, changes: dict[str, Any]) -> RoutingView:
        """Set (a version) or remove (None) version labels; a label must name a ready version."""
        self.registry.record(name)
        updates: dict[str, int | None] = {}
        for label, value in changes.items():
            check_label(label, "labels")
            if value is None:
                updates[label] = None
                continue
            version = check_version(value, f"label '{label}'")
            if not self.registry.is_ready(name, str(version)):
                raise InvalidInput(
                    f"label '{label}': version {version} of model '{name}' is not ready"
                )
            updates[label] = version

        await self._change_routing(name, partial(with_labels, updates=updates), {"labels"})
        return await self.total_routing(name)

    async def set_routing(self, name: str, doc: dict[str, Any]) -> RoutingView:
        """Replace any of labels, traffic_split and shadow (null clears it)."""
        self.registry.record(name)
        fields = routing_fields(doc)
        await self._change_routing(name, lambda policy: replace(policy, **fields), set(doc))
        return await self.total_routing(name)


def _given_up(request: InferRequest) -> bool:
    """Whether the request gave its inputs up to a worker process (``Handover``)."""
    return request.handover is not None and request.handover.taken
