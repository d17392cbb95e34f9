"""Hostile clients against the HTTP port: slow chunked bodies, big TF Serving bodies, methods a
route does not take. Every wait is bounded; latencies are printed, never asserted."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.hostile_support import write_echo_model
from tests.support import ServerProcess

DRIPPERS = 6
INFLIGHT = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = write_echo_model(tmp_path_factory.mktemp("hostile_http") / "models")
    proc = ServerProcess(
        root,
        extra_args=[
            "--model-control-mode",
            "explicit",
            "--load-model",
            "*",
            "--max-inflight-requests",
            str(INFLIGHT),
            "--http-header-timeout-s",
            "1",
            "--http-min-body-rate-bytes",
            "1000",
            "--max-concurrent-uploads",
            str(DRIPPERS),
        ],
    ).start()
    yield proc
    proc.stop()


def _drip(server: ServerProcess, path: str, method: str = "POST") -> socket.socket:
    """A chunked request whose body starts, then drips a byte now and then."""
    kind = "application/gzip" if method == "PUT" else "application/json"
    s = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
    s.sendall(
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {kind}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n".encode()
    )
    return s


def _answer(s: socket.socket, timeout_s: float = 60) -> bytes:
    s.settimeout(timeout_s)
    try:
        return s.recv(4096)
    except TimeoutError:
        return b""
    finally:
        s.close()


class _Feeder:
    """Keeps dripping bodies alive while the test needs them: a chunk every 0.1 s at twice the
    minimum rate (--http-min-body-rate-bytes 1000), so each body's deadline stays ahead of the
    clock however busy the host; once stopped, they fall under the rate and are cut."""

    CHUNK = b"c8\r\n" + b" " * 200 + b"\r\n"  # 200 bytes

    def __init__(self, sockets: list[socket.socket]) -> None:
        self._sockets = sockets
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)

    def __enter__(self) -> _Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _feed(self) -> None:
        while not self._stop.wait(0.1):
            for s in self._sockets:
                with contextlib.suppress(OSError):  # answered (refused) and closed already
                    s.sendall(self.CHUNK)


def _unanswered(s: socket.socket) -> bool:
    """Whether the server has neither answered nor closed ``s`` yet (without waiting)."""
    readable, _, _ = select.select([s], [], [], 0)
    return not readable


def test_slow_uploads_leave_inference_its_budget(server: ServerProcess) -> None:
    """Uploads (counted from their head: they run as their body streams to disk) and admin
    calls have their own in-flight count: a client holding all of it with slow chunked
    uploads leaves inference answering, and the minimum body rate cuts them after the grace.

    With several workers each holds its share of the count and the kernel picks a worker per
    connection: the probes and the inference go over one kept-alive connection, so one worker
    answers them all, and uploads start until that worker's share is held."""
    workers = server.workers()
    share = -(-INFLIGHT // workers)
    drippers: list[socket.socket] = []
    load = "/v2/repository/models/y/load"
    with _Feeder(drippers), httpx.Client(base_url=server.http_url, timeout=60) as one:
        while (refused := one.post(load, json={})).status_code != 503:
            assert refused.status_code == 404, refused.text  # no model y: slots not all held
            assert len(drippers) < 20 * workers, "the uploads never held the admin budget"
            drippers.append(_drip(server, f"/v2/repository/models/up{len(drippers)}", "PUT"))
            time.sleep(0.05)
        assert "admin requests" in refused.json()["error"]
        doc = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [2.0]}]}
        answers = [one.post("/v2/models/fast/infer", json=doc) for _ in range(2 * INFLIGHT)]
        assert [a.status_code for a in answers] == [200] * (2 * INFLIGHT)
        refused = one.post(load, json={})
        assert refused.status_code == 503 and "admin requests" in refused.json()["error"]
    cut = [_answer(s) for s in drippers]  # fed no more: under the rate
    statuses = [a.split(b" ", 2)[1].decode() for a in cut]
    assert set(statuses) <= {"408", "503"}, cut
    held = statuses.count("408")  # each worker held at most its share; the probed one all of it
    assert share <= held <= workers * share and (workers > 1 or held == INFLIGHT), cut
    assert all(b"--http-min-body-rate-bytes" in a for a in cut if b" 408 " in a)


def test_a_dripping_chunked_inference_body_is_cut(server: ServerProcess) -> None:
    s = _drip(server, "/v2/models/fast/infer")
    started = time.monotonic()
    stop = threading.Event()

    def keep_dripping() -> None:  # one byte every 0.3 s: under the minimum rate
        while not stop.wait(0.3):
            try:
                s.sendall(b"1\r\n \r\n")
            except OSError:
                return

    dripper = threading.Thread(target=keep_dripping)
    dripper.start()
    try:
        answer = _answer(s)
    finally:
        stop.set()
        dripper.join()
    print(f"\na dripping body was cut after {time.monotonic() - started:.1f} s")
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"--http-min-body-rate-bytes" in answer


def test_a_big_tfserving_body_is_refused_before_it_is_parsed(server: ServerProcess) -> None:
    """About 40 MB of rows for a model that takes 8 values: refused on a comma count, as v2
    refuses it, not parsed on the event loop (which stalled health checks for seconds)."""
    rows = b"[" + b",".join([b"[1.5]"] * 6_000_000) + b"]"
    body = b'{"instances": ' + rows + b"}"
    seen: list[float] = []
    done = threading.Event()

    def probe_health() -> None:
        while not done.is_set():
            started = time.perf_counter()
            httpx.get(f"{server.http_url}/v2/health/live", timeout=30)
            seen.append(time.perf_counter() - started)
            time.sleep(0.05)

    prober = threading.Thread(target=probe_health)
    prober.start()
    try:
        r = httpx.post(f"{server.http_url}/v1/models/fast:predict", content=body, timeout=60)
    finally:
        done.set()
        prober.join()
    assert r.status_code == 400, r.text
    assert "more than model 'fast' takes" in r.json()["error"]
    print(
        f"\nhealth during a {len(body) / 1e6:.0f} MB TF Serving body: max {max(seen) * 1e3:.0f} ms"
    )


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("TRACE", "/v2/health/live", "GET"),
        ("DELETE", "/v2/models/fast/infer", "POST"),
        ("POST", "/v1/models/fast", "GET"),
    ],
)
def test_405_names_the_methods_the_route_takes(
    server: ServerProcess, method: str, path: str, allow: str
) -> None:
    r = httpx.request(method, f"{server.http_url}{path}", timeout=60)
    assert r.status_code == 405
    assert r.headers["allow"] == allow


def test_a_dripping_upload_is_cut_too(tmp_path: Path, server: ServerProcess) -> None:
    """Uploads stream to disk as they arrive; a chunked one that drips is cut by the rate."""
    s = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
    s.sendall(
        b"PUT /v2/repository/models/slow HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/gzip\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n\x1f\x8b\r\n"
    )
    answer = _answer(s)
    assert answer.startswith(b"HTTP/1.1 408"), answer


def test_slow_inference_bodies_do_not_hold_inference_slots(server: ServerProcess) -> None:
    """A request counts against --max-inflight-requests once its body is in: clients dripping
    bodies to the infer route itself (more of them than the limit) leave it to real calls."""
    drippers = [_drip(server, "/v2/models/fast/infer") for _ in range(3 * INFLIGHT)]
    url = f"{server.http_url}/v2/models/fast/infer"
    doc = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [2.0]}]}
    with _Feeder(drippers):
        answers = [httpx.post(url, json=doc, timeout=60).status_code for _ in range(2 * INFLIGHT)]
        assert all(_unanswered(s) for s in drippers)  # all still arriving meanwhile
    cut = [_answer(s) for s in drippers]
    assert answers == [200] * (2 * INFLIGHT)
    assert all(a.startswith(b"HTTP/1.1 408") for a in cut), cut
