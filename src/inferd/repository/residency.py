"""Lazy serving: every model of the repository available, only some loaded, under one budget.

With ``--model-memory-budget`` or ``--max-loaded-models`` nothing loads at start (but pinned
models); the first request for a model loads it while every request for it waits on that one
load. A load first makes room: the least recently used idle models are unloaded until the new
one fits, never a model with requests in flight, one pinned (``--pin-model``, or the config
parameter ``pinned``), or one a loaded model needs. Loads and evictions run one at a time, so
each model's memory is measured as the growth of the process tree's resident set across its
load (or taken from its ``memory_bytes`` parameter); that figure is what the budget counts.
The budget also counts each backend's runtime, measured as it comes in, and a model is counted
at least its files and their usual excess (``inferd.repository.memory.LoadCosts``).
A load that fails answers 503 with its reason, for ``FAILED_RETRY_S``, and holds no budget.

The budget belongs to the server (one ``Residency`` per model manager), not to a process: with
several serving processes it is the model host's, which loads on behalf of the frontends
(``inferd.workers.demand_host``); the requests they forward are held here (``hold``) while
they run, so they count as use and keep their model loaded as the host's own requests do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial

from inferd.backends import get_backend
from inferd.backends.completion import bool_parameter
from inferd.core.errors import InferdError, NotFound, Unavailable
from inferd.core.stats import Duration
from inferd.core.views import (
    AVAILABLE,
    EVICTED,
    FAILED,
    LOADED,
    LOADING,
    ResidencyTotals,
    ResidencyView,
)
from inferd.plane.demand import Described, wait_load
from inferd.plane.model import ModelState
from inferd.plane.registry import ModelRecord
from inferd.repository.describe import describe
from inferd.repository.loader import MEMORY_PARAMETER, PIN_PARAMETER
from inferd.repository.manager import ModelManager
from inferd.repository.memory import LoadCosts, tree_rss_bytes

log = logging.getLogger("inferd.repository")

ROOM_WAIT_S = 30.0  # a load waits at most this long for busy models to make room
ROOM_POLL_S = 0.01
FAILED_RETRY_S = 10.0  # requests for a model that failed to load get its reason this long
DEFAULT_BACKEND = "onnxruntime"  # primed by the first load: a dependency, the usual backend


@dataclass(frozen=True, slots=True)
class Budget:
    memory_bytes: int = 0  # 0: no bound on memory
    max_models: int = 0  # 0: no bound on the number of loaded models
    pinned: frozenset[str] = frozenset()  # --pin-model: loaded at start, never evicted

    def fits(self, models: int, memory_bytes: int) -> bool:
        if self.max_models and models > self.max_models:
            return False
        return not self.memory_bytes or memory_bytes <= self.memory_bytes


@dataclass(slots=True)
class Counters:
    """What the metrics export (``inferd.observability.residency_metrics``)."""

    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    misses: int = 0  # requests that found their model not loaded
    load_duration: Duration = field(default_factory=Duration)  # cold loads that succeeded


@dataclass(slots=True)
class _Resident:
    memory_bytes: int
    loaded_unix_s: float
    pinned: bool
    files_bytes: int = 0
    declared: bool = False  # its memory_bytes parameter says what it takes


@dataclass(frozen=True, slots=True)
class _Failure:
    reason: str
    at_mono: float


class Residency:
    """The ``OnDemand`` of ``inferd.plane.demand``: loads, evicts and accounts for models."""

    def __init__(
        self,
        manager: ModelManager,
        budget: Budget,
        measure: Callable[[], int] = tree_rss_bytes,
    ) -> None:
        self.manager = manager
        self.registry = manager.registry
        self.budget = budget
        self.measure = measure
        self.hits = 0  # counted by the data plane
        self.counters = Counters()
        # Hits and misses counted by the other serving processes (``summary`` adds them).
        self.elsewhere: Callable[[], Awaitable[tuple[int, int]]] | None = None
        self._held: dict[str, int] = {}  # requests run for another process, by model
        self._used: dict[str, float] = {}  # when such a request last ended (unix time)
        self._residents: dict[str, _Resident] = {}
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._changes = asyncio.Lock()  # one load or eviction at a time
        self._failures: dict[str, _Failure] = {}
        self._evicted: dict[str, float] = {}  # unix time
        self._memory: dict[str, int] = {}  # each model's last measured (or declared) bytes
        self._load_counts: dict[str, int] = {}
        # Backends whose framework is in memory: a model's load then measures the model only.
        self._primed: set[str] = set()
        self._prime_tried: set[str] = set()
        self.costs = LoadCosts()  # the backends' runtimes, and the least a model is counted

    # ------------------------------------------------------------------ what requests ask

    def serves(self, name: str) -> bool:
        return name in self.manager.catalog.names

    def available(self, name: str) -> bool:
        return self._failed(name) is None

    def _failed(self, name: str) -> str | None:
        failure = self._failures.get(name)
        if failure is None or time.monotonic() - failure.at_mono > FAILED_RETRY_S:
            return None
        return failure.reason

    def failures(self) -> dict[str, str]:
        """The models whose last load failed, with the reason requests are answered."""
        found = ((name, self._failed(name)) for name in list(self._failures))
        return {name: reason for name, reason in found if reason is not None}

    def hold(self, name: str, requests: int = 1) -> None:
        """Requests for ``name`` that another serving process forwarded are running (they
        skip ``ModelVersion.infer``, which the in-flight count reads otherwise)."""
        self._held[name] = self._held.get(name, 0) + requests

    def release(self, name: str, requests: int = 1) -> None:
        """Held requests are answered: their model was used now."""
        left = self._held.get(name, 0) - requests
        if left > 0:
            self._held[name] = left
        else:
            self._held.pop(name, None)
        self._used[name] = time.time()

    async def ensure(self, name: str, timeout_s: float | None, *, miss: bool = True) -> None:
        """As ``OnDemand.ensure``; ``miss``: count a miss (false: another serving process
        counted it, and asks on behalf of its requests)."""
        if self.registry.is_ready(name):
            return
        reason = self._failed(name)
        if reason is not None:
            raise Unavailable(reason)
        self.counters.misses += miss
        task = self._loads.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._bring_in(name))
            self._loads[name] = task
            task.add_done_callback(partial(self._done, name))
        await wait_load(task, name, timeout_s)

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._loads.get(name) is task:
            del self._loads[name]
        if not task.cancelled():
            task.exception()  # reported to every waiter; none may be left

    async def describe(self, name: str) -> Described | None:
        place = self.manager.catalog.listing.found.get(name)
        if place is None:
            return None
        storage, files = place
        return await asyncio.to_thread(describe, name, storage, files)

    # ------------------------------------------------------------------ start

    async def start(self, preload: list[str]) -> None:
        """Load the pinned models and ``preload`` (``--load-model``) once the stores are
        listed; one that cannot load is logged, as at any start."""
        for name in sorted(self.budget.pinned) + [n for n in preload if n != "*"]:
            if not self.serves(name):
                log.error("cannot load model '%s': no such model in the repository", name)
                continue
            try:
                await self.ensure(name, None)
            except InferdError as exc:
                log.error("model '%s' did not load at start: %s", name, exc.message)
        pinned = sum(r.memory_bytes for r in self._residents.values() if r.pinned)
        if self.budget.memory_bytes and pinned > self.budget.memory_bytes:
            log.warning(
                "pinned models hold %d MiB, over the memory budget of %d MiB: every other load "
                "goes over it",
                pinned >> 20,
                self.budget.memory_bytes >> 20,
            )

    # ------------------------------------------------------------------ load

    async def _prime(self, name: str) -> None:
        """Bring a backend's framework into memory before the first load measures (not at
        start: importing it would hold the event loop while the server comes up)."""
        self._prime_tried.add(name)
        try:
            backend = get_backend(name)
            before = await asyncio.to_thread(self.measure)
            if await asyncio.to_thread(backend.prime):
                grown = await asyncio.to_thread(self.measure) - before
                self.costs.runtime_in(name, grown, self.budget.memory_bytes)
                self._primed.add(name)
        except Exception as exc:  # a backend that cannot load says so with its first model
            log.warning("could not prime backend '%s': %s", name, exc)

    async def _bring_in(self, name: str) -> None:
        async with self._changes:
            if self.registry.is_ready(name):
                return  # loaded meanwhile (a load call, a dependency of another model)
            if self.costs.baseline is None:  # before any runtime came in
                self.costs.baseline = await asyncio.to_thread(self.measure)
            if DEFAULT_BACKEND not in self._prime_tried:
                await self._prime(DEFAULT_BACKEND)
            await self._make_room(name, self._estimate(name))
            before = await asyncio.to_thread(self.measure)
            started = time.perf_counter_ns()
            reason = ""
            try:
                outcome = await self.manager.load(name)
                reason = outcome.reason
            except InferdError as exc:
                reason = exc.message
            if not self.registry.is_ready(name):
                self.counters.load_failures += 1
                message = f"model '{name}' could not be loaded on demand: {reason}"
                self._failures[name] = _Failure(message, time.monotonic())
                log.error("%s", message)
                raise Unavailable(message)
            took_ns = time.perf_counter_ns() - started
            after = await asyncio.to_thread(self.measure)
            grown = after - before
            self._failures.pop(name, None)
            self._evicted.pop(name, None)
            record = self.registry.record(name)
            backend = record.config.backend if record.config is not None else ""
            if backend not in self._primed:  # its runtime loaded with it: not the model's
                self._primed.add(backend)
                self.costs.runtime_in(backend, grown - self._files(name), self.budget.memory_bytes)
                grown = 0
            self._adopt(name, record, grown)
            self._observe(after)
            self.counters.loads += 1
            self.counters.load_duration.add(took_ns)
            self._load_counts[name] = self._load_counts.get(name, 0) + 1
            log.info(
                "loaded model '%s' on demand in %.3f s: %.1f MiB; %d model(s), %.1f MiB loaded",
                name,
                took_ns / 1e9,
                self._residents[name].memory_bytes / (1 << 20),
                len(self._residents),
                self.resident_bytes() / (1 << 20),
            )
            await self._make_room(name, 0, wait=False)  # it measured more than expected
            await self._trim_caches()

    def _estimate(self, name: str) -> int:
        """What a model will hold: its files and what loaded models take beyond theirs, or
        more if its last load was measured to take more."""
        return max(self._memory.get(name, 0), self.costs.least(self._files(name)))

    def _observe(self, tree_bytes: int) -> None:
        residents = list(self._residents.values())
        declared = sum(r.memory_bytes for r in residents if r.declared)
        files = [r.files_bytes for r in residents if not r.declared]
        self.costs.observe(tree_bytes, files, declared)

    def _files(self, name: str) -> int:
        place = self.manager.catalog.listing.found.get(name)
        return sum(size for size, _ in place[1].values()) if place is not None else 0

    def _adopt(self, name: str, record: ModelRecord, grown: int) -> None:
        """Account for a loaded model: its declared memory, else the growth measured across
        its load but at least the least a model is counted (``LoadCosts``), else (nothing
        seen grow, or a load made elsewhere) the estimate."""
        parameters: dict[str, str] = {}
        if record.config is not None:
            parameters = {k: v.string_value for k, v in record.config.parameters.items()}
        declared = parameters.get(MEMORY_PARAMETER, "")
        pinned = name in self.budget.pinned or bool_parameter(parameters, PIN_PARAMETER)
        files, stated = self._files(name), declared.strip().isdecimal()
        if stated:
            memory = self._memory[name] = int(declared)
        elif grown > 0:
            self._memory[name] = grown  # as measured: the estimate of its next load
            memory = max(grown, self.costs.least(files))
        else:
            memory = self._estimate(name)
        self._residents[name] = _Resident(memory, time.time(), pinned, files, stated)
        if not pinned:
            self.manager.wanted.discard(name)  # readiness does not wait for it after eviction

    # ------------------------------------------------------------------ eviction

    def resident_bytes(self) -> int:
        return sum(r.memory_bytes for r in dict(self._residents).values())

    def _sync(self) -> None:
        """Follow loads and unloads made elsewhere (load and unload calls, polls)."""
        serving = {r.name: r for r in self.registry.records() if r.versions}
        for name in [n for n in self._residents if n not in serving]:
            del self._residents[name]
        for name, record in serving.items():
            if name not in self._residents:
                self._adopt(name, record, 0)

    async def _make_room(self, name: str, need: int, wait: bool = True) -> None:
        """Evict idle models until ``need`` more bytes (and, with ``wait``, one more model)
        fit; with ``wait``, wait for busy ones, else stop when no idle one is left."""
        deadline = time.monotonic() + ROOM_WAIT_S
        adding = 1 if wait else 0
        while True:
            self._sync()
            held = self.resident_bytes() + self.costs.runtime_bytes()
            if self.budget.fits(len(self._residents) + adding, held + need):
                return
            victim = self._victim(name)
            if victim is not None:
                await self._evict(victim, name)
                continue
            if not wait:
                log.warning(
                    "over the budget: %d model(s), %d MiB loaded, none of them idle or unpinned",
                    len(self._residents),
                    self.resident_bytes() >> 20,
                )
                return
            busy = [n for n, r in self._residents.items() if not r.pinned and self._busy(n)]
            if not busy:  # only pinned models left: waiting frees nothing
                self._beyond_budget(name)
                return
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"model '{name}' cannot be loaded: the budget is held by pinned models and "
                    f"{len(busy)} model(s) with requests in flight; try again later"
                )
            await asyncio.sleep(ROOM_POLL_S)

    def _beyond_budget(self, name: str) -> None:
        """Unavailable when pinned models fill --max-loaded-models. (Memory beyond the budget
        is only warned about: a figure may have been measured wrong, and is again next load.)"""
        pinned = sum(r.pinned for r in self._residents.values())
        if self.budget.max_models and pinned >= self.budget.max_models:
            raise Unavailable(
                f"model '{name}' cannot be loaded: {pinned} pinned model(s) fill "
                f"--max-loaded-models {self.budget.max_models}"
            )
        log.warning(
            "loading model '%s' over the memory budget: the pinned models hold %d MiB",
            name,
            sum(r.memory_bytes for r in self._residents.values() if r.pinned) >> 20,
        )

    def _busy(self, name: str) -> bool:
        """Requests in flight, versions changing, or a loaded model that needs it."""
        try:
            record = self.registry.record(name)
        except NotFound:  # gone already (a poll saw it leave)
            return False
        if record.state is not ModelState.READY or self._in_flight(name, record):
            return True
        serving = self._residents.keys()
        return any(user in serving for user in self.manager.lifecycle.graph.users(name))

    def _in_flight(self, name: str, record: ModelRecord) -> int:
        """Requests running on the model: its own and those held for other processes."""
        return self._held.get(name, 0) + sum(v.stats.pending for v in record.versions.values())

    def _running(self, name: str) -> int:
        try:
            return self._in_flight(name, self.registry.record(name))
        except NotFound:
            return self._held.get(name, 0)

    def _last_used(self, name: str) -> float:
        resident = self._residents.get(name)
        loaded = resident.loaded_unix_s if resident is not None else 0.0
        loaded = max(loaded, self._used.get(name, 0.0))
        try:
            versions = self.registry.record(name).versions.values()
        except NotFound:  # unloaded elsewhere (a poll saw it leave): _sync forgets it next
            return loaded
        last_ms = max((v.stats.last_inference_ms for v in versions), default=0)
        return max(last_ms / 1000, loaded)

    def _victim(self, keep: str) -> str | None:
        """The least recently used model that may be evicted now, if any."""
        idle = [
            n
            for n, r in self._residents.items()
            if n != keep and not r.pinned and n not in self._loads and not self._busy(n)
        ]
        return min(idle, key=self._last_used, default=None)

    async def _evict(self, name: str, newcomer: str) -> None:
        async with self.manager.locked(name):
            if self._busy(name):  # a request arrived since it was chosen
                return
            idle_s = time.time() - self._last_used(name)
            await self.manager.unload_locked(name)
        self._residents.pop(name, None)
        self._evicted[name] = time.time()
        self.counters.evictions += 1
        log.info("evicted model '%s' (idle %.1f s) to make room for '%s'", name, idle_s, newcomer)

    async def _trim_caches(self) -> None:
        """Keep each remote store's local cache within its size (``--model-cache-max-bytes``):
        the files of loaded models stay."""
        keep = frozenset(self._residents) | frozenset(self._loads)
        for storage in self.manager.storages:
            trim = getattr(storage, "trim_cache", None)
            if trim is not None:
                await asyncio.to_thread(trim, keep)

    # ------------------------------------------------------------------ what the server shows

    def views(self) -> Mapping[str, ResidencyView]:
        found: dict[str, ResidencyView] = {}
        for name in self.manager.catalog.names | self._residents.keys():
            resident = self._residents.get(name)
            failed = self._failed(name)
            if name in self._loads:
                state = LOADING
            elif resident is not None:
                state = LOADED
            elif failed is not None:
                state = FAILED
            else:
                state = EVICTED if name in self._evicted else AVAILABLE
            found[name] = ResidencyView(
                state=state,
                memory_bytes=resident.memory_bytes if resident else self._memory.get(name, 0),
                pinned=resident.pinned if resident else name in self.budget.pinned,
                loads=self._load_counts.get(name, 0),
                loaded_unix_s=resident.loaded_unix_s if resident else None,
                last_used_unix_s=self._last_used(name) if resident else None,
                evicted_unix_s=self._evicted.get(name),
                reason=failed or "",
                in_flight=self._running(name) if resident else 0,
            )
        return found

    async def survey(self) -> Mapping[str, ResidencyView]:
        return self.views()

    async def summary(self) -> ResidencyTotals:
        totals = self.totals()
        if self.elsewhere is None:
            return totals
        hits, misses = await self.elsewhere()
        return replace(totals, hits=totals.hits + hits, misses=totals.misses + misses)

    def totals(self) -> ResidencyTotals:
        counters = self.counters
        return ResidencyTotals(
            memory_budget_bytes=self.budget.memory_bytes,
            max_models=self.budget.max_models,
            models=len(self._residents),
            memory_bytes=self.resident_bytes(),
            loads=counters.loads,
            load_failures=counters.load_failures,
            evictions=counters.evictions,
            hits=self.hits,
            misses=counters.misses,
            runtime_bytes=self.costs.runtime_bytes(),
        )

    def resident(self) -> dict[str, int]:
        """The loaded models and the bytes each is counted for (a copy first: the metrics
        port reads this from its own thread)."""
        return {name: r.memory_bytes for name, r in dict(self._residents).items()}
