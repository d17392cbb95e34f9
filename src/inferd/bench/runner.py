"""Drives ``inferd bench``: prepares every target, sweeps the levels with worker processes, reports.

Every target is checked (metadata, shapes, data) before any load, so a bad flag fails at
once. Then per target: spawn the workers, and per level: snapshot the server statistics,
send the plan, merge the windows as they come, stop at stability or the window cap,
snapshot again.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.bench import encode, inputs, measure, metadata, report, specs
from inferd.bench.encode import Workload
from inferd.bench.measure import Window, WindowReport
from inferd.bench.options import BenchError, BenchOptions, Target, from_args
from inferd.bench.worker import LevelDone, LevelPlan, WorkerFailed, WorkerReady, worker_main
from inferd.install import install_hint

_START_DELAY_S = 0.05  # time for every worker to receive its plan before the shared start
_READY_TIMEOUT_S = 60.0
_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class Prepared:
    target: Target
    client: metadata.ServerClient
    workload: Workload


def run(args: argparse.Namespace) -> int:
    """The ``inferd bench`` command: 0 on a finished sweep, 2 on bad input."""
    try:
        options = from_args(args)
        rows, encoding = sweep(options)
        report.print_table(rows, options, sys.stdout, encoding)
        if options.csv_path:
            report.write_csv(options.csv_path, rows, options.percentile)
        if options.json_path:
            report.write_json(options.json_path, rows, options, encoding)
        if options.plot_path:
            report.write_plot(options.plot_path, rows, options)
    except BenchError as exc:
        print(f"inferd bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("inferd bench: interrupted", file=sys.stderr)
        return 130
    return 0


def prepare(options: BenchOptions, target: Target) -> Prepared:
    client = metadata.connect(options, target)
    try:
        spec = client.model_spec()
        shapes = inputs.resolve_shapes(spec, options.batch_size, options.shapes)
        if options.input_data in ("random", "zero"):
            samples = inputs.generated(spec, shapes, options.input_data)
        else:
            samples = inputs.from_file(Path(options.input_data), spec, shapes, options.batch_size)
        return Prepared(target, client, encode.build(options, target, samples))
    except BaseException:
        client.close()
        raise


def sweep(options: BenchOptions) -> tuple[list[dict[str, Any]], str]:
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        prepared = []
        for target in options.targets:
            item = prepare(options, target)
            stack.callback(item.client.close)
            prepared.append(item)
        if options.plot_path:  # fail before the load, not after it
            _check_matplotlib()
        progress = _progress(options, len(prepared) * len(options.levels))
        stack.callback(progress.close)
        for item in prepared:
            with WorkerPool(item.workload, options.processes) as pool:
                for number, level in enumerate(options.levels):
                    rows.append(_measure_level(options, item, pool, number, level, progress))
                    _warn_errors(rows[-1])
    return rows, prepared[0].workload.encoding


def _measure_level(
    options: BenchOptions,
    item: Prepared,
    pool: WorkerPool,
    number: int,
    level: int | float,
    progress: Any,
) -> dict[str, Any]:
    rate_mode = bool(options.request_rates)
    name = f"{item.target.label} {'rate' if rate_mode else 'c'}={level:g}"
    progress.set_description_str(name)
    before = item.client.stats()

    def on_window(window: Window, count: int) -> None:
        latency = window.latency_ms(50)
        p50 = f"{latency:.2f} ms" if latency is not None else "n/a"
        rate = window.throughput_rps * options.batch_size
        progress.set_postfix_str(f"window {count}: {rate:.0f} infer/s p50 {p50}")

    windows, stable = pool.run_level(options, number, level, on_window)
    after = item.client.stats()
    progress.update(1)
    return measure.summarize(
        windows,
        stable=stable,
        batch_size=options.batch_size,
        percentile=options.percentile,
        concurrency=None if rate_mode else int(level),
        request_rate=float(level) if rate_mode else None,
        server_us=specs.per_request_us(before, after),
        labels={
            "server": item.target.label,
            "model": options.model,
            "protocol": item.workload.encoding,
        },
    )


def _warn_errors(row: dict[str, Any]) -> None:
    if row["errors"]:
        level = row["concurrency"] if row["concurrency"] is not None else row["request_rate"]
        print(
            f"inferd bench: {row['server']} level {level}: {row['errors']} of "
            f"{row['requests']} requests failed; first: {row['first_error']}",
            file=sys.stderr,
        )


def _check_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BenchError(f"--plot needs matplotlib: {install_hint('bench')}") from None


class _NoProgress:
    def set_description_str(self, text: str) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def update(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(options: BenchOptions, total: int) -> Any:
    if not options.progress:
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress()
    return tqdm(total=total, unit="level", file=sys.stderr, dynamic_ncols=True, leave=False)


class WorkerPool:
    """``processes`` spawned workers sharing one result queue and one stop flag."""

    def __init__(self, workload: Workload, processes: int) -> None:
        self.context = multiprocessing.get_context("spawn")
        self.results: Any = self.context.Queue()
        self.stop: Any = self.context.Event()
        self.commands: list[Any] = []
        self.processes: list[Any] = []
        self.workload = workload
        self.count = processes

    def __enter__(self) -> WorkerPool:
        try:
            for index in range(self.count):
                commands = self.context.Queue()
                process = self.context.Process(
                    target=worker_main,
                    args=(index, self.workload, commands, self.results, self.stop),
                    daemon=True,
                    name=f"inferd-bench-{index}",
                )
                process.start()
                self.commands.append(commands)
                self.processes.append(process)
            ready = 0
            deadline = time.monotonic() + _READY_TIMEOUT_S
            while ready < self.count:
                if isinstance(self._next(deadline), WorkerReady):
                    ready += 1
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for commands in self.commands:
            commands.put(None)
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)

    def _next(self, deadline: float) -> Any:
        while True:
            try:
                message = self.results.get(timeout=0.5)
            except queue.Empty:
                dead = [p.name for p in self.processes if not p.is_alive()]
                if dead:
                    raise BenchError(f"load generator process {dead[0]} exited") from None
                if time.monotonic() > deadline:
                    raise BenchError("load generator processes stopped answering") from None
                continue
            if isinstance(message, WorkerFailed):
                raise BenchError(f"load generator process {message.worker}: {message.message}")
            return message

    def run_level(
        self, options: BenchOptions, number: int, level: int | float, on_window: Any
    ) -> tuple[list[Window], bool]:
        """Windows in order (every worker merged) and whether the level became stable."""
        start_at = time.monotonic() + _START_DELAY_S
        for index, commands in enumerate(self.commands):
            commands.put(self._plan(options, number, level, index, start_at))
        deadline = (
            start_at
            + options.warmup_s
            + options.measurement_interval_s * options.max_windows
            + _GRACE_S
        )
        pending: dict[int, list[WindowReport]] = {}
        windows: list[Window] = []
        stable, decided, done = False, False, 0
        while done < self.count:
            message = self._next(deadline)
            if isinstance(message, LevelDone):
                done += 1
            elif isinstance(message, WindowReport) and not decided:
                pending.setdefault(message.window, []).append(message)
                while len(pending.get(len(windows), ())) == self.count:
                    reports = sorted(pending.pop(len(windows)), key=lambda r: r.worker)
                    windows.append(measure.merge(reports))
                    on_window(windows[-1], len(windows))
                    stable = measure.is_stable(windows, options.stability_pct, options.percentile)
                    if stable or len(windows) >= options.max_windows:
                        decided = True
                        self.stop.set()
                        break
        self.stop.clear()
        return windows, stable

    def _plan(
        self, options: BenchOptions, number: int, level: int | float, index: int, start_at: float
    ) -> LevelPlan:
        clients, rate_per_s, phase_s = 0, 0.0, 0.0
        if options.request_rates:  # workers interleave: one fixed interval overall
            rate_per_s, phase_s = float(level) / self.count, index / float(level)
        else:  # the clients are dealt out as evenly as they go
            clients = int(level) // self.count + (1 if index < int(level) % self.count else 0)
        return LevelPlan(
            level=number,
            clients=clients,
            rate_per_s=rate_per_s,
            phase_s=phase_s,
            start_at=start_at,
            warmup_s=options.warmup_s,
            window_s=options.measurement_interval_s,
            max_windows=options.max_windows,
        )
