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
import json
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


async def _client(
    host: str, port: int, request: bytes, deadline: float, latencies: dict[int, list[float]]
) -> None:
    """One keep-alive connection sending ``request`` back to back (raw HTTP/1.1: a client
    this light leaves the CPU to the server)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            latencies[status].append(time.perf_counter() - started)
    except (OSError, asyncio.IncompleteReadError, ValueError):
        latencies[0].append(0.0)  # the server closed the connection
    finally:
        writer.close()


async def load(url: str, connections: int, seconds: float) -> dict[int, list[float]]:
    latencies: dict[int, list[float]] = collections.defaultdict(list)
    parsed = httpx.URL(url)
    host, port = parsed.host, parsed.port or 80
    body = json.dumps(BODY).encode()
    request = (
        f"POST {parsed.raw_path.decode()} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    deadline = time.perf_counter() + seconds
    await asyncio.gather(
        *(_client(host, port, request, deadline, latencies) for _ in range(connections))
    )
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
