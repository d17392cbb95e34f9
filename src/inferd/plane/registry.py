"""The registry: models loaded in memory, routed by name, version, label or traffic split.

The repository manager writes records here; the data plane reads them (protocols never see
a record or a version). A record is replaced whole, so a request sees either the old set of
versions or the new one, never half. Each name's routing state (labels, split, shadow;
``inferd.plane.routing``, which decides with version numbers) outlives its reloads.

Lookup failures use Triton's wording, which client code tests with ``startswith``:
``Request for unknown model: 'm' is not found``, ``... 'm' version 3 is not found`` and
``failed to get model version from specified version string 'x' ...``.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import InvalidInput, NotFound, Unavailable
from inferd.plane.model import ModelState, ModelVersion
from inferd.plane.routing import ModelRouting, ShadowCounts

_READY = ModelState.READY  # a module constant: an enum attribute lookup costs ~0.3 us here
# A guess at a misspelt model name compares it with every name: bounded, as the name comes
# from the network.
_GUESS_MAX_NAMES = 5000
_GUESS_MAX_LENGTH = 200


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
        # Models with a version whose queue has a size limit: the only ones a frontend must
        # ask about before it reads a request's body (``DataPlane.admit``).
        self.queue_limited: set[str] = set()

    def put(self, record: ModelRecord) -> None:
        self._models[record.name] = record
        if any(getattr(v.scheduler, "queue_limited", False) for v in record.versions.values()):
            self.queue_limited.add(record.name)
        else:
            self.queue_limited.discard(record.name)

    def remove(self, name: str) -> ModelRecord | None:
        self.queue_limited.discard(name)
        return self._models.pop(name, None)

    def forget(self, name: str) -> ModelRecord | None:
        """Remove a model and its routing state (it left the repository)."""
        self._routing.pop(name, None)
        self.queue_limited.discard(name)
        return self._models.pop(name, None)

    def routing(self, name: str) -> ModelRouting:
        """The routing state of a model name, created on first use."""
        found = self._routing.get(name)
        if found is None:
            found = self._routing[name] = ModelRouting(name)
        return found

    def routing_of(self, name: str) -> ModelRouting | None:
        """The routing state of a model name if it has any (none is created)."""
        return self._routing.get(name)

    def shadow_counts(self, names: Iterable[str]) -> dict[str, ShadowCounts]:
        """The shadow counts of the named models that have routing state here."""
        found = ((name, self._routing.get(name)) for name in names)
        return {name: r.view().shadow_stats for name, r in found if r is not None}

    def shadowing(self, name: str) -> ModelRouting | None:
        """The routing state of a model that mirrors requests to a shadow version, else None."""
        found = self._routing.get(name)
        return found if found is not None and found.policy.shadow is not None else None

    def ready_version(self, name: str, number: int) -> ModelVersion | None:
        """A loaded READY version by number, else None."""
        record = self._models.get(name)
        if record is None:
            return None
        found = record.versions.get(number)
        return found if found is not None and found.state is _READY else None

    def names(self) -> list[str]:
        return sorted(self._models)

    def records(self) -> list[ModelRecord]:
        return [self._models[n] for n in sorted(self._models)]

    def record(self, name: str) -> ModelRecord:
        found = self._models.get(name)
        if found is None:
            raise NotFound(unknown_model(name, known=self._models))
        return found

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The version that serves a request (``""``: the highest ready version)."""
        return _get(self.record(name), version)

    def route(
        self, name: str, version: str = "", label: str = "", request_id: str = ""
    ) -> ModelVersion:
        """The version that serves a request: by version, by label, else by the traffic split
        (hashing ``request_id`` when given), else the highest ready version."""
        record = self._models.get(name)
        if record is None:
            raise NotFound(unknown_model(name, known=self._models))
        routing = self._routing.get(name)
        if not label and not version and (routing is None or not routing.splits):  # the usual
            default = record.default_version()
            if default is not None:
                return default
        if label:
            if version:
                raise InvalidInput("a request names a version or a version label, not both")
            if routing is None:
                raise NotFound(f"model '{name}' has no version label '{label}'")
            return _get(record, str(routing.label_version(label)))
        if not version and routing is not None and routing.splits:
            versions = record.versions

            def ready(number: int) -> bool:
                found = versions.get(number)
                return found is not None and found.state is _READY

            chosen = routing.split_choice(request_id, ready)
            if chosen is not None:
                return versions[chosen]
        return _get(record, version)

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except (Unavailable, NotFound):
            return False
        return True


def unknown_model(name: str, version: int | str | None = None, known: Collection[str] = ()) -> str:
    """Triton's words for a model (or a version of it) that is not there, then the closest of
    the ``known`` names, as for a misspelt flag: "...; did you mean 'half_plus_two'?"."""
    which = f" version {version}" if version is not None else ""
    found = f"Request for unknown model: '{name}'{which} is not found"
    if version is not None or len(name) > _GUESS_MAX_LENGTH or len(known) > _GUESS_MAX_NAMES:
        return found
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"{found}; did you mean '{close[0]}'?" if close else found


def _get(record: ModelRecord, version: str) -> ModelVersion:
    name = record.name
    if not version:
        chosen = record.default_version()
        if chosen is None:
            why = f": {record.reason}" if record.reason else ""
            raise Unavailable(f"model '{name}' has no ready version{why}")
        return chosen
    number = parse_version(version)
    found = record.versions.get(number)
    if found is not None and found.state is _READY:
        return found
    status = record.status.get(number)
    if status is None:
        raise NotFound(unknown_model(name, number))
    why = f": {status.reason}" if status.reason else ""
    raise Unavailable(f"version {number} of model '{name}' is {status.state.value}{why}")


def parse_version(version: str) -> int:
    """A version string as a number; a string that is not one is a client error in Triton's
    words (0 names no version and is not found)."""
    if version.isdecimal():
        return int(version)
    if version.startswith("-") and version[1:].isdecimal():
        raise InvalidInput(
            f"invalid model version specified '{version}' , version should be an integral value > 0"
        )
    raise InvalidInput(
        f"failed to get model version from specified version string '{version}' "
        "(details: not an integer), version should be an integral value > 0"
    )
