"""A load generator process: closed-loop clients or an open-loop schedule, measured in windows.

Each worker runs its own event loop and sender. For every level the runner sends a
LevelPlan; the worker starts at the shared ``start_at`` (CLOCK_MONOTONIC is one clock for
every process), throws away the warm-up, then reports one WindowReport per window until
the window cap or until the runner sets ``stop`` (the level is stable).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferd.bench.encode import Workload
from inferd.bench.measure import WindowReport
from inferd.bench.transport import Sender, sender_for

_POLL_S = 0.02  # how often a waiting worker looks at the stop flag
_DRAIN_S = 1.0  # how long in-flight requests may finish after a level ends


@dataclass(frozen=True, slots=True)
class LevelPlan:
    level: int
    clients: int  # closed loop: this worker's share of the concurrency (0 in open loop)
    rate_per_s: float  # open loop: this worker's share of the request rate (0 in closed loop)
    phase_s: float  # open loop: offset of this worker's schedule, to interleave workers
    start_at: float  # time.monotonic() at which the load starts
    warmup_s: float
    window_s: float
    max_windows: int


@dataclass(frozen=True, slots=True)
class WorkerReady:
    worker: int


@dataclass(frozen=True, slots=True)
class LevelDone:
    worker: int
    level: int


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    worker: int
    message: str


def worker_main(index: int, workload: Workload, commands: Any, results: Any, stop: Any) -> None:
    """Process entry point; ``commands`` yields LevelPlans, then None to exit."""
    try:
        coroutine = _serve(index, workload, commands, results, stop)
        if workload.protocol == "http":
            try:
                import uvloop

                uvloop.run(coroutine)
                return
            except ImportError:
                pass
        asyncio.run(coroutine)
    except KeyboardInterrupt:
        pass
    except BaseException as exc:
        results.put(WorkerFailed(index, f"{type(exc).__name__}: {exc}"))


async def _serve(index: int, workload: Workload, commands: Any, results: Any, stop: Any) -> None:
    loop = asyncio.get_running_loop()
    sender = sender_for(workload)
    results.put(WorkerReady(index))
    try:
        while True:
            plan = await loop.run_in_executor(None, _next_plan, commands)
            if plan is None:
                return
            await run_level(index, plan, sender, results, stop)
            results.put(LevelDone(index, plan.level))
    finally:
        await sender.close()


def _next_plan(commands: Any) -> LevelPlan | None:
    """The next plan; None on the runner's word, or once the runner process is gone."""
    parent = multiprocessing.parent_process()
    while True:
        try:
            plan: LevelPlan | None = commands.get(timeout=1.0)
            return plan
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return None


class _Recorder:
    """Outcomes of the current window; ``take`` hands them over and starts the next."""

    def __init__(self) -> None:
        self.latencies_ns: list[int] = []
        self.errors = 0
        self.sent = 0
        self.first_error: str | None = None

    def done(self, latency_ns: int, error: str | None) -> None:
        if error is None:
            self.latencies_ns.append(latency_ns)
        else:
            self.errors += 1
            if self.first_error is None:
                self.first_error = error

    def take(self) -> tuple[np.ndarray, int, int, str | None]:
        taken = (np.array(self.latencies_ns, dtype=np.int64), self.errors, self.sent)
        first, self.first_error = self.first_error, None
        self.latencies_ns, self.errors, self.sent = [], 0, 0
        return (*taken, first)


async def run_level(index: int, plan: LevelPlan, sender: Sender, results: Any, stop: Any) -> None:
    loop = asyncio.get_running_loop()
    recorder = _Recorder()
    running = True
    inflight: set[asyncio.Task[None]] = set()

    async def one(request: int) -> None:
        recorder.sent += 1
        started = time.perf_counter_ns()
        try:
            error = await sender.send(request)
        except Exception as exc:  # a bug or an odd answer: count it, keep the load going
            error = f"{type(exc).__name__}: {exc}"
        recorder.done(time.perf_counter_ns() - started, error)

    async def client(first: int) -> None:
        request = first
        while running:
            await one(request)
            request += plan.clients

    async def schedule() -> None:
        interval = 1.0 / plan.rate_per_s
        due, request = plan.start_at + plan.phase_s, 0
        while running:
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            task = loop.create_task(one(request))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            request += 1
            due += interval  # fixed intervals: late sends catch up, they do not shift

    await asyncio.sleep(max(0.0, plan.start_at - time.monotonic()))
    drivers = [loop.create_task(client(i)) for i in range(plan.clients)]
    if plan.rate_per_s > 0:
        drivers.append(loop.create_task(schedule()))
    boundary = plan.start_at + plan.warmup_s
    if not await _wait_until(boundary, stop):
        recorder.take()  # the warm-up does not count
        cpu_before, wall_before = time.process_time(), time.monotonic()
        for window in range(plan.max_windows):
            boundary += plan.window_s
            if await _wait_until(boundary, stop):
                break
            latencies, errors, sent, first_error = recorder.take()
            cpu, wall = time.process_time(), time.monotonic()
            report = WindowReport(
                index,
                plan.level,
                window,
                latencies,
                errors,
                sent,
                cpu - cpu_before,
                wall - wall_before,
                first_error,
            )
            results.put(report)
            cpu_before, wall_before = cpu, wall
    running = False
    pending = [*drivers, *inflight]
    if pending:
        _, late = await asyncio.wait(pending, timeout=_DRAIN_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)


async def _wait_until(deadline: float, stop: Any) -> bool:
    """Sleep until ``deadline``; True as soon as the runner sets ``stop`` or is gone."""
    parent = multiprocessing.parent_process()
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if parent is not None and not parent.is_alive():
            return True
        await asyncio.sleep(min(_POLL_S, left))
    return True
