"""Limits at the edge: thousands of idle or slow connections, header and body timeouts, the
in-flight limit, the upload cap, full queues answered before the body, clients that leave.

Every wait is bounded; figures (latencies under idle connections) are printed, not asserted.
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols import grpc_service_pb2_grpc as pb_grpc
from tests.support import ServerProcess

SLOW = """backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
parameters { key: "delay_ms" value: { string_value: "600" } }
"""
QUEUED = """backend: "echo"
max_batch_size: 1
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
parameters { key: "delay_ms" value: { string_value: "1500" } }
dynamic_batching { default_queue_policy { max_queue_size: 1 } }
"""
FAST = """backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
"""
IDLE_CONNECTIONS = 5000
SLOW_CONNECTIONS = 200


def body(value: float = 1.0) -> dict[str, object]:
    return {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}


def write_model(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("limits") / "models"
    for name, config in (("slow", SLOW), ("queued", QUEUED), ("fast", FAST)):
        write_model(root, name, config)
    server = ServerProcess(
        root,
        extra_args=[
            "--http-header-timeout-s",
            "1",
            "--http-body-timeout-s",
            "1",
            "--max-inflight-requests",
            "4",
            "--max-concurrent-uploads",
            "1",
            "--model-control-mode",
            "explicit",
            "--load-model",
            "*",
        ],
    ).start()
    yield server
    server.stop()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    return s


def _closed_within(s: socket.socket, seconds: float) -> bool:
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
        return True
    except (TimeoutError, OSError) as exc:
        return not isinstance(exc, TimeoutError)


def test_idle_and_slow_connections_cost_real_clients_nothing(limited: ServerProcess) -> None:
    port = limited.http_port
    url = f"{limited.http_url}/v2/models/fast/infer"
    before = [_timed_request(url) for _ in range(10)]
    idle: list[socket.socket] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            idle.append(_connect(port))  # connected, sends nothing
        for _ in range(SLOW_CONNECTIONS):
            s = _connect(port)
            s.sendall(b"POST /v2/models/fast/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")  # drip
            idle.append(s)
        during = [_timed_request(url) for _ in range(20)]
    finally:
        for s in idle:
            s.close()
    print(
        f"\n{IDLE_CONNECTIONS} idle + {SLOW_CONNECTIONS} slow connections: a new client's "
        f"request took median {sorted(during)[10] * 1e3:.1f} ms "
        f"(max {max(during) * 1e3:.1f}), before {sorted(before)[5] * 1e3:.1f} ms"
    )
    assert len(during) == 20  # every request was answered (each within its 10 s timeout)


def _timed_request(url: str) -> float:
    started = time.perf_counter()
    r = httpx.post(url, json=body(), timeout=10)  # a new connection each time
    assert r.status_code == 200, r.text
    return time.perf_counter() - started


def test_header_timeout_closes_silent_slow_and_idle_keep_alive_connections(
    limited: ServerProcess,
) -> None:
    silent = _connect(limited.http_port)  # connects, never sends a byte
    dripping = _connect(limited.http_port)
    dripping.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHo")
    kept = _connect(limited.http_port)
    kept.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert kept.recv(100).startswith(b"HTTP/1.1 200")
    assert _closed_within(silent, 8)
    assert _closed_within(dripping, 8)
    assert _closed_within(kept, 8)  # idle after its answer: closed by the same timeout


def test_a_body_that_stalls_gets_408(limited: ServerProcess) -> None:
    s = _connect(limited.http_port)
    s.sendall(
        b'POST /v2/models/fast/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"in'
    )
    s.settimeout(8)
    answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"--http-body-timeout-s" in answer
    s.close()


def test_the_in_flight_limit_answers_503_at_once(limited: ServerProcess) -> None:
    url = f"{limited.http_url}/v2/models/slow/infer"
    results: list[int] = []

    def call() -> None:
        results.append(httpx.post(url, json=body(), timeout=10).status_code)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # the four are in progress (each takes 600 ms)
    started = time.perf_counter()
    r = httpx.post(url, json=body(), timeout=10)
    waited = time.perf_counter() - started
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "--max-inflight-requests 4" in r.json()["error"]
    # Health is never counted: a probe answers while the server sheds.
    assert httpx.get(f"{limited.http_url}/v2/health/ready").status_code == 200
    for t in threads:
        t.join()
    assert sorted(results) == [200, 200, 200, 200]
    print(f"\nshed at the in-flight limit in {waited * 1e3:.1f} ms")
    assert httpx.post(url, json=body(), timeout=10).status_code == 200  # recovered


def test_the_grpc_in_flight_limit_answers_at_once(limited: ServerProcess) -> None:
    """The native gRPC server (the default) counts calls as grpcio's maximum_concurrent_rpcs
    does: past --max-inflight-requests a call is RESOURCE_EXHAUSTED at once."""
    assert "(native server)" in limited.log()
    channel = grpc.insecure_channel(limited.grpc_address)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    message = pb.ModelInferRequest(model_name="slow")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(
        1.0
    )
    running = [stub.ModelInfer.future(message) for _ in range(4)]
    time.sleep(0.3)  # the four are in progress (each takes 600 ms)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(message, timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert [len(f.result(timeout=10).outputs) for f in running] == [1, 1, 1, 1]
    assert stub.ModelInfer(message, timeout=10).outputs  # recovered
    channel.close()


def test_a_full_queue_answers_before_the_body_is_read(limited: ServerProcess) -> None:
    url = f"{limited.http_url}/v2/models/queued/infer"
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(httpx.post(url, json=body()).status_code))
        for _ in range(3)
    ]
    for t in threads:  # one executes (800 ms), one waits at the instance, one in the queue
        t.start()
        time.sleep(0.2)
    answer = b""
    for _ in range(5):  # on a busy host the queue may fill a little later
        s = _connect(limited.http_port)
        s.sendall(  # announces 50 MB and sends none of it: the 503 must not wait for it
            b"POST /v2/models/queued/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 50000000\r\n\r\n"
        )
        s.settimeout(5)
        answer = s.recv(4096)
        s.close()
        if answer.startswith(b"HTTP/1.1 503"):
            break
    for t in threads:
        t.join()
    assert answer.startswith(b"HTTP/1.1 503"), (answer, results)
    assert b"queue of model 'queued/1' is full" in answer
    assert sorted(results) == [200, 200, 200]


def test_only_so_many_uploads_at_once(limited: ServerProcess) -> None:
    first = _connect(limited.http_port)
    first.sendall(
        b"PUT /v2/repository/models/up HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/gzip\r\nContent-Length: 1000\r\n\r\n\x1f\x8b"
    )
    time.sleep(0.3)
    r = httpx.put(
        f"{limited.http_url}/v2/repository/models/up2",
        content=b"\x1f\x8b" + b"\0" * 100,
        headers={"content-type": "application/gzip"},
    )
    assert r.status_code == 503 and "--max-concurrent-uploads 1" in r.json()["error"]
    first.close()


def test_hostile_bodies_and_headers_are_4xx(limited: ServerProcess) -> None:
    url = f"{limited.http_url}/v2/models/fast/infer"
    bomb = gzip.compress(b"\0" * (200 << 20), compresslevel=9)  # 200 MiB of zeros, ~200 KB
    r = httpx.post(url, content=bomb, headers={"content-encoding": "gzip"})
    assert r.status_code == 413 and "decompressed" in r.json()["error"]
    r = httpx.post(url, json=body(), headers={"x-big": "a" * (1 << 20)})
    assert r.status_code == 431
    deep = b"[" * 100_000 + b"]" * 100_000
    r = httpx.post(url, content=deep)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]
    for path in ("/v2/models/..%2F..%2Fetc/infer", "/v2/models/%2e%2e/infer", "/v2/models/../x"):
        r = httpx.post(f"{limited.http_url}{path}", json=body())
        assert 400 <= r.status_code < 500, (path, r.status_code)
    huge = {"inputs": [{"name": "INPUT0", "shape": [0, 1 << 62], "datatype": "FP32", "data": []}]}
    r = httpx.post(url, json=huge)
    assert r.status_code == 400, r.text
    overflow = {"inputs": [{"name": "INPUT0", "shape": [1 << 40, 1 << 40], "datatype": "FP32"}]}
    r = httpx.post(
        url,
        content=__import__("json").dumps(overflow).encode(),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert httpx.get(f"{limited.http_url}/v2/health/ready").status_code == 200


def test_a_client_that_hangs_up_is_499_not_500(limited: ServerProcess) -> None:
    url = f"{limited.http_url}/v2/models/slow/infer"
    with contextlib.suppress(httpx.TimeoutException):
        httpx.post(url, json=body(), timeout=0.2)
    time.sleep(1.0)
    metrics = httpx.get(f"{limited.http_url}/metrics").text
    lines = [m for m in metrics.splitlines() if m.startswith("inferd_endpoint_requests_total")]
    assert any('status="499"' in m for m in lines), lines
    assert not any('status="500"' in m for m in lines)


def test_grpc_work_for_a_client_that_left_is_not_run(limited: ServerProcess) -> None:
    channel = grpc.insecure_channel(limited.grpc_address)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]

    def request(value: float) -> pb.ModelInferRequest:
        message = pb.ModelInferRequest(model_name="queued")
        tensor = message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
        tensor.contents.fp32_contents.append(value)
        return message

    stats = pb.ModelStatisticsRequest(name="queued")
    executions = stub.ModelStatistics(stats).model_stats[0].execution_count
    first = stub.ModelInfer.future(request(1.0))  # executes for 800 ms
    time.sleep(0.15)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request(2.0), timeout=0.2)  # queued, then its client is gone
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert first.result(timeout=10).outputs
    time.sleep(1.0)
    after = stub.ModelStatistics(stats).model_stats[0].execution_count
    assert after - executions == 1  # the second request never ran
    channel.close()
