"""One inferd.Server serving over HTTP and gRPC while the application calls it in process:
both reach the same model instances, and their requests to a model share batches."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

import inferd
from inferd.backends import echo
from inferd.core.errors import ConfigError
from tests.e2e.embedded_support import close_gate, open_gate, write_repository
from tests.support import free_port

ROWS = [[1.0, 1.0]]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[inferd.Server, str]]:
    repo = write_repository(tmp_path_factory.mktemp("embedded-http") / "models")
    port = free_port()
    with inferd.Server(
        model_repository=repo,
        load_model=["half_plus_two", "shared", "digits"],
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
    ) as server:
        server.serve_http(port)
        yield server, f"http://127.0.0.1:{port}"


def _pending(server: inferd.Server, model: str) -> int:
    return server.registry.get(model).stats.pending


def _wait_for(condition: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def test_network_and_in_process_requests_share_one_batch(
    served: tuple[inferd.Server, str],
) -> None:
    server, url = served
    close_gate()
    answers: dict[str, Any] = {}

    def local(request_id: str, value: float) -> None:
        x = np.full((1, 2), value, np.float32)
        answers[request_id] = server.infer("shared", {"INPUT0": x}, request_id=request_id)

    def network(request_id: str, value: float) -> None:
        body = {
            "id": request_id,
            "inputs": [
                {"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [value] * 2}
            ],
        }
        answers[request_id] = httpx.post(f"{url}/v2/models/shared/infer", json=body, timeout=30)

    first = threading.Thread(target=local, args=("first", 0.0))
    first.start()  # executes alone, held at the gate
    _wait_for(lambda: _pending(server, "shared") == 1 and bool(echo.gate("embedded-shared")))
    behind = [
        threading.Thread(target=network, args=("net", 1.0)),
        threading.Thread(target=local, args=("local", 2.0)),
    ]
    for t in behind:
        t.start()
    _wait_for(lambda: _pending(server, "shared") == 3)  # both queued behind the busy instance
    open_gate()
    for t in [first, *behind]:
        t.join(30)
    assert answers["local"]["OUTPUT0"].tolist() == [[2.0, 2.0]]
    assert answers["first"]["OUTPUT0"].tolist() == [[0.0, 0.0]]
    net = answers["net"]
    assert net.status_code == 200, net.text
    assert net.json()["outputs"][0]["data"] == [1.0, 1.0]
    # One execution for the first request, one batch for the other two.
    batches = [sorted(e.request_ids) for e in echo.LOG["shared"]]
    assert batches == [["first"], ["local", "net"]]
    stats = httpx.get(f"{url}/v2/models/shared/stats", timeout=60).json()["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (3, 2)
    batch_sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert batch_sizes == {1: 1, 2: 1}
    (local_stats,) = server.statistics("shared")
    assert (local_stats.inference_count, local_stats.execution_count) == (3, 2)


def test_both_paths_see_the_same_models_and_metrics(served: tuple[inferd.Server, str]) -> None:
    server, url = served
    x = [1.0, 2.0]
    local = server.infer("half_plus_two", {"x": np.array([x], np.float32).T})
    body = {"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": x}]}
    remote = httpx.post(f"{url}/v2/models/half_plus_two/infer", json=body, timeout=60).json()
    assert remote["outputs"][0]["data"] == local["y"].ravel().tolist() == [2.5, 3.0]
    assert httpx.get(f"{url}/v2/health/ready", timeout=60).status_code == 200
    index = httpx.post(f"{url}/v2/repository/index", timeout=60).json()
    assert {(e["name"], e.get("state")) for e in index} >= {("half_plus_two", "READY")}
    metrics = httpx.get(f"{url}/metrics", timeout=60).text
    (stats,) = server.statistics("half_plus_two")
    line = 'inferd_request_success_total{model="half_plus_two",version="1"} '
    assert f"{line}{float(stats.inference_stats.success.count)}" in metrics
    assert stats.inference_stats.success.count >= 2  # the call in process and the request
    assert httpx.get(f"{url}/dashboard/", timeout=60).status_code == 200


def test_grpc_on_the_same_instance(served: tuple[inferd.Server, str]) -> None:
    server, _ = served
    port = server.serve_grpc(0)  # 0: a free port, returned
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = triton_grpc.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[4.0]], np.float32))
    before = server.statistics("half_plus_two")[0].inference_count
    assert client.infer("half_plus_two", [tensor]).as_numpy("y").tolist() == [[4.0]]
    assert server.statistics("half_plus_two")[0].inference_count == before + 1
    client.close()


def test_a_port_in_use_is_a_config_error(served: tuple[inferd.Server, str]) -> None:
    server, _ = served
    with socket.socket() as holder:  # a listener of another program's, without SO_REUSEPORT
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(ConfigError, match=r"cannot serve HTTP on 127\.0\.0\.1"):
            server.serve_http(holder.getsockname()[1])
    assert server.infer("half_plus_two", {"x": np.ones((1, 1), np.float32)})["y"][0, 0] == 2.5


def test_an_awaited_server_serves_http_until_it_stops(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "models")
    port = free_port()

    async def run() -> None:
        async with inferd.Server(
            model_repository=repo,
            load_model=["half_plus_two"],
            http_address="127.0.0.1",
            grpc_address="127.0.0.1",
        ) as server:
            assert await server.async_serve_http(port) == port
            async with httpx.AsyncClient(timeout=60) as client:
                live = await client.get(f"http://127.0.0.1:{port}/v2/health/live")
                assert live.status_code == 200
            grpc_port = await server.async_serve_grpc(0)
            client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            assert await asyncio.to_thread(client.is_model_ready, "half_plus_two")
            client.close()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=60)

    asyncio.run(run())
