"""The protocol-neutral data plane: what every frontend (v2 HTTP, v2 gRPC, TF Serving) calls.

Adapters decode their wire format into an InferRequest, call here, and encode the result;
this module knows nothing of HTTP or gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from inferd import __version__
from inferd.config.text import config_to_dict
from inferd.errors import InferdError, InvalidInput, Unavailable, Unimplemented
from inferd.model import ModelState, ModelVersion
from inferd.registry import ModelRecord, Registry
from inferd.routing import (
    LABEL_PARAMETER,
    RoutingPolicy,
    check_label,
    check_version,
    labels_from_mapping,
    shadow_from_mapping,
    split_from_mapping,
)
from inferd.types import InferRequest, InferResponse

if TYPE_CHECKING:
    from inferd.repository.control import RepositoryControl
    from inferd.repository.manager import RepositoryStatus

EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository"]


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


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
        self.models_ready: Callable[[], bool] = _always
        self._routing_changes = asyncio.Lock()

    @property
    def ready(self) -> bool:
        return self.started and not self.draining and self.models_ready()

    def live(self) -> bool:
        return True

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_name, "version": __version__, "extensions": EXTENSIONS}

    def model(self, name: str, version: str = "", label: str = "") -> ModelVersion:
        """The version a version or label names, else the highest ready one (no split)."""
        if label:
            return self.registry.route(name, version, label)
        return self.registry.get(name, version)

    def version_of(self, name: str, version: str = "", label: str = "") -> str:
        """The version number a label names (or ``version`` itself when no label is given)."""
        if not label:
            return version
        if version:
            raise InvalidInput("a request names a version or a version label, not both")
        self.registry.record(name)  # unknown model -> NotFound
        return str(self.registry.routing(name).label_version(label))

    def route(
        self, name: str, version: str = "", label: str = "", request_id: str = ""
    ) -> ModelVersion:
        """The version a request goes to: by version or label, else by the traffic split."""
        return self.registry.route(name, version, label, request_id)

    def record(self, name: str) -> ModelRecord:
        return self.registry.record(name)

    def model_ready(self, name: str, version: str = "") -> bool:
        self.registry.record(name)  # unknown model -> NotFound
        return self.registry.is_ready(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        model = self.registry.get(name, version)
        record = self.registry.record(name)
        spec = model.spec
        return {
            "name": name,
            "versions": [str(v) for v in sorted(record.versions)],
            "platform": spec.platform,
            "inputs": [
                {"name": t.name, "datatype": t.datatype.name, "shape": t.shape(spec.max_batch_size)}
                for t in spec.inputs
            ],
            "outputs": [
                {"name": t.name, "datatype": t.datatype.name, "shape": t.shape(spec.max_batch_size)}
                for t in spec.outputs
            ],
        }

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        return config_to_dict(self.registry.get(name, version).config)

    async def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model version with its state; models in the repository but not loaded are
        listed with no version as UNAVAILABLE 'unloaded', as Triton does."""
        entries: list[IndexEntry] = []
        loaded = set(self.registry.names())
        notes: dict[str, str] = {}
        if self.repository is not None:
            view = await self.repository.view()  # the last listing: never waits on a store
            notes = view.notes
            for name in view.names:
                if name not in loaded:
                    entries.append(IndexEntry(name, "", "UNAVAILABLE", "unloaded"))
        for record in self.registry.records():
            note = notes.get(record.name, "")
            if not record.status:
                entries.append(
                    IndexEntry(record.name, "", record.state.value, note or record.reason)
                )
            for status in record.status.values():
                entries.append(
                    IndexEntry(
                        record.name, str(status.version), status.state.value, note or status.reason
                    )
                )
        if ready_only:
            entries = [e for e in entries if e.state == "READY"]
        return sorted(entries, key=lambda e: (e.name, int(e.version or 0)))

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics extension: every ready version, or one model's, or one version."""
        if not name:
            versions = [v for r in self.registry.records() for v in r.versions.values()]
        elif version:
            versions = [self.registry.get(name, version)]
        else:
            versions = list(self.registry.record(name).versions.values())
        return {
            "model_stats": [
                v.stats.as_dict(v.name, str(v.version))
                for v in sorted(versions, key=lambda v: (v.name, v.version))
            ]
        }

    def admit(self, name: str, version: str = "") -> None:
        """Unavailable at once when the model's queue is full (checked before a frontend
        reads and decodes the body); anything else wrong is left to ``infer`` to say."""
        try:
            model = self.registry.get(name, version)
        except InferdError:
            return
        queue_full = getattr(model.scheduler, "queue_full", None)
        error = queue_full() if queue_full is not None else None
        if error is not None:
            raise error

    async def infer(self, request: InferRequest) -> InferResponse:
        label = request.parameters.get(LABEL_PARAMETER, "")
        if not isinstance(label, str):
            raise InvalidInput(f"parameter '{LABEL_PARAMETER}' must be a string")
        name, version = request.model_name, request.model_version
        model = self.registry.route(name, version, label, request.id)
        try:
            response = await model.infer(request)
        except Unavailable:
            if model.state is ModelState.READY:
                raise
            # Retired between routing and running (a version swap): route once more.
            model = self.registry.route(name, version, label, request.id)
            response = await model.infer(request)
        self.registry.mirror(model, request, response)
        return response

    # ------------------------------------------------------------------ repository API

    def _control(self) -> RepositoryControl:
        if self.repository is None:
            raise Unimplemented("this server has no repository API")
        return self.repository

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        await self._control().load(name, config_json, files)

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

    def routing(self, name: str) -> dict[str, Any]:
        """Labels, traffic split, shadow policy and shadow counts of a model."""
        record = self.registry.record(name)
        return {"name": record.name, **self.registry.routing(name).as_dict()}

    async def set_labels(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
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

        def change(policy: RoutingPolicy) -> RoutingPolicy:
            labels = dict(policy.labels)
            for label, number in updates.items():
                if number is None:
                    labels.pop(label, None)
                else:
                    labels[label] = number
            return replace(policy, labels=labels)

        await self._change_routing(name, change, {"labels"})
        return self.routing(name)

    async def set_routing(self, name: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Replace any of labels, traffic_split and shadow (null clears it)."""
        self.registry.record(name)
        unknown = set(doc) - {"labels", "traffic_split", "shadow"}
        if unknown:
            raise InvalidInput(f"unknown routing key(s) {sorted(unknown)}")
        fields: dict[str, Any] = {}
        if "labels" in doc:
            fields["labels"] = labels_from_mapping(_mapping(doc["labels"], "labels"), "labels")
        if "traffic_split" in doc:
            fields["split"] = split_from_mapping(
                _mapping(doc["traffic_split"], "traffic_split"), "traffic_split"
            )
        if "shadow" in doc:
            value = doc["shadow"]
            fields["shadow"] = (
                None if value is None else shadow_from_mapping(_mapping(value, "shadow"), "shadow")
            )
        await self._change_routing(name, lambda policy: replace(policy, **fields), set(doc))
        return self.routing(name)


def _always() -> bool:
    return True


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"'{what}' must be an object")
    return value
