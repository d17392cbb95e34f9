"""Bodies against the default layout (``--http-workers 3``: a model host and two frontends on
one port): what real clients see and what the server's process tree holds (RSS, psutil).

``--probe declared``: 40 connections each declaring a 107,374,182-byte body to the v2 infer
route and sending 2 KB/s, for ``--hold-s``, while a real client calls the infer route.
``--probe torchserve``: one 120 MB body to TorchServe's ``/predictions``, then six at once,
while a real client calls ``/ping``; RSS 5 s after each.
``--probe storm``: resnet50 (ONNX) with a queue of 16 and 256 clients sending binary-tensor
requests back to back for ``--storm-s`` (after 3 s of 16 clients, to warm the model); the
answers' latencies by status, RSS 30 s after.

Each probe runs against every ``--tree`` given (a source folder, to compare commits):

    .venv/bin/python benchmarks/hostile_bodies.py --probe storm \\
        [--tree before=/path/to/old/src] [--tree after=src]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.hostile_http import Caller
from inferd.demo.models import write_demo_repository
from tests.e2e.hostile_support import Peak, tree_rss, write_echo_model
from tests.e2e.torchserve_support import Ports, archive
from tests.support import ServerProcess

WORKERS = ["--http-workers", "3"]
SIZE_HANDLER = """
def handle(data, context):
    if data is None:
        return None
    return [str(len(row.get("body") or row.get("data") or b"")) for row in data]
"""
RESNET = """max_batch_size: 8
dynamic_batching { default_queue_policy { max_queue_size: 16 } }
"""


def mib(value: int) -> str:
    return f"{value / 2**20:+.0f} MiB"


def by_process(pid: int) -> str:
    """Each process of the tree and its RSS."""
    root = psutil.Process(pid)
    found = []
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            found.append(f"{process.pid}:{process.memory_info().rss / 2**20:.0f}")
    return " ".join(found)


def regions(pid: int, least: int = 8 << 20) -> str:
    """Each process's mappings holding ``least`` bytes or more (smaps): name and RSS in MiB,
    ``anon`` for anonymous memory (malloc arenas), ``shm`` for shared memory."""
    root = psutil.Process(pid)
    lines = []
    for process in [root, *root.children(recursive=True)]:
        found = []
        with contextlib.suppress(OSError, psutil.NoSuchProcess):
            name, rss = "", 0
            for line in Path(f"/proc/{process.pid}/smaps").read_text().splitlines():
                head = line.split()
                if head and "-" in head[0] and not head[0].endswith(":"):
                    if rss >= least:
                        found.append(f"{name or 'anon'}:{rss / 2**20:.0f}")
                    name, rss = (head[5] if len(head) > 5 else ""), 0
                    name = name.rsplit("/", 1)[-1].replace("(deleted)", "").strip()
                elif head and head[0] == "Rss:":
                    rss = int(head[1]) << 10
            if rss >= least:
                found.append(f"{name or 'anon'}:{rss / 2**20:.0f}")
        lines.append(f"{process.pid}: {' '.join(found)}")
    return "; ".join(lines)


def declared(tree: str, src: str, hold_s: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = write_echo_model(Path(tmp) / "models")
        args = [*WORKERS, "--model-control-mode", "explicit", "--load-model", "*"]
        server = ServerProcess(root, env={"PYTHONPATH": src}, extra_args=args).start()
        try:
            assert server.proc is not None
            url = f"{server.http_url}/v2/models/fast/infer"
            with Caller(url) as caller:
                time.sleep(2)
                head = (
                    b"POST /v2/models/fast/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 107374182\r\n\r\n"
                )
                sockets = []
                with Peak(server.proc.pid, every_s=0.02) as rss:
                    started = time.perf_counter()
                    for _ in range(40):
                        s = socket.create_connection(("127.0.0.1", server.http_port))
                        s.sendall(head)
                        sockets.append(s)
                    while time.perf_counter() - started < hold_s:
                        for s in sockets:
                            with contextlib.suppress(OSError):
                                s.send(b" " * 2048)
                        time.sleep(1)
                    ended = time.perf_counter()
                for s in sockets:
                    s.close()
                print(f"[{tree}] 40 heads declaring 107374182 bytes, 2 KB/s each, {hold_s:.0f} s:")
                print(f"    RSS {mib(rss.start - rss.start)} -> peak {mib(rss.peak - rss.start)}")
                print(f"    real client during: {caller.summary(started, ended)}")
        finally:
            server.stop()


def torchserve(tree: str, src: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work, store, models = (Path(tmp) / n for n in ("work", "store", "models"))
        for folder in (work, store, models):
            folder.mkdir()
        (work / "size_handler.py").write_text(SIZE_HANDLER)
        archive(work, store, "size", "1.0", "size_handler.py")
        ports = Ports()
        args = [*WORKERS, "--model-store", str(store), "--models", "size=size.mar", *ports.args()]
        server = ServerProcess(models, args, env={"PYTHONPATH": src}).start(timeout_s=120)
        try:
            assert server.proc is not None
            url = f"{ports.inference_url}/predictions/size"
            body = b"x" * 120_000_000
            with Caller(f"{ports.inference_url}/ping", post=False) as ping:
                for count in (1, 6):
                    time.sleep(2)
                    with Peak(server.proc.pid, every_s=0.02) as rss:
                        started = time.perf_counter()
                        with concurrent.futures.ThreadPoolExecutor(count) as pool:
                            sent = pool.map(
                                lambda _: httpx.post(url, content=body, timeout=300), range(count)
                            )
                            answers = collections.Counter(f"{r.status_code} {r.text}" for r in sent)
                        ended = time.perf_counter()
                    time.sleep(5)
                    after = tree_rss(server.proc.pid)
                    print(f"[{tree}] {count} x 120 MB to /predictions: {dict(answers)}")
                    print(
                        f"    RSS peak {mib(rss.peak - rss.start)}, 5 s after "
                        f"{mib(after - rss.start)}; took {ended - started:.1f} s"
                    )
                    print(f"    /ping during: {ping.summary(started, ended)}")
        finally:
            server.stop()


async def _client(port: int, request: bytes, deadline: float, seen: dict[int, list[float]]) -> None:
    """Requests back to back on one connection (another when the server closes it)."""
    while time.perf_counter() < deadline:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
                seen[int(head[9:12])].append(time.perf_counter() - started)
                if b"connection: close" in head.lower():
                    break
        except (OSError, asyncio.IncompleteReadError, ValueError):
            seen[0].append(0.0)
        finally:
            writer.close()


async def _storm(port: int, request: bytes, clients: int, seconds: float) -> dict[int, list[float]]:
    seen: dict[int, list[float]] = collections.defaultdict(list)
    deadline = time.perf_counter() + seconds
    await asyncio.gather(*(_client(port, request, deadline, seen) for _ in range(clients)))
    return seen


def storm(tree: str, src: str, seconds: float, clients: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        write_demo_repository(root, models=["resnet50"])
        (root / "resnet50" / "config.pbtxt").write_text(RESNET)
        server = ServerProcess(root, env={"PYTHONPATH": src}, extra_args=WORKERS).start(120)
        try:
            assert server.proc is not None
            pixels = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
            header = json.dumps(
                {
                    "inputs": [
                        {
                            "name": "input",
                            "shape": [1, 3, 224, 224],
                            "datatype": "FP32",
                            "parameters": {"binary_data_size": pixels.nbytes},
                        }
                    ],
                    "outputs": [{"name": "output", "parameters": {"binary_data": False}}],
                }
            ).encode()
            body = header + pixels.tobytes()
            request = (
                b"POST /v2/models/resnet50/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/octet-stream\r\n"
                + f"Inference-Header-Content-Length: {len(header)}\r\n".encode()
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            # Warm: the model's first batches of every size allocate its working memory.
            asyncio.run(_storm(server.http_port, request, 16, 3.0))
            time.sleep(2)
            start = by_process(server.proc.pid)
            with Peak(server.proc.pid, every_s=0.02) as rss:
                seen = asyncio.run(_storm(server.http_port, request, clients, seconds))
            time.sleep(30)
            after = tree_rss(server.proc.pid)
            print(f"[{tree}] resnet50, queue 16, {clients} clients for {seconds:.0f} s:")
            for status, values in sorted(seen.items()):
                ordered = sorted(values)
                p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
                p50 = ordered[len(ordered) // 2]
                print(
                    f"    {status or 'closed'}: {len(values)}, p50 {p50 * 1e3:.0f} ms, "
                    f"p99 {p99 * 1e3:.0f} ms"
                )
            print(f"    RSS peak {mib(rss.peak - rss.start)}, 30 s after {mib(after - rss.start)}")
            print(f"    by process (MiB): {start} before, {by_process(server.proc.pid)} 30 s after")
            print(f"    regions of 8 MiB or more 30 s after (MiB): {regions(server.proc.pid)}")
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--probe", choices=["declared", "torchserve", "storm"], required=True)
    parser.add_argument("--tree", action="append", default=[], help="NAME=SRC (repeat)")
    parser.add_argument("--hold-s", type=float, default=40.0)
    parser.add_argument("--storm-s", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=256)
    args = parser.parse_args()
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(Path("src").resolve())]]
    print(f"load average {os.getloadavg()[0]:.1f}")
    for name, src in trees:
        path = str(Path(src).resolve())
        if args.probe == "declared":
            declared(name, path, args.hold_s)
        elif args.probe == "torchserve":
            torchserve(name, path)
        else:
            storm(name, path, args.storm_s, args.clients)


if __name__ == "__main__":
    main()
