"""inferd.Server in process, against onnxruntime called directly and against the same model over
HTTP on loopback: one caller each, one row per call, on the demo ``half_plus_two``.

1. ``onnxruntime``: ``InferenceSession.run`` on the model's file in this process (the session
   options inferd's backend uses);
2. ``in-process``: ``Server.infer`` from this thread: the model neither batches nor needs the
   loop, so it runs on this thread (``inferd.app.direct``);
3. ``in-process via loop``: the same request handed to the server's loop thread and waited for,
   as ``Server.infer`` does for a model that batches (the hop the direct path saves);
4. ``in-process async``: ``await Server.async_infer`` on the server's loop;
5. ``http json`` / ``http binary``: ``inferd serve`` (one process) on loopback, KServe v2 JSON
   and binary tensors, one keep-alive connection (``http.client``, the cheapest Python client).

Modes are interleaved pass by pass (the host is noisy); each row gives calls/s, wall µs per
call, CPU-µs per call (this process's CPU for 1-4; for 5, the server process's, and the
client's in brackets), and the added µs per call over onnxruntime. Then, per pass, the
in-process calls/s over the faster HTTP mode's, and the load average before and after.
``--profile`` then shows where the in-process µs go: a cProfile of the awaited path
(everything on the server's loop) and the cost of the loop hop alone.

    .venv/bin/python benchmarks/embedded.py [--passes 3] [--seconds 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import inferd
from inferd.app.calls import build_request
from inferd.demo.models import write_demo_repository
from tests.support import ServerProcess

MODEL = "half_plus_two"
ROW = np.array([[3.0]], np.float32)
JSON_BODY = json.dumps(
    {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [3.0]}]}
).encode()
BINARY_HEADER = json.dumps(
    {
        "inputs": [
            {
                "name": "x",
                "shape": [1, 1],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 4},
            }
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }
).encode()
BINARY_BODY = BINARY_HEADER + ROW.tobytes()


class Result:
    def __init__(self, calls: int, wall_s: float, cpu_s: float, other_cpu_s: float = 0.0):
        self.calls, self.wall_s, self.cpu_s, self.other_cpu_s = calls, wall_s, cpu_s, other_cpu_s

    @property
    def per_s(self) -> float:
        return self.calls / self.wall_s

    @property
    def us(self) -> float:
        return self.wall_s / self.calls * 1e6


def timed(call: Callable[[], object], seconds: float, cpu: Callable[[], float]) -> Result:
    for _ in range(200):  # warm
        call()
    calls, start, cpu0 = 0, time.perf_counter(), cpu()
    deadline = start + seconds
    while True:
        for _ in range(100):
            call()
        calls += 100
        now = time.perf_counter()
        if now >= deadline:
            return Result(calls, now - start, cpu() - cpu0)


def own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def process_cpu(pid: int) -> Callable[[], float]:
    proc = psutil.Process(pid)

    def cpu() -> float:
        total = proc.cpu_times()
        return float(total.user + total.system)

    return cpu


def onnxruntime_call(repo: Path) -> Callable[[], object]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        str(repo / MODEL / "1" / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    feeds = {"x": ROW.reshape(1)}
    return lambda: session.run(["y"], feeds)


def http_call(port: int, body: bytes, binary: bool) -> Callable[[], object]:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"content-type": "application/octet-stream" if binary else "application/json"}
    if binary:
        headers["inference-header-content-length"] = str(len(BINARY_HEADER))
    path = f"/v2/models/{MODEL}/infer"

    def call() -> object:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise SystemExit(f"HTTP {response.status}: {data[:200]!r}")
        return data

    return call


def awaited(server: inferd.Server, seconds: float) -> Result:
    async def run() -> Result:
        for _ in range(200):
            await server.async_infer(MODEL, {"x": ROW})
        calls, start, cpu0 = 0, time.perf_counter(), own_cpu()
        deadline = start + seconds
        while True:
            for _ in range(100):
                await server.async_infer(MODEL, {"x": ROW})
            calls += 100
            now = time.perf_counter()
            if now >= deadline:
                return Result(calls, now - start, own_cpu() - cpu0)

    return server._block(run())


def profile(server: inferd.Server, calls: int = 20000) -> None:
    async def run() -> str:
        for _ in range(500):
            await server.async_infer(MODEL, {"x": ROW})
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            await server.async_infer(MODEL, {"x": ROW})
        profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(22)
        return out.getvalue()

    print(f"\ncProfile of {calls} awaited calls on the server's loop (tottime: own time):")
    text = server._block(run())
    print(text[text.index("   ncalls") :])

    async def nothing() -> None:
        return None

    hand_off = timed(lambda: server._block(nothing()), 2.0, own_cpu)
    print(
        f"the loop hop alone (an empty coroutine run on the server's loop from "
        f"this thread): {hand_off.us:.1f} µs wall, {hand_off.cpu_s / hand_off.calls * 1e6:.1f} "
        "CPU-µs per call"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="per mode and pass")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        repo = Path(work) / "models"
        write_demo_repository(repo, models=[MODEL])
        remote = ServerProcess(
            repo, extra_args=["--http-workers", "1", "--allow-grpc", "false", "--load-model", MODEL]
        ).start()
        try:
            with inferd.Server(model_repository=repo, load_model=[MODEL]) as server:
                server_cpu = process_cpu(remote.proc.pid)  # type: ignore[union-attr]
                modes: dict[str, Callable[[], Result]] = {
                    "onnxruntime": lambda: timed(onnxruntime_call(repo), args.seconds, own_cpu),
                    "in-process": lambda: timed(
                        lambda: server.infer(MODEL, {"x": ROW}), args.seconds, own_cpu
                    ),
                    "in-process via loop": lambda: timed(
                        lambda: server._block(server._infer(build_request(MODEL, {"x": ROW}))),
                        args.seconds,
                        own_cpu,
                    ),
                    "in-process async": lambda: awaited(server, args.seconds),
                    "http json": lambda: _remote(
                        http_call(remote.http_port, JSON_BODY, False), args.seconds, server_cpu
                    ),
                    "http binary": lambda: _remote(
                        http_call(remote.http_port, BINARY_BODY, True), args.seconds, server_cpu
                    ),
                }
                results: dict[str, list[Result]] = {name: [] for name in modes}
                ratios: list[float] = []
                load_before = os.getloadavg()
                for number in range(args.passes):
                    for name, run in modes.items():
                        results[name].append(run())
                    ratios.append(
                        results["in-process"][-1].per_s
                        / max(results["http json"][-1].per_s, results["http binary"][-1].per_s)
                    )
                    print(f"pass {number + 1}/{args.passes} done", file=sys.stderr)
                _report(results, ratios, load_before)
                if args.profile:
                    profile(server)
        finally:
            remote.stop()


def _remote(call: Callable[[], object], seconds: float, server_cpu: Callable[[], float]) -> Result:
    start = server_cpu()
    result = timed(call, seconds, own_cpu)
    result.other_cpu_s, result.cpu_s = result.cpu_s, server_cpu() - start
    return result


def _report(
    results: dict[str, list[Result]], ratios: list[float], load_before: tuple[float, ...]
) -> None:
    load = " / ".join(" ".join(f"{x:.2f}" for x in each) for each in (load_before, os.getloadavg()))
    reference = statistics.median(r.us for r in results["onnxruntime"])
    print(
        f"\nhalf_plus_two, one row per call, one caller (medians of {len(ratios)} passes; "
        f"load average 1, 5, 15 min before / after: {load}; {os.cpu_count()} CPUs)"
    )
    print(f"{'mode':<20} {'calls/s':>9} {'µs/call':>8} {'CPU-µs/call':>16} {'over ort µs':>12}")
    for name, runs in results.items():
        per_s = statistics.median(r.per_s for r in runs)
        us = statistics.median(r.us for r in runs)
        cpu = statistics.median(r.cpu_s / r.calls * 1e6 for r in runs)
        client = statistics.median(r.other_cpu_s / r.calls * 1e6 for r in runs)
        cpu_text = f"{cpu:.1f}" + (f" (+{client:.0f} client)" if client else "")
        print(f"{name:<20} {per_s:>9.0f} {us:>8.1f} {cpu_text:>16} {us - reference:>12.1f}")
    print(
        "in-process (blocking) calls/s over the faster HTTP mode, per pass: "
        + ", ".join(f"{r:.1f}x" for r in ratios)
    )

    def cpu_us(name: str) -> float:
        return statistics.median(r.cpu_s / r.calls * 1e6 for r in results[name])

    print(
        "CPU-µs per call, in process: "
        f"{cpu_us('in-process'):.1f} on the caller's thread, "
        f"{cpu_us('in-process via loop'):.1f} through the loop; "
        f"HTTP JSON: {cpu_us('http json'):.1f} in the server"
    )


if __name__ == "__main__":
    main()
