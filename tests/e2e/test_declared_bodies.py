"""Bodies that are declared but not sent (yet): a head's Content-Length costs nothing until its
bytes arrive. Slow clients declaring large bodies, in the default layout (a model host and
frontends on one port), leave inference answering and the server's memory where it was.
Memory is the RSS of the server's whole process tree."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.e2e.hostile_support import tree_rss, write_echo_model
from tests.support import ServerProcess

SLOW = 12  # connections declaring a large body, then sending it slowly
DECLARED = 100 << 20  # what each declares (below --http-max-body-bytes)
INFLIGHT_BYTES = 64 << 20  # --max-inflight-bytes: one declared body is more
DOC = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [2.0]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = write_echo_model(tmp_path_factory.mktemp("declared") / "models")
    args = ["--http-workers", "3", "--model-control-mode", "explicit", "--load-model", "*"]
    args += ["--max-inflight-bytes", str(INFLIGHT_BYTES), "--http-min-body-rate-bytes", "1000"]
    proc = ServerProcess(root, extra_args=args).start()
    yield proc
    proc.stop()


class _Slow:
    """``SLOW`` requests declaring ``DECLARED`` bytes, each sent 4 KB every 0.5 s (8 KB/s:
    above the minimum rate, so the server keeps them)."""

    def __init__(self, server: ServerProcess, path: str) -> None:
        self.sockets: list[socket.socket] = []
        for _ in range(SLOW):
            s = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
            s.sendall(
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {DECLARED}\r\n\r\n".encode()
            )
            self.sockets.append(s)
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)

    def __enter__(self) -> _Slow:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for s in self.sockets:
            s.close()

    def _feed(self) -> None:
        chunk = b" " * 4096
        while not self._stop.wait(0.5):
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.sendall(chunk)
                    self.sent += len(chunk)


def test_slow_declared_bodies_cost_what_arrived(server: ServerProcess) -> None:
    """Twelve heads declaring 100 MiB each (1.2 GiB, about twenty times --max-inflight-bytes
    of each worker) and sending 8 KB/s: every real inference still answers 200, and the
    tree's RSS grows by far less than one declared body."""
    assert server.proc is not None
    url = f"{server.http_url}/v2/models/fast/infer"
    assert httpx.post(url, json=DOC, timeout=60).status_code == 200
    time.sleep(1)
    idle = peak = tree_rss(server.proc.pid)
    statuses: list[int] = []
    with _Slow(server, "/v2/models/fast/infer") as slow:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            # A new connection per call: the kernel spreads them over every worker.
            r = httpx.post(url, json=DOC, timeout=60)
            statuses.append(r.status_code)
            assert r.status_code == 200, r.text
            peak = max(peak, tree_rss(server.proc.pid))
            time.sleep(0.1)
        still_open = sum(1 for s in slow.sockets if _unanswered(s))
    grown = peak - idle
    print(f"\n{len(statuses)} inferences meanwhile; RSS +{grown / 2**20:.1f} MiB for {SLOW} heads")
    assert still_open == SLOW  # the slow bodies were kept (above the minimum rate)
    assert grown < 24 << 20


def _unanswered(s: socket.socket) -> bool:
    """Whether the server has neither answered nor closed ``s`` yet (without waiting)."""
    readable, _, _ = select.select([s], [], [], 0)
    return not readable


def _send_parts(server: ServerProcess, body: bytes, parts: int) -> bytes:
    """POST ``body`` in ``parts`` pieces a little apart; the server's answer."""
    s = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
    try:
        s.sendall(
            b"POST /v2/models/fast/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        step = -(-len(body) // parts)
        for start in range(0, len(body), step):
            s.sendall(body[start : start + step])
            time.sleep(0.05)
        answer = b""
        while chunk := s.recv(1 << 16):
            answer += chunk
        return answer
    finally:
        s.close()


def test_a_large_body_sent_in_pieces_arrives_whole(server: ServerProcess) -> None:
    """A body of several MiB sent in pieces fills its growing buffer exactly."""
    doc = orjson.dumps(DOC)
    body = doc[:-1] + b" " * (5 << 20) + doc[-1:]  # JSON padded to about 5 MiB
    answer = _send_parts(server, body, 7)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer[:300]
    assert orjson.loads(payload)["outputs"][0]["data"] == [2.0]
