"""Lazy serving as the data plane sees it: models listed as available, loaded on first use.

With a memory budget (``--model-memory-budget`` / ``--max-loaded-models``) the repository
keeps only some models loaded; ``OnDemand`` is what the data plane asks when a request names a
model that is not: whether it serves that name, to load it (the request waits, bounded by its
``timeout`` parameter), and for its config when metadata can answer without loading. The
repository side implements it (``inferd.repository.residency``), and so does a frontend worker,
which asks the model host (``inferd.workers.demand_frontend``); the plane imports neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.spec import build_spec
from inferd.core.errors import InvalidInput, NotFound, Unavailable
from inferd.core.types import InferRequest
from inferd.core.views import ModelMetadata, ResidencyTotals, ResidencyView, TensorMetadata
from inferd.plane.registry import unknown_model


@dataclass(frozen=True, slots=True)
class Described:
    """A model's config as its repository holds it, complete enough to answer metadata and
    config calls without loading, and the versions its policy serves."""

    config: ModelConfig
    versions: tuple[int, ...]


class OnDemand(Protocol):
    hits: int  # requests that found their model loaded (the data plane counts them)

    def serves(self, name: str) -> bool:
        """Whether ``name`` is a model of the repository served on demand."""
        ...

    def available(self, name: str) -> bool:
        """Whether a request for ``name`` can be served (its last load did not fail)."""
        ...

    async def ensure(self, name: str, timeout_s: float | None) -> None:
        """Return once the model is loaded (one load however many wait); Unavailable with the
        reason when it cannot load, or when ``timeout_s`` passes first."""
        ...

    async def describe(self, name: str) -> Described | None:
        """The model's config when it says enough for metadata (None: load it to know)."""
        ...

    async def survey(self) -> Mapping[str, ResidencyView]:
        """Every model of the repository and its residency (the server's: with several
        serving processes, the model host's)."""
        ...

    async def summary(self) -> ResidencyTotals:
        """The budget, what is loaded and the counters (hits and misses: every serving
        process's)."""
        ...


def timeout_s(request: InferRequest) -> float | None:
    """The request's ``timeout`` parameter (microseconds, Triton's) in seconds; None when it
    has none (or 0, which the schedulers read as none too)."""
    value = request.parameters.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"parameter 'timeout' must be a non-negative integer, got {value!r}")
    return value / 1e6 if value else None


async def wait_load(load: asyncio.Task[None], name: str, timeout_s: float | None) -> None:
    """Wait for a model's load (shared with other requests) at most ``timeout_s``; past it,
    Unavailable, and the load goes on for the next request."""
    try:
        await asyncio.wait_for(asyncio.shield(load), timeout_s)
    except TimeoutError:
        raise Unavailable(
            f"model '{name}' did not load within the request's timeout ({timeout_s:g} s); "
            "its load goes on"
        ) from None


T = TypeVar("T")


async def answer(
    demand: OnDemand,
    name: str,
    loaded: Callable[[], T],
    from_config: Callable[[str, Described, str], T],
    version: str = "",
) -> T:
    """A metadata or config call for a model that is not loaded: from its config when that
    says enough, else from the model, loaded first."""
    described = await demand.describe(name)
    if described is not None:
        return from_config(name, described, version)
    await demand.ensure(name, None)
    return loaded()


def config(name: str, described: Described, version: str = "") -> ModelConfig:
    """A copy of the repository's config of a model that is not loaded."""
    check_version(described, name, version)
    found = ModelConfig()
    found.CopyFrom(described.config)
    return found


def check_version(described: Described, name: str, version: str) -> None:
    """NotFound when ``version`` names a version the described model does not serve."""
    if version and (not version.isdecimal() or int(version) not in described.versions):
        raise NotFound(unknown_model(name, version))


def metadata(name: str, described: Described, version: str = "") -> ModelMetadata:
    """Model metadata from the config alone, as a loaded version would report it."""
    check_version(described, name, version)
    spec = build_spec(described.config)
    batch = spec.max_batch_size
    return ModelMetadata(
        name=name,
        versions=tuple(str(v) for v in described.versions),
        platform=spec.platform,
        inputs=tuple(
            TensorMetadata(t.name, t.datatype.name, tuple(t.shape(batch))) for t in spec.inputs
        ),
        outputs=tuple(
            TensorMetadata(t.name, t.datatype.name, tuple(t.shape(batch))) for t in spec.outputs
        ),
    )
