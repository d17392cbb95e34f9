"""From measurement windows to one row per load level: merging, the stability rule, statistics.

perf_analyzer's rule: a level is stable when, over its last 3 windows, throughput and
latency (the average, or ``--percentile``) each stay within ``stability_pct`` of their mean.
A row reports those last windows merged: every latency of every worker in them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

STABLE_WINDOWS = 3
CPU_SATURATED_PCT = 90.0

COLUMNS: tuple[str, ...] = (
    "concurrency",
    "request_rate",
    "throughput_infer_per_s",
    "latency_avg_ms",
    "latency_p50_ms",
    "latency_p90_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "errors",
    "requests",
    "server_queue_us",
    "server_compute_us",
    "client_cpu_saturated",
)
EXTRA_COLUMNS: tuple[str, ...] = (
    "achieved_request_rate",
    "request_rate_deviation_pct",
    "client_cpu_pct",
    "stable",
    "windows",
    "batch_size",
    "server",
    "model",
    "protocol",
    "first_error",
)
_FIXED_PERCENTILES = (50, 90, 95, 99)


def columns(percentile: int | None) -> tuple[str, ...]:
    """Every column in order; ``latency_p{P}_ms`` follows p99 for another ``--percentile``."""
    if percentile is None or percentile in _FIXED_PERCENTILES:
        return COLUMNS + EXTRA_COLUMNS
    at = COLUMNS.index("latency_p99_ms") + 1
    return (*COLUMNS[:at], f"latency_p{percentile}_ms", *COLUMNS[at:], *EXTRA_COLUMNS)


@dataclass(frozen=True, slots=True)
class WindowReport:
    """What one worker process saw in one window."""

    worker: int
    level: int
    window: int
    latencies_ns: np.ndarray  # int64, successful requests completed in the window
    errors: int
    sent: int
    cpu_s: float
    wall_s: float
    first_error: str | None


@dataclass(frozen=True, slots=True)
class Window:
    """One window, every worker merged."""

    latencies_ns: np.ndarray
    errors: int
    sent: int
    duration_s: float
    cpu_s: tuple[float, ...]  # per worker
    wall_s: tuple[float, ...]
    first_error: str | None

    @property
    def throughput_rps(self) -> float:
        return self.latencies_ns.size / self.duration_s if self.duration_s > 0 else 0.0

    def latency_ms(self, percentile: int | None) -> float | None:
        if self.latencies_ns.size == 0:
            return None
        if percentile is None:
            return float(self.latencies_ns.mean()) / 1e6
        return float(np.percentile(self.latencies_ns, percentile)) / 1e6


def merge(reports: Sequence[WindowReport]) -> Window:
    walls = tuple(r.wall_s for r in reports)
    return Window(
        latencies_ns=np.concatenate([r.latencies_ns for r in reports]),
        errors=sum(r.errors for r in reports),
        sent=sum(r.sent for r in reports),
        duration_s=sum(walls) / len(walls) if walls else 0.0,
        cpu_s=tuple(r.cpu_s for r in reports),
        wall_s=walls,
        first_error=next((r.first_error for r in reports if r.first_error), None),
    )


def within(values: Sequence[float], pct: float) -> bool:
    mean = sum(values) / len(values)
    if mean == 0:
        return all(v == 0 for v in values)
    return all(abs(v - mean) <= mean * pct / 100 for v in values)


def is_stable(windows: Sequence[Window], pct: float, percentile: int | None) -> bool:
    """perf_analyzer's rule over the last 3 windows."""
    if len(windows) < STABLE_WINDOWS:
        return False
    last = windows[-STABLE_WINDOWS:]
    latencies = [w.latency_ms(percentile) for w in last]
    if any(lat is None for lat in latencies):
        return all(w.throughput_rps == 0 for w in last)  # every request failed: steadily
    values = [lat for lat in latencies if lat is not None]
    return within([w.throughput_rps for w in last], pct) and within(values, pct)


def summarize(
    windows: Sequence[Window],
    *,
    stable: bool,
    batch_size: int,
    percentile: int | None,
    concurrency: int | None = None,
    request_rate: float | None = None,
    server_us: tuple[float | None, float | None] = (None, None),
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The row of one level, from its last (up to 3) windows."""
    used = windows[-STABLE_WINDOWS:]
    latencies = np.concatenate([w.latencies_ns for w in used]) if used else np.empty(0)
    duration = sum(w.duration_s for w in used)
    ok, errors = int(latencies.size), sum(w.errors for w in used)
    wanted = sorted({*_FIXED_PERCENTILES, *([percentile] if percentile else [])})
    if ok:
        values = np.percentile(latencies, wanted) / 1e6
        by_percentile = {p: round(float(v), 4) for p, v in zip(wanted, values, strict=True)}
        avg: float | None = round(float(latencies.mean()) / 1e6, 4)
    else:
        by_percentile, avg = {}, None
    cpu_pct = _cpu_pct(used)
    sent_rate = sum(w.sent for w in used) / duration if duration else 0.0
    row: dict[str, Any] = {
        "concurrency": concurrency,
        "request_rate": request_rate,
        "throughput_infer_per_s": round(ok * batch_size / duration, 2) if duration else 0.0,
        "latency_avg_ms": avg,
        **{f"latency_p{p}_ms": by_percentile.get(p) for p in wanted},
        "errors": errors,
        "requests": ok + errors,
        "server_queue_us": _round(server_us[0]),
        "server_compute_us": _round(server_us[1]),
        "client_cpu_saturated": cpu_pct > CPU_SATURATED_PCT,
        "achieved_request_rate": round(sent_rate, 2) if request_rate is not None else None,
        "request_rate_deviation_pct": (
            round((sent_rate - request_rate) / request_rate * 100, 2)
            if request_rate is not None
            else None
        ),
        "client_cpu_pct": round(cpu_pct, 1),
        "stable": stable,
        "windows": len(windows),
        "batch_size": batch_size,
        **(labels or {}),
        "first_error": next((w.first_error for w in windows if w.first_error), None),
    }
    return {name: row.get(name) for name in columns(percentile)}


def _cpu_pct(windows: Sequence[Window]) -> float:
    """CPU of the busiest worker process, in % of one core, over the windows."""
    if not windows:
        return 0.0
    workers = len(windows[0].cpu_s)
    busiest = 0.0
    for i in range(workers):
        wall = sum(w.wall_s[i] for w in windows if i < len(w.wall_s))
        cpu = sum(w.cpu_s[i] for w in windows if i < len(w.cpu_s))
        busiest = max(busiest, cpu / wall * 100 if wall > 0 else 0.0)
    return busiest


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
