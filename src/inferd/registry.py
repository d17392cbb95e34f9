"""The registry: models loaded in memory, routed by name, version, label or traffic split.

The repository manager writes records here; protocols only read. A record is replaced
whole, so a request sees either the old set of versions or the new one, never half. Each
name's routing state (labels, split, shadow; ``inferd.routing``) outlives its reloads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferd.config.model_config_pb2 import ModelConfig
from inferd.errors import InvalidInput, NotFound, Unavailable
from inferd.model import ModelState, ModelVersion
from inferd.routing import ModelRouting
from inferd.types import InferRequest, InferResponse

_READY = ModelState.READY  # a module constant: an enum attribute lookup costs ~0.3 us here


@dataclass(frozen=True, slots=True)
class VersionStatus:
    version: int
    state: ModelState
    reason: str = ""


@dataclass(slots=True)
class ModelRecord:
    """Everything known about one model name: its loaded versions and every version's state."""

    name: str
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    status: dict[int, VersionStatus] = field(default_factory=dict)
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""  # why the model as a whole is unavailable (e.g. its config)
    config: ModelConfig | None = None

    def default_version(self) -> ModelVersion | None:
        """The highest ready version (the manager keeps versions in ascending order)."""
        for version in reversed(self.versions.values()):
            if version.state is _READY:
                return version
        return None


class Registry:
    def __init__(self) -> None:
        self._models: dict[str, ModelRecord] = {}
        self._routing: dict[str, ModelRouting] = {}

    def put(self, record: ModelRecord) -> None:
        self._models[record.name] = record

    def remove(self, name: str) -> ModelRecord | None:
        return self._models.pop(name, None)

    def forget(self, name: str) -> ModelRecord | None:
        """Remove a model and its routing state (it left the repository)."""
        self._routing.pop(name, None)
        return self._models.pop(name, None)

    def routing(self, name: str) -> ModelRouting:
        """The routing state of a model name, created on first use."""
        found = self._routing.get(name)
        if found is None:
            found = self._routing[name] = ModelRouting(name)
        return found

    def names(self) -> list[str]:
        return sorted(self._models)

    def records(self) -> list[ModelRecord]:
        return [self._models[n] for n in sorted(self._models)]

    def record(self, name: str) -> ModelRecord:
        found = self._models.get(name)
        if found is None:
            raise NotFound(f"unknown model '{name}'")
        return found

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The version that serves a request (``""``: the highest ready version)."""
        return _get(self.record(name), version)

    def route(
        self, name: str, version: str = "", label: str = "", request_id: str = ""
    ) -> ModelVersion:
        """The version that serves a request: by version, by label, else by the traffic split
        (hashing ``request_id`` when given), else the highest ready version."""
        record = self.record(name)
        routing = self._routing.get(name)
        if label:
            if version:
                raise InvalidInput("a request names a version or a version label, not both")
            if routing is None:
                raise NotFound(f"model '{name}' has no version label '{label}'")
            return _get(record, str(routing.label_version(label)))
        if not version and routing is not None and routing.policy.split:
            chosen = routing.split_choice(record, request_id)
            if chosen is not None:
                return chosen
        return _get(record, version)

    def mirror(self, model: ModelVersion, request: InferRequest, response: InferResponse) -> None:
        """Copy a served request to the model's shadow version, if it has one."""
        routing = self._routing.get(model.name)
        if routing is None or routing.policy.shadow is None:
            return
        record = self._models.get(model.name)
        if record is not None:
            routing.mirror(record, model, request, response)

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except (Unavailable, NotFound):
            return False
        return True


def _get(record: ModelRecord, version: str) -> ModelVersion:
    name = record.name
    if not version:
        chosen = record.default_version()
        if chosen is None:
            why = f": {record.reason}" if record.reason else ""
            raise Unavailable(f"model '{name}' has no ready version{why}")
        return chosen
    number = _parse_version(name, version)
    found = record.versions.get(number)
    if found is not None and found.state is _READY:
        return found
    status = record.status.get(number)
    if status is None:
        raise NotFound(f"unknown version '{version}' of model '{name}'")
    why = f": {status.reason}" if status.reason else ""
    raise Unavailable(f"version {number} of model '{name}' is {status.state.value}{why}")


def _parse_version(name: str, version: str) -> int:
    if not version.isdecimal() or int(version) < 1:
        raise NotFound(f"unknown version '{version}' of model '{name}'")
    return int(version)
