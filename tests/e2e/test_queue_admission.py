"""A request that cannot be queued is refused before its body is read, in the default layout
too: the frontends forward to the model host, whose dynamic batcher owns the queue, and they
see it full (``workers.queues``) before they read a body. The answer is the host's own, 503,
as Triton answers a full queue."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.hostile_support import tree_rss
from tests.support import ServerProcess, pending_requests, wait_for

QUEUE = 2
HEADS = 6  # more connections than workers: the kernel spreads them over each
GATED = """backend: "echo"
max_batch_size: 1
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }}]
instance_group [{{ count: 1 kind: KIND_CPU }}]
parameters {{ key: "gate_file" value: {{ string_value: "{gate}" }} }}
dynamic_batching {{ default_queue_policy {{ max_queue_size: {queue} }} }}
"""
DOC = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [3.0]}]}
STORM_CLIENTS, STORM_REQUESTS = 128, 16  # each client's requests, one after the other


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return tmp_path / "open"


@pytest.fixture
def server(tmp_path: Path, gate: Path) -> Iterator[ServerProcess]:
    root = tmp_path / "models"
    (root / "gated" / "1").mkdir(parents=True)
    (root / "gated" / "config.pbtxt").write_text(GATED.format(gate=gate, queue=QUEUE))
    args = ["--http-workers", "3", "--model-control-mode", "explicit", "--load-model", "*"]
    # A body that has not come yet is waited for far longer than the test waits for answers.
    args += ["--http-header-timeout-s", "60", "--http-body-timeout-s", "60"]
    proc = ServerProcess(root, extra_args=args).start()
    yield proc
    gate.touch()  # let the held requests finish
    proc.stop()


def _hold(url: str, answers: list[int]) -> None:
    try:
        answers.append(httpx.post(url, json=DOC, timeout=120).status_code)
    except httpx.HTTPError:
        answers.append(0)


def _answer_within(s: socket.socket, seconds: float) -> bytes:
    s.settimeout(seconds)
    try:
        return s.recv(1 << 16)
    except TimeoutError:
        return b""


def test_a_full_queue_refuses_before_the_body_is_read(server: ServerProcess, gate: Path) -> None:
    url = f"{server.http_url}/v2/models/gated/infer"
    answers: list[int] = []
    # The gated instance holds one batch, one more waits for it, and the queue holds QUEUE.
    holders = [threading.Thread(target=_hold, args=(url, answers)) for _ in range(QUEUE + 2)]
    for holder in holders:
        holder.start()

    wait_for(lambda: pending_requests(server, "gated") >= QUEUE + 2 or None, "a full queue")
    r = httpx.post(url, json=DOC, timeout=60)
    assert r.status_code == 503, r.text
    assert "the queue of model 'gated/1' is full (max_queue_size 2" in r.json()["error"]
    # Bodies of 600 KB (a resnet50 input) that are not even JSON: refused on the queue alone,
    # by every worker, before anything decodes them (a frontend that decoded it would answer
    # 400, one that forwarded it would have the host refuse it after the copies).
    garbage = b"{" * 602_112
    sockets = []
    for _ in range(HEADS):
        s = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
        s.sendall(
            b"POST /v2/models/gated/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Content-Type: application/json\r\nContent-Length: {len(garbage)}\r\n\r\n".encode()
            + garbage
        )
        sockets.append(s)
    seen = [_answer_within(s, 60) for s in sockets]
    for s in sockets:
        s.close()
    assert all(a.startswith(b"HTTP/1.1 503") for a in seen), [a[:200] for a in seen]
    assert all(b"the queue of model 'gated/1' is full" in a for a in seen), seen
    gate.touch()
    for holder in holders:
        holder.join(timeout=120)
    assert answers.count(200) == QUEUE + 2, answers
    # The queue drained: the frontends admit again.
    assert httpx.post(url, json=DOC, timeout=60).json()["outputs"][0]["data"] == [3.0]


async def _refused(port: int, request: bytes, count: int) -> int:
    """Send ``request`` ``count`` times (on one connection while the server keeps it); the
    503 answers seen. Every connection is closed before it returns."""
    refused = 0
    writer: asyncio.StreamWriter | None = None
    try:
        for _ in range(count):
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
            length = next(
                int(line[15:])
                for line in head.split(b"\r\n")
                if line[:15].lower() == b"content-length:"
            )
            await reader.readexactly(length)
            refused += head.startswith(b"HTTP/1.1 503")
            if b"connection: close" in head.lower():
                writer.close()
                writer = None
    finally:
        if writer is not None:
            writer.close()
    return refused


async def _storm(port: int, request: bytes) -> int:
    counts = await asyncio.gather(
        *(_refused(port, request, STORM_REQUESTS) for _ in range(STORM_CLIENTS))
    )
    return sum(counts)


def test_memory_comes_back_after_a_storm_of_refused_requests(
    server: ServerProcess, gate: Path
) -> None:
    """Thousands of 600 KB requests refused on a full queue by every serving process: once
    the storm is over, the server's tree gives back what it took (the cycles the refusals left,
    its HTTP server's freed pages, the free space of its shared memory) instead of holding
    over a hundred MiB more for good."""
    assert server.proc is not None
    url = f"{server.http_url}/v2/models/gated/infer"
    answers: list[int] = []
    holders = [threading.Thread(target=_hold, args=(url, answers)) for _ in range(QUEUE + 2)]
    for holder in holders:
        holder.start()
    wait_for(lambda: pending_requests(server, "gated") >= QUEUE + 2 or None, "a full queue")
    time.sleep(1)
    start = tree_rss(server.proc.pid)
    garbage = b"{" * 602_112
    request = (
        b"POST /v2/models/gated/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Content-Type: application/json\r\nContent-Length: {len(garbage)}\r\n\r\n".encode()
        + garbage
    )
    refused = asyncio.run(_storm(server.http_port, request))
    assert refused == STORM_CLIENTS * STORM_REQUESTS
    after = tree_rss(server.proc.pid)
    gate.touch()  # the held requests finish: the server is idle from here on
    for holder in holders:
        holder.join(timeout=120)
    assert answers.count(200) == QUEUE + 2, answers
    print(f"\nRSS {(after - start) / 2**20:+.0f} MiB after the storm", end="")
    settled = wait_for(
        lambda: (rss := tree_rss(server.proc.pid) if server.proc else 0) - start < 40 << 20 and rss,
        "the tree's memory back within 40 MiB of where it was",
        timeout_s=40,
    )
    print(f", {(settled - start) / 2**20:+.0f} MiB once settled")
