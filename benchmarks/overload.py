"""The server under more work than it can do: is the excess shed at once, does memory stay
bounded, and does a normal request succeed right after the load stops?

Starts ``inferd serve`` (loopback) with ``half_plus_two`` (ONNX) and ``slow`` (the echo backend,
``--delay-ms`` per batch of up to 8, ``max_queue_size`` 64), then opens ``--connections``
keep-alive clients that each send requests back to back to ``slow`` for ``--seconds``. Prints
the answers by status, latency percentiles by status, the server's RSS before, at its peak and
after, and how long a request to ``half_plus_two`` then takes.

    .venv/bin/python benchmarks/overload.py [--connections 1024] [--seconds 10] [--delay-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inferd.demo.models import write_demo_repository
from tests.support import ServerProcess

SLOW = """backend: "echo"
max_batch_size: 8
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }}]
parameters {{ key: "delay_ms" value: {{ string_value: "{delay_ms}" }} }}
dynamic_batching {{ default_queue_policy {{ max_queue_size: 64 }} }}
"""
BODY = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
HPT = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}


async def load(url: str, connections: int, seconds: float) -> dict[int, list[float]]:
    latencies: dict[int, list[float]] = collections.defaultdict(list)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def one_client() -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    status = (await client.post(url, json=BODY)).status_code
                except httpx.HTTPError:
                    status = 0  # no answer
                latencies[status].append(time.perf_counter() - started)

        await asyncio.gather(*(one_client() for _ in range(connections)))
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--delay-ms", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        write_demo_repository(root, models=["half_plus_two"])
        (root / "slow" / "1").mkdir(parents=True)
        (root / "slow" / "config.pbtxt").write_text(SLOW.format(delay_ms=args.delay_ms))
        server = ServerProcess(root).start()
        try:
            assert server.proc is not None
            process = psutil.Process(server.proc.pid)
            idle = process.memory_info().rss
            peak = idle
            done = threading.Event()

            def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, process.memory_info().rss)
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample)
            sampler.start()
            url = f"{server.http_url}/v2/models/slow/infer"
            latencies = asyncio.run(load(url, args.connections, args.seconds))
            stopped = time.perf_counter()
            r = httpx.post(f"{server.http_url}/v2/models/half_plus_two/infer", json=HPT)
            after = time.perf_counter() - stopped
            done.set()
            sampler.join()
            settled = process.memory_info().rss
            total = sum(len(v) for v in latencies.values())
            print(
                f"{args.connections} connections for {args.seconds:.0f} s against a model doing "
                f"batches of 8 in {args.delay_ms} ms (queue 64): {total} answers"
            )
            for status, values in sorted(latencies.items()):
                print(
                    f"  {status or 'no answer'}: {len(values)} "
                    f"({len(values) / args.seconds:.0f}/s), p50 {percentile(values, 0.5) * 1e3:.1f}"
                    f" ms, p99 {percentile(values, 0.99) * 1e3:.1f} ms, max "
                    f"{max(values) * 1e3:.1f} ms"
                )
            print(
                f"RSS {idle / 2**20:.0f} MiB idle -> peak {peak / 2**20:.0f} MiB -> "
                f"{settled / 2**20:.0f} MiB after; a half_plus_two request right after the load "
                f"answered {r.status_code} in {after * 1e3:.1f} ms"
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
