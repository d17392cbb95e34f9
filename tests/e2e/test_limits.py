"""Limits at the edge: thousands of idle or slow connections, header and body timeouts, the
in-flight limit, the upload cap, full queues answered before the body, clients that leave.

Every wait is bounded; figures (latencies under idle connections) are printed, not asserted.
"""

from __future__ import annotations

import functools
import gzip
import json
import select
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest

from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols import grpc_service_pb2_grpc as pb_grpc
from tests.support import ServerProcess, pending_requests, wait_for

FAST = """backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
"""
# Gated models: each execution waits until the model's gate file exists, so a test holds
# requests in progress exactly as long as it needs (one test per model: a gate opens once).
GATED = {
    "slow": "",  # the HTTP in-flight limit
    "slow_grpc": "",  # the gRPC in-flight limit
    "hangup": "",  # a client that hangs up
    "queued": "dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
    "left": "dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
}
IDLE_CONNECTIONS = 5000
SLOW_CONNECTIONS = 200


def body(value: float = 1.0) -> dict[str, object]:
    return {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}


def write_model(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)


def gate(server: ServerProcess, model: str) -> Path:
    """The file whose creation lets the gated ``model``'s executions run."""
    return server.repository.parent / f"{model}.gate"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("limits") / "models"
    write_model(root, "fast", FAST)
    for name, queue in GATED.items():
        gate_file = root.parent / f"{name}.gate"
        write_model(
            root,
            name,
            f'backend: "echo"\nmax_batch_size: 1\n'
            'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
            "instance_group [{ count: 1 kind: KIND_CPU }]\n"
            f"{queue}\n"
            f'parameters {{ key: "gate_file" value: {{ string_value: "{gate_file}" }} }}\n',
        )
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
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
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
    assert len(during) == 20  # every request was answered (each within its timeout)


def _timed_request(url: str) -> float:
    started = time.perf_counter()
    r = httpx.post(url, json=body(), timeout=60)  # a new connection each time
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
    assert _closed_within(silent, 60)
    assert _closed_within(dripping, 60)
    assert _closed_within(kept, 60)  # idle after its answer: closed by the same timeout


def test_a_body_that_stalls_gets_408(limited: ServerProcess) -> None:
    s = _connect(limited.http_port)
    s.sendall(
        b'POST /v2/models/fast/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"in'
    )
    s.settimeout(60)
    answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"--http-body-timeout-s" in answer
    s.close()


def _share(server: ServerProcess) -> int:
    """One worker's share of --max-inflight-requests 4: each of N workers takes 1/N of it,
    rounded up (docs/security/limits.md), on each port."""
    return -(-4 // server.workers())


def _hold_every_share(
    server: ServerProcess, model: str, pool: ThreadPoolExecutor
) -> list[Future[httpx.Response]]:
    """Requests to a gated model that hold every worker's share of the in-flight limit. The
    kernel picks the worker of each connection: each request is sent once the one before is
    counted (held) or answered (refused: its worker's share was held already)."""
    url = f"{server.http_url}/v2/models/{model}/infer"
    held: list[Future[httpx.Response]] = []
    for _ in range(50):
        if len(held) == server.workers() * _share(server):
            return held
        call = pool.submit(httpx.post, url, json=body(), timeout=60)
        wait_for(
            lambda: call.done() or pending_requests(server, model) == len(held) + 1,  # noqa: B023
            f"request {len(held) + 1} counted or answered",
        )
        if call.done():
            assert call.result().status_code == 503, call.result().text
        else:
            held.append(call)
    raise AssertionError(f"{len(held)} requests held after 50 sent")


def test_the_in_flight_limit_answers_503_at_once(limited: ServerProcess) -> None:
    url = f"{limited.http_url}/v2/models/slow/infer"
    with ThreadPoolExecutor(4 * limited.workers()) as pool:
        # The held requests take the in-flight slots: the model counts them (its gate keeps
        # them there).
        calls = _hold_every_share(limited, "slow", pool)
        started = time.perf_counter()
        r = httpx.post(url, json=body(), timeout=60)
        waited = time.perf_counter() - started
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert f"--max-inflight-requests {_share(limited)}" in r.json()["error"]
        # Health is never counted: a probe answers while the server sheds.
        assert httpx.get(f"{limited.http_url}/v2/health/ready", timeout=60).status_code == 200
        assert not any(c.done() for c in calls)  # all still held when the next was refused
        gate(limited, "slow").touch()
        assert [c.result().status_code for c in calls] == [200] * len(calls)
    print(f"\nshed at the in-flight limit in {waited * 1e3:.1f} ms")
    assert httpx.post(url, json=body(), timeout=60).status_code == 200  # recovered


def _infer_message(model: str, value: float = 1.0) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model)
    tensor = message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    tensor.contents.fp32_contents.append(value)
    return message


def test_the_grpc_in_flight_limit_answers_at_once(limited: ServerProcess) -> None:
    """The native gRPC server (the default) counts calls as grpcio's maximum_concurrent_rpcs
    does: past --max-inflight-requests a call is RESOURCE_EXHAUSTED at once."""
    assert "(native server)" in limited.log()
    channel = grpc.insecure_channel(limited.grpc_address)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    message = _infer_message("slow_grpc")
    # One channel is one connection, served by one worker: its share is what the calls take.
    share = _share(limited)
    running = [stub.ModelInfer.future(message, timeout=60) for _ in range(share)]
    wait_for(lambda: pending_requests(limited, "slow_grpc") == share, "the calls in progress")
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(message, timeout=60)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not any(f.done() for f in running)
    gate(limited, "slow_grpc").touch()
    assert [len(f.result(timeout=60).outputs) for f in running] == [1] * share
    assert stub.ModelInfer(message, timeout=60).outputs  # recovered
    channel.close()


def _counted_or_answered(server: ServerProcess, call: Future[httpx.Response], count: int) -> bool:
    return call.done() or pending_requests(server, "queued") == count


def test_a_full_queue_answers_before_the_body_is_read(limited: ServerProcess) -> None:
    url = f"{limited.http_url}/v2/models/queued/infer"
    with ThreadPoolExecutor(4) as pool:
        # Each next request once the one before is counted: one executes (held by the gate),
        # one may wait at the instance, one in the queue; then the queue refuses at once. A
        # serving process holding its share of in-flight requests refuses too, before the
        # queue is asked: that refusal says nothing of the queue (it may not be full yet), so
        # the request is sent again (the kernel picks the process of each new connection).
        calls: list[Future[httpx.Response]] = []
        shed: list[str] = []
        while True:
            assert len(calls) < 4 and len(shed) < 12, (len(calls), shed)
            call = pool.submit(httpx.post, url, json=body(), timeout=60)
            wait_for(
                functools.partial(_counted_or_answered, limited, call, len(calls) + 1),
                f"request {len(calls) + 1} counted or answered",
            )
            if not call.done():
                calls.append(call)
                continue
            refused = call.result()
            assert refused.status_code == 503, refused.text
            if "requests in progress" not in refused.text:
                break
            shed.append(refused.text)
        assert "queue of model 'queued/1' is full" in refused.text, refused.text
        answers = []
        for _ in range(12):  # a process holding its share of in-flight requests refuses first
            s = _connect(limited.http_port)
            s.sendall(  # announces 50 MB and sends none of it: the 503 must not wait for it
                b"POST /v2/models/queued/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Length: 50000000\r\n\r\n"
            )
            s.settimeout(60)
            answers.append(s.recv(4096))
            s.close()
            if b"requests in progress" not in answers[-1]:
                break
        answer = answers[-1]
        gate(limited, "queued").touch()
        results = [c.result().status_code for c in calls]
    assert results == [200] * len(calls) and len(calls) >= 2
    # Whichever serving process took the connection: the host's queue is known to each.
    assert all(a.startswith(b"HTTP/1.1 503") for a in answers), answers
    assert b"queue of model 'queued/1' is full" in answer


def _answered(s: socket.socket) -> bool:
    """Whether the server has answered (or closed) ``s``, without waiting."""
    readable, _, _ = select.select([s], [], [], 0)
    return bool(readable)


def _start_upload(port: int) -> socket.socket:
    s = _connect(port)
    s.sendall(
        b"PUT /v2/repository/models/up HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/gzip\r\nContent-Length: 1000\r\n\r\n\x1f\x8b"
    )
    return s


def test_only_so_many_uploads_at_once(limited: ServerProcess) -> None:
    # The first upload holds the only slot from its head until its body times out (1 s): the
    # second is refused while it does. Should the first be cut before the server saw the second
    # (a very busy host), it is started again: the refusal must come while an upload is held.
    first = _start_upload(limited.http_port)
    deadline = time.monotonic() + 60
    try:
        while True:
            r = httpx.put(
                f"{limited.http_url}/v2/repository/models/up2",
                content=b"\x1f\x8b" + b"\0" * 100,
                headers={"content-type": "application/gzip"},
                timeout=60,
            )
            if r.status_code == 503 or time.monotonic() > deadline:
                break
            if _answered(first):
                first.close()
                first = _start_upload(limited.http_port)
            time.sleep(0.02)
        assert r.status_code == 503 and "--max-concurrent-uploads 1" in r.json()["error"]
    finally:
        first.close()


def test_hostile_bodies_and_headers_are_4xx(limited: ServerProcess) -> None:
    url = f"{limited.http_url}/v2/models/fast/infer"
    bomb = gzip.compress(b"\0" * (200 << 20), compresslevel=9)  # 200 MiB of zeros, ~200 KB
    r = httpx.post(url, content=bomb, headers={"content-encoding": "gzip"}, timeout=60)
    assert r.status_code == 413 and "decompressed" in r.json()["error"]
    r = httpx.post(url, json=body(), headers={"x-big": "a" * (1 << 20)}, timeout=60)
    assert r.status_code == 431
    deep = b"[" * 100_000 + b"]" * 100_000
    r = httpx.post(url, content=deep, timeout=60)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]
    for path in ("/v2/models/..%2F..%2Fetc/infer", "/v2/models/%2e%2e/infer", "/v2/models/../x"):
        r = httpx.post(f"{limited.http_url}{path}", json=body(), timeout=60)
        assert 400 <= r.status_code < 500, (path, r.status_code)
    huge = {"inputs": [{"name": "INPUT0", "shape": [0, 1 << 62], "datatype": "FP32", "data": []}]}
    r = httpx.post(url, json=huge, timeout=60)
    assert r.status_code == 400, r.text
    overflow = {"inputs": [{"name": "INPUT0", "shape": [1 << 40, 1 << 40], "datatype": "FP32"}]}
    r = httpx.post(
        url,
        content=__import__("json").dumps(overflow).encode(),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400
    assert httpx.get(f"{limited.http_url}/v2/health/ready", timeout=60).status_code == 200


def _endpoint_statuses(server: ServerProcess) -> list[str]:
    metrics = httpx.get(f"{server.http_url}/metrics", timeout=30).text
    return [m for m in metrics.splitlines() if m.startswith("inferd_endpoint_requests_total")]


def test_a_client_that_hangs_up_is_499_not_500(limited: ServerProcess) -> None:
    payload = json.dumps(body()).encode()
    s = _connect(limited.http_port)
    s.sendall(
        b"POST /v2/models/hangup/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    wait_for(lambda: pending_requests(limited, "hangup") == 1, "the request in progress")
    s.close()  # hangs up while its request executes (held by the gate)
    wait_for(
        lambda: any('status="499"' in m for m in _endpoint_statuses(limited)),
        "the hung-up request counted as 499",
    )
    gate(limited, "hangup").touch()
    wait_for(lambda: pending_requests(limited, "hangup") == 0, "the execution to end")
    lines = _endpoint_statuses(limited)
    assert any('status="499"' in m for m in lines), lines
    assert not any('status="500"' in m for m in lines), lines


def test_grpc_work_for_a_client_that_left_is_not_run(limited: ServerProcess) -> None:
    channel = grpc.insecure_channel(limited.grpc_address)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    stats = pb.ModelStatisticsRequest(name="left")
    executions = stub.ModelStatistics(stats).model_stats[0].execution_count
    first = stub.ModelInfer.future(_infer_message("left", 1.0), timeout=60)  # held by the gate
    wait_for(lambda: pending_requests(limited, "left") == 1, "the first call executing")
    # The second waits behind it until its deadline; the server must see it before then (on a
    # very busy host the deadline may pass first: then again, with a longer one).
    timeout_s = 1.0
    while True:
        second = stub.ModelInfer.future(_infer_message("left", 2.0), timeout=timeout_s)
        seen = False
        while not second.done():
            seen = seen or pending_requests(limited, "left") == 2
            time.sleep(0.01)
        assert second.code() == grpc.StatusCode.DEADLINE_EXCEEDED, second.code()
        if seen:
            break
        assert timeout_s < 60, "the server never counted the second call"
        timeout_s *= 2
    # The server drops the call whose client left, while the first still holds the instance.
    wait_for(lambda: pending_requests(limited, "left") == 1, "the second call dropped")
    gate(limited, "left").touch()
    assert first.result(timeout=60).outputs
    wait_for(lambda: pending_requests(limited, "left") == 0, "the first call answered")
    after = stub.ModelStatistics(stats).model_stats[0].execution_count
    assert after - executions == 1  # the second request never ran
    channel.close()
