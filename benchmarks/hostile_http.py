"""Hostile clients against the HTTP port: what a real client sees while they run.

Starts ``inferd serve`` (loopback, one echo model, default limits) from each ``--tree`` given
(a source folder, to compare commits), and for each runs:

1. 3,000 chunked requests to the infer route dripping one byte every 2 s, for ``--hold-s``;
2. the same to the upload route (``PUT /v2/repository/models/NAME``);
3. one TF Serving REST predict whose ``instances`` body is about 126 MB;

while a real client (httpx) calls the infer route in a loop (for 3: ``/v2/health/live``).
Prints the real client's answers (status counts), its p99 against its idle p99, how many of
the hostile requests the server closed, and the process tree's RSS growth.

    .venv/bin/python benchmarks/hostile_http.py [--tree before=/path/to/src] [--tree after=src]
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.hostile_support import tree_rss, write_echo_model
from tests.support import ServerProcess

DOC = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}


class Caller:
    """A real client calling ``url`` in a loop: (start, seconds, status) per call."""

    def __init__(self, url: str, post: bool = True) -> None:
        self.url, self.post = url, post
        self.calls: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Caller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    r = client.post(self.url, json=DOC) if self.post else client.get(self.url)
                    status = r.status_code
                except httpx.HTTPError:
                    status = 0
                self.calls.append((started, time.perf_counter() - started, status))
                time.sleep(0.01)

    def summary(self, since: float, until: float) -> str:
        window = [(s, st) for t, s, st in self.calls if since <= t < until]
        if not window:
            return "no calls"
        latencies = sorted(s for s, _ in window)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        statuses = dict(collections.Counter(st for _, st in window))
        worst = latencies[-1] * 1e3
        return f"{len(window)} calls {statuses}, p99 {p99 * 1e3:.1f} ms, max {worst:.0f} ms"


def drippers(server: ServerProcess, head: bytes, count: int, hold_s: float) -> str:
    """``count`` chunked requests dripping a byte every 2 s; how many the server closed."""
    sockets = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
        s.sendall(head)
        s.setblocking(False)
        sockets.append(s)
    closed: set[int] = set()
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        for i, s in enumerate(sockets):
            if i in closed:
                continue
            try:
                s.send(b"1\r\n \r\n")
                if s.recv(4096) == b"":
                    closed.add(i)
            except BlockingIOError:
                pass
            except OSError:
                closed.add(i)
        time.sleep(2)
    for s in sockets:
        s.close()
    return f"{len(closed)}/{count} closed by the server"


def run(tree: str, src: str, hold_s: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = write_echo_model(Path(tmp) / "models")
        env = {"PYTHONPATH": src}
        server = ServerProcess(
            root, env=env, extra_args=["--model-control-mode", "explicit", "--load-model", "*"]
        ).start()
        try:
            assert server.proc is not None
            pid = server.proc.pid
            url = f"{server.http_url}/v2/models/fast/infer"
            host = b"Host: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            probes = {
                "3000 dripping infer bodies": b"POST /v2/models/fast/infer HTTP/1.1\r\n"
                + host
                + b"Content-Type: application/json\r\n\r\n1\r\n{\r\n",
                "3000 dripping uploads": b"PUT /v2/repository/models/up HTTP/1.1\r\n"
                + host
                + b"Content-Type: application/gzip\r\n\r\n1\r\n\x1f\r\n",
            }
            with Caller(url) as caller:
                for name, head in probes.items():
                    time.sleep(2)
                    idle = time.perf_counter()
                    time.sleep(2)
                    before = tree_rss(pid)
                    started = time.perf_counter()
                    note = drippers(server, head, 3000, hold_s)
                    ended = time.perf_counter()
                    grown = (tree_rss(pid) - before) / 2**20
                    print(f"[{tree}] {name}: {note}; RSS +{grown:.0f} MiB")
                    print(f"    real client idle:   {caller.summary(idle, started)}")
                    print(f"    real client during: {caller.summary(started, ended)}")
            rows = b"[" + b",".join([b"[1.5]"] * 21_000_000) + b"]"
            body = b'{"instances": ' + rows + b"}"
            with Caller(f"{server.http_url}/v2/health/live", post=False) as health:
                time.sleep(2)
                started = time.perf_counter()
                r = httpx.post(
                    f"{server.http_url}/v1/models/fast:predict", content=body, timeout=120
                )
                ended = time.perf_counter()
                time.sleep(0.5)
            print(
                f"[{tree}] TF Serving predict, {len(body) / 1e6:.0f} MB of instances: "
                f"{r.status_code} after {ended - started:.1f} s ({r.text[:70]})"
            )
            print(f"    /v2/health/live during: {health.summary(started, ended)}")
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", default=[], help="NAME=SRC (repeat)")
    parser.add_argument("--hold-s", type=float, default=10.0)
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 16384), hard))
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(Path("src").resolve())]]
    print(f"load average {os.getloadavg()[0]:.1f}")
    for name, src in trees:
        run(name, str(Path(src).resolve()), args.hold_s)


if __name__ == "__main__":
    main()
