"""Recent traffic per model and for the server, sampled once a second from the statistics.

A background task reads every loaded version's ``ModelStats`` counters (what Triton's
statistics and ``/metrics`` already report), keeps the differences as one row per second for
the last 15 minutes, and answers them as JSON for the dashboard's charts. Nothing here runs
on the request path; an idle model stores no rows, so a thousand quiet models cost nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd.core.stats import BUCKETS_S, ModelStats
from inferd.plane.model import ModelVersion
from inferd.plane.registry import Registry

log = logging.getLogger("inferd.dashboard")

SAMPLE_INTERVAL_S = 1.0
WINDOW_S = 900.0  # 15 minutes
# The columns of one row, in order (rates per second, times in milliseconds).
FIELDS = (
    "t",  # wall-clock seconds since the epoch at the end of the interval
    "requests_per_s",
    "failures_per_s",
    "p50_ms",  # successful requests, estimated from the latency histogram
    "p99_ms",
    "queue_ms",  # mean per request finished in the interval
    "compute_ms",  # mean input + infer + output time per request
    "batch_size",  # mean rows per model execution
    "executions_per_s",
    "cache_hits_per_s",
    "cache_misses_per_s",
    "pending",  # requests inside the model at the end of the interval
)
_BOUNDS_MS = tuple(b * 1000.0 for b in BUCKETS_S)


@dataclass(frozen=True, slots=True)
class Counters:
    """The cumulative counters of one model version at one instant."""

    success: int = 0
    fail: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    compute_count: int = 0
    compute_ns: int = 0
    executions: int = 0
    rows: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    buckets: tuple[int, ...] = ()
    batches: tuple[tuple[int, int], ...] = ()  # (batch size, executions)

    @classmethod
    def read(cls, stats: ModelStats) -> Counters:
        return cls(
            success=stats.success.count,
            fail=stats.fail.count,
            queue_count=stats.queue.count,
            queue_ns=stats.queue.ns,
            compute_count=stats.compute_infer.count,
            compute_ns=stats.compute_input.ns + stats.compute_infer.ns + stats.compute_output.ns,
            executions=stats.execution_count,
            rows=stats.inference_count,
            cache_hits=stats.cache_hit.count,
            cache_misses=stats.cache_miss.count,
            buckets=tuple(stats.success.buckets),
            batches=tuple((s, b.compute_infer.count) for s, b in stats.batches.items()),
        )


ZERO = Counters()


@dataclass(slots=True)
class Delta:
    """What happened in one interval: the difference of two Counters (summed over versions)."""

    success: int = 0
    fail: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    compute_count: int = 0
    compute_ns: int = 0
    executions: int = 0
    rows: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    pending: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    batches: dict[int, int] = field(default_factory=dict)

    def add(self, now: Counters, before: Counters, pending: int) -> None:
        self.success += now.success - before.success
        self.fail += now.fail - before.fail
        self.queue_count += now.queue_count - before.queue_count
        self.queue_ns += now.queue_ns - before.queue_ns
        self.compute_count += now.compute_count - before.compute_count
        self.compute_ns += now.compute_ns - before.compute_ns
        self.executions += now.executions - before.executions
        self.rows += now.rows - before.rows
        self.cache_hits += now.cache_hits - before.cache_hits
        self.cache_misses += now.cache_misses - before.cache_misses
        self.pending += pending
        old = before.buckets
        for i, count in enumerate(now.buckets):
            self.buckets[i] += count - (old[i] if old else 0)
        if now.batches != before.batches:
            earlier = dict(before.batches)
            for size, count in now.batches:
                if count != earlier.get(size, 0):
                    self.batches[size] = self.batches.get(size, 0) + count - earlier.get(size, 0)

    def merge(self, other: Delta) -> None:
        for name in (
            "success",
            "fail",
            "queue_count",
            "queue_ns",
            "compute_count",
            "compute_ns",
            "executions",
            "rows",
            "cache_hits",
            "cache_misses",
            "pending",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for i, count in enumerate(other.buckets):
            self.buckets[i] += count
        for size, count in other.batches.items():
            self.batches[size] = self.batches.get(size, 0) + count

    def idle(self) -> bool:
        return not (self.success or self.fail or self.executions or self.pending)

    def row(self, t: float, seconds: float) -> tuple[float, ...]:
        """One row of FIELDS."""
        per_s = 1.0 / seconds if seconds > 0 else 0.0
        return (
            round(t, 3),
            round((self.success + self.fail) * per_s, 3),
            round(self.fail * per_s, 3),
            quantile_ms(self.buckets, 0.50),
            quantile_ms(self.buckets, 0.99),
            _mean_ms(self.queue_ns, self.queue_count),
            _mean_ms(self.compute_ns, self.compute_count),
            round(self.rows / self.executions, 2) if self.executions else 0.0,
            round(self.executions * per_s, 3),
            round(self.cache_hits * per_s, 3),
            round(self.cache_misses * per_s, 3),
            float(self.pending),
        )


def _mean_ms(total_ns: int, count: int) -> float:
    return round(total_ns / count / 1e6, 4) if count > 0 else 0.0


def quantile_ms(buckets: Sequence[int], q: float) -> float:
    """The q-quantile of a latency histogram (counts per bucket, the last one unbounded), by
    linear interpolation inside the bucket, as Prometheus' histogram_quantile does; 0 when
    empty. An answer in the unbounded bucket is the largest finite bound."""
    total = sum(buckets)
    if total <= 0:
        return 0.0
    rank = q * total
    seen = 0
    for i, count in enumerate(buckets):
        if count and seen + count >= rank:
            if i >= len(_BOUNDS_MS):
                return _BOUNDS_MS[-1]
            low = _BOUNDS_MS[i - 1] if i > 0 else 0.0
            high = _BOUNDS_MS[i]
            return round(low + (high - low) * (rank - seen) / count, 4)
        seen += count
    return _BOUNDS_MS[-1]


@dataclass(slots=True)
class _History:
    """The non-idle rows of one model (or the server) in the window, and its batch sizes."""

    rows: collections.deque[tuple[float, ...]] = field(default_factory=collections.deque)
    batches: collections.deque[tuple[float, dict[int, int]]] = field(
        default_factory=collections.deque
    )
    batch_totals: dict[int, int] = field(default_factory=dict)

    def append(self, row: tuple[float, ...], batches: dict[int, int]) -> None:
        self.rows.append(row)
        if batches:
            self.batches.append((row[0], batches))
            for size, count in batches.items():
                self.batch_totals[size] = self.batch_totals.get(size, 0) + count

    def trim(self, oldest_t: float) -> None:
        while self.rows and self.rows[0][0] < oldest_t:
            self.rows.popleft()
        while self.batches and self.batches[0][0] < oldest_t:
            _, gone = self.batches.popleft()
            for size, count in gone.items():
                left = self.batch_totals.get(size, 0) - count
                if left > 0:
                    self.batch_totals[size] = left
                else:
                    self.batch_totals.pop(size, None)

    def since(self, after: float) -> list[tuple[float, ...]]:
        newer: list[tuple[float, ...]] = []
        for row in reversed(self.rows):
            if row[0] <= after:
                break
            newer.append(row)
        newer.reverse()
        return newer


class TrafficSeries:
    """The sampler and its 15-minute window."""

    def __init__(
        self,
        registry: Registry,
        interval_s: float = SAMPLE_INTERVAL_S,
        window_s: float = WINDOW_S,
    ) -> None:
        self.registry = registry
        self.interval_s = interval_s
        self.window_s = window_s
        self.server = _History()
        self.models: dict[str, _History] = {}
        # The last counters read per live version object (a reload starts a new one at zero).
        self._last: dict[int, tuple[ModelVersion, Counters]] = {}
        self._last_mono = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def _versions(self) -> Iterable[ModelVersion]:
        for record in self.registry.records():
            yield from record.versions.values()

    def sample(self, now_t: float | None = None, now_mono: float | None = None) -> None:
        """Read every loaded version's counters and store one row per model that did
        something, and one for the server, for the interval since the last sample."""
        now_t = time.time() if now_t is None else now_t
        now_mono = time.monotonic() if now_mono is None else now_mono
        seconds = max(now_mono - self._last_mono, 1e-6)
        self._last_mono = now_mono
        per_model: dict[str, Delta] = {}
        seen: dict[int, tuple[ModelVersion, Counters]] = {}
        for version in self._versions():
            counters = Counters.read(version.stats)
            key = id(version)
            previous = self._last.get(key)
            before = previous[1] if previous is not None and previous[0] is version else ZERO
            seen[key] = (version, counters)
            if counters == before and not version.stats.pending:
                continue
            delta = per_model.get(version.name)
            if delta is None:
                delta = per_model[version.name] = Delta()
            delta.add(counters, before, version.stats.pending)
        self._last = seen
        total = Delta()
        for name, delta in per_model.items():
            if delta.idle():
                continue
            total.merge(delta)
            history = self.models.get(name)
            if history is None:
                history = self.models[name] = _History()
            history.append(delta.row(now_t, seconds), delta.batches)
        self.server.append(total.row(now_t, seconds), total.batches)
        oldest = now_t - self.window_s
        self.server.trim(oldest)
        for name in list(self.models):
            history = self.models[name]
            history.trim(oldest)
            if not history.rows:
                del self.models[name]

    def as_json(self, after: float = 0.0, model: str = "") -> dict[str, Any]:
        """Rows newer than ``after`` (wall-clock seconds), for the server and each model
        (only ``model`` when given), with each model's batch sizes over the window."""
        models = {
            name: {
                "rows": history.since(after),
                "batch_sizes": {str(s): c for s, c in sorted(history.batch_totals.items())},
            }
            for name, history in sorted(self.models.items())
            if not model or name == model
        }
        return {
            "interval_s": self.interval_s,
            "window_s": self.window_s,
            "now": round(time.time(), 3),
            "fields": FIELDS,
            "server": {
                "rows": self.server.since(after),
                "batch_sizes": {str(s): c for s, c in sorted(self.server.batch_totals.items())},
            },
            "models": models,
        }

    def start(self) -> None:
        if self._task is None:
            self._last_mono = time.monotonic()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def until_next(self, now_t: float | None = None) -> float:
        """Seconds to the next sample: the middle of an interval of the wall clock, at least
        a tenth of an interval away (a sleep that woke early does not sample twice). Every
        worker of a server samples the same wall-clock seconds, so the rows that add up per
        second (``workers.merge``) cover the same requests: a frontend counts a forwarded
        request and the model host its execution within a few milliseconds, which samples at
        different phases would put in different seconds."""
        now_t = time.time() if now_t is None else now_t
        interval = self.interval_s
        wait = interval - (now_t - interval / 2) % interval
        return wait + interval if wait < interval / 10 else wait

    async def _run(self) -> None:
        while True:  # a loop that was blocked waits for the next mid-interval: no burst
            await asyncio.sleep(self.until_next())
            try:
                self.sample()
            except Exception:  # a sampling bug must not stop the server or the sampler
                log.exception("sampling traffic statistics failed")
