"""Read-only views the data plane hands to protocol adapters: frozen snapshots, never the live
registry records or model versions behind them.

Field names follow the KServe v2 / Triton documents they answer, so an adapter encodes a view
field by field (HTTP: ``orjson`` serializes these dataclasses to exactly Triton's JSON).
Statistics live beside their counters (``inferd.core.stats.ModelStatistics``) and routing beside its
policies (``inferd.plane.routing.RoutingView``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """An input or output as metadata reports it: -1 leads the shape when the model batches."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


# Residency states, as the index and the dashboard show them.
AVAILABLE = "available"  # in the repository, not loaded: the next request loads it
LOADING = "loading"
LOADED = "loaded"
EVICTED = "evicted"  # was loaded, unloaded to make room: the next request loads it again
FAILED = "failed"  # the last load on demand failed: requests answer its reason for a while


@dataclass(frozen=True, slots=True)
class ResidencyView:
    """One lazily served model: where it stands, what it holds, when it was last used."""

    state: str
    memory_bytes: int  # measured at its last load (0: never loaded)
    pinned: bool = False
    loads: int = 0
    loaded_unix_s: float | None = None
    last_used_unix_s: float | None = None
    evicted_unix_s: float | None = None
    reason: str = ""  # why the last load failed
    in_flight: int = 0  # requests it is running now (what keeps it from being evicted)


@dataclass(frozen=True, slots=True)
class ResidencyTotals:
    """Lazy serving as a whole: the budget, what is loaded, and what happened so far."""

    memory_budget_bytes: int  # 0: no bound on memory
    max_models: int  # 0: no bound on the number of loaded models
    models: int  # loaded now
    memory_bytes: int  # what the loaded models were measured to take
    loads: int
    load_failures: int
    evictions: int
    hits: int
    misses: int
    runtime_bytes: int = 0  # what the backends' runtimes took coming in (the budget counts it)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index (no version: the model as a whole)."""

    name: str
    version: str
    state: str
    reason: str
    residency: ResidencyView | None = None  # with lazy serving (``inferd.plane.demand``)


@dataclass(frozen=True, slots=True)
class VersionState:
    version: int
    state: str  # a ModelState value: READY, LOADING, UNLOADING, UNAVAILABLE
    reason: str  # why it is not READY ("unloaded": retired or unloaded)


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """Every known version of a model with its state, highest version first."""

    name: str
    versions: tuple[VersionState, ...]
