"""A long ``ModelStreamInfer`` stream, as Triton's Python client sends one: thousands of requests
on one stream, every answer received and right, on both gRPC servers, in the default layout
(frontends beside a model host).

grpc's clients send bandwidth-probe pings while data flows; a server that counted them as
strikes without forgetting them as it answers would end the stream with GOAWAY
ENHANCE_YOUR_CALM ("too_many_pings") after about a thousand requests.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from inferd.demo.models import write_demo_repository
from tests.e2e.hostile_support import PING, STREAM_INFER, RawClient, frame, request_headers
from tests.support import ServerProcess

REQUESTS = 3000
ANSWER_TIMEOUT_S = 120.0  # a bound on a wait gone wrong, not a timing


@pytest.fixture(scope="module", params=["native", "grpcio"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"streams-{request.param}") / "models"
    write_demo_repository(root, models=["half_plus_two"])
    args = ["--http-workers", "3", "--grpc-server", request.param]
    proc = ServerProcess(root, extra_args=args).start()
    yield proc
    proc.stop()


def test_thousands_of_requests_on_one_stream(server: ServerProcess) -> None:
    assert "3 HTTP workers" in server.log()
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    got: dict[str, float] = {}
    errors: list[str] = []
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for i in range(REQUESTS):
                x = triton_grpc.InferInput("x", [1, 1], "FP32")
                x.set_data_from_numpy(np.array([[float(i)]], dtype=np.float32))
                client.async_stream_infer("half_plus_two", [x], request_id=str(i))
            for _ in range(REQUESTS):
                result, error = answers.get(timeout=ANSWER_TIMEOUT_S)
                if error is not None:
                    errors.append(str(error))
                    break  # a stream that ends answers nothing more
                got[result.get_response().id] = float(result.as_numpy("y")[0, 0])
        finally:
            client.stop_stream()
    assert errors == []
    assert got == {str(i): i / 2 + 2 for i in range(REQUESTS)}
    assert "too_many_pings" not in server.log()


def test_a_ping_flood_still_gets_goaway_on_an_idle_connection(server: ServerProcess) -> None:
    """The native server's keep-alive limits stay in force where it sends nothing. (grpcio's
    are grpc's core's own, set from the same flags: tests/unit/test_grpc_servers.py.)"""
    if "grpcio" in server.extra_args:
        pytest.skip("the native server's ping policy")
    for open_call in (False, True):  # no call; a stream the server has answered nothing on
        client = RawClient((server.host, server.grpc_port))
        try:
            if open_call:
                client.headers(1, request_headers(STREAM_INFER))
            for i in range(10):
                client.send(frame(PING, 0, 0, i.to_bytes(8, "big")))
            assert client.closed_within(30)
            assert client.seen.goaway == 0xB  # ENHANCE_YOUR_CALM: too_many_pings
        finally:
            client.close()
