"""What the rate limiter costs one request in the scheduler: an echo model (one instance, on a
thread, no batcher) called through its scheduler in this process, CPU-µs per request.

Cases: ``off`` (no limiter: the server's default), ``on-unlimited`` (``--rate-limit
execution_count``, a model whose instance group declares no ``rate_limiter``: not wrapped) and
``on-limited`` (the model asks for a resource: every execution waits for it and runs on the
instance's thread, never inline on the loop); ``off-thread`` is ``off`` sent to the instance's
thread as ``on-limited`` is (``Instances.submit`` to instance 0), so that the difference between
the two is the limiter's own cost. Cases alternate, ``--passes`` times, and the median is
printed. Run it under another tree's ``src`` (``PYTHONPATH=/tmp/base/src``) for the
``off`` figure before a change: a tree without the limiter measures ``off`` only.

    PYTHONPATH=src .venv/bin/python benchmarks/rate_limiter_overhead.py [--requests 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from inferd.backends.work import Work
from inferd.core.types import Timings
from inferd.repository.loader import LoadOptions, load_version, plan

CONFIG = """
name: "{name}"
backend: "echo"
max_batch_size: 0
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }}]
output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }}]
instance_group [{{ count: 1 kind: KIND_CPU {limiter} }}]
"""


def _options(case: str) -> tuple[LoadOptions, str]:
    if case.startswith("off"):
        return LoadOptions(), ""
    from inferd.scheduling.rate_limiter import RateLimiter

    limiter = 'rate_limiter { resources [ { name: "R1" count: 1 } ] }'
    return LoadOptions(rate_limiter=RateLimiter()), limiter if case == "on-limited" else ""


def measure(root: Path, case: str, requests: int) -> float:
    options, limiter = _options(case)
    name = case.replace("-", "_")
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(CONFIG.format(name=name, limiter=limiter))
    version = load_version(name, 1, plan(name, folder), options)
    scheduler: Any = version.scheduler
    work = Work({"INPUT0": np.ones(1, np.float32)}, 0, ("OUTPUT0",))

    async def call() -> object:
        if case == "off-thread":
            return await scheduler.pool.submit([work], 0)  # addressed: never inline
        return await scheduler.run(work, Timings())

    async def run() -> float:
        for _ in range(200):  # warm up (and let a fast model go inline)
            await call()
        started = time.process_time()
        for _ in range(requests):
            await call()
        spent = time.process_time() - started
        await scheduler.close()
        return spent / requests * 1e6

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    try:
        import inferd.scheduling.rate_limiter  # noqa: F401

        cases = ["off", "on-unlimited", "off-thread", "on-limited"]
    except ImportError:
        cases = ["off", "off-thread"]
    figures: dict[str, list[float]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.passes):
            for case in cases:
                figures[case].append(measure(Path(tmp), case, args.requests))
    for case, values in figures.items():
        print(
            f"{case:13s} {statistics.median(values):7.1f} CPU-µs/request "
            f"(passes: {', '.join(f'{v:.1f}' for v in values)})"
        )


if __name__ == "__main__":
    main()
