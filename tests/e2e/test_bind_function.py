"""A Python function bound on an in-process inferd.Server: served over HTTP and gRPC and called
in process, batched by the dynamic batcher, one instance per function of a list, and its
failures answered as errors while the server keeps serving."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

import inferd
from inferd.core.errors import ConfigError, InternalError
from tests.support import free_port, wait_for

TIMEOUT_S = 60.0


class Recorder:
    """Functions that record each call's request count and instance, held at a gate."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (instance, requests)
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def function(self, instance: int) -> Any:
        def add_sub(requests: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, Any]]:
            with self.lock:
                self.calls.append((instance, len(requests)))
            assert self.gate.wait(TIMEOUT_S)
            return [
                {
                    "SUM": r["A"] + r["B"],
                    "DIFF": r["A"] - r["B"],
                    "INSTANCE": np.full((len(r["A"]), 1), instance, np.int32),
                }
                for r in requests
            ]

        return add_sub


AB = [("A", np.float32, (-1,)), ("B", np.float32, (-1,))]
OUT = [("SUM", np.float32, (-1,)), ("DIFF", np.float32, (-1,)), ("INSTANCE", np.int32, (1,))]


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[inferd.Server, Recorder, Recorder, int, int]]:
    repo = tmp_path_factory.mktemp("bind") / "models"
    repo.mkdir()
    batched, pair = Recorder(), Recorder()
    with inferd.Server(
        model_repository=str(repo), http_address="127.0.0.1", grpc_address="127.0.0.1"
    ) as server:
        server.bind(
            "batched",
            batched.function(0),
            AB,
            OUT,
            max_batch_size=16,
            dynamic_batching={"max_queue_delay_microseconds": 2000},
        )
        server.bind("pair", [pair.function(0), pair.function(1)], AB, OUT, max_batch_size=4)

        def broken(requests: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, Any]]:
            if float(requests[0]["A"].sum()) < 0:
                raise ValueError("negative input")
            return []  # no response for the request: the server says so

        server.bind("broken", broken, AB, OUT[:1], max_batch_size=4)
        http_port = server.serve_http(free_port())
        grpc_port = server.serve_grpc(free_port())
        yield server, batched, pair, http_port, grpc_port


def _http_inputs(a: np.ndarray, b: np.ndarray) -> list[triton_http.InferInput]:
    inputs = []
    for name, value in (("A", a), ("B", b)):
        tensor = triton_http.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def _grpc_inputs(a: np.ndarray, b: np.ndarray) -> list[triton_grpc.InferInput]:
    inputs = []
    for name, value in (("A", a), ("B", b)):
        tensor = triton_grpc.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def test_a_bound_function_answers_over_http_grpc_and_in_process(
    served: tuple[inferd.Server, Recorder, Recorder, int, int],
) -> None:
    server, _, _, http_port, grpc_port = served
    a = np.array([[1.0, 2.0, 3.0]], np.float32)
    b = np.array([[0.5, 0.5, 0.5]], np.float32)
    http = triton_http.InferenceServerClient(f"127.0.0.1:{http_port}", network_timeout=TIMEOUT_S)
    result = http.infer("batched", _http_inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    answer = grpc.infer("batched", _grpc_inputs(a, b), client_timeout=TIMEOUT_S)
    np.testing.assert_array_equal(answer.as_numpy("SUM"), a + b)
    local = server.infer("batched", {"A": a, "B": b})
    np.testing.assert_array_equal(local["DIFF"], a - b)
    metadata = http.get_model_metadata("batched")
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
        ("A", "FP32", [-1, -1]),
        ("B", "FP32", [-1, -1]),
    ]
    config = grpc.get_model_config("batched", as_json=True)["config"]
    assert config["backend"] == "function"
    assert int(config["max_batch_size"]) == 16
    assert grpc.is_model_ready("batched")


def test_requests_queued_behind_a_busy_instance_reach_the_function_as_one_batch(
    served: tuple[inferd.Server, Recorder, Recorder, int, int],
) -> None:
    server, batched, _, http_port, _ = served
    batched.calls.clear()
    batched.gate.clear()
    url = f"127.0.0.1:{http_port}"

    def call(value: float) -> np.ndarray:
        client = triton_http.InferenceServerClient(url, network_timeout=TIMEOUT_S)
        a = np.full((1, 2), value, np.float32)
        out = client.infer("batched", _http_inputs(a, a)).as_numpy("SUM")
        assert out is not None
        return np.asarray(out)

    try:
        with ThreadPoolExecutor(6) as pool:
            first = pool.submit(call, 1.0)
            wait_for(lambda: batched.calls or None, "the first call to start")
            rest = [pool.submit(call, float(v)) for v in range(2, 7)]
            wait_for(
                lambda: server.registry.get("batched").stats.pending >= 6 or None,
                "five requests queued behind the first",
            )
            batched.gate.set()
            sums = [first.result(TIMEOUT_S), *(f.result(TIMEOUT_S) for f in rest)]
    finally:
        batched.gate.set()
    assert [float(s[0, 0]) for s in sums] == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    assert batched.calls[0] == (0, 1)
    assert sum(n for _, n in batched.calls) == 6
    assert max(n for _, n in batched.calls[1:]) > 1  # queued requests were batched


def test_a_list_of_functions_runs_one_instance_each(
    served: tuple[inferd.Server, Recorder, Recorder, int, int],
) -> None:
    server, _, pair, _, grpc_port = served
    pair.calls.clear()
    pair.gate.clear()

    def call(value: float) -> int:
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        a = np.full((1, 2), value, np.float32)
        out = client.infer("pair", _grpc_inputs(a, a), client_timeout=TIMEOUT_S)
        instance = out.as_numpy("INSTANCE")
        assert instance is not None
        return int(instance[0, 0])

    try:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(call, 1.0), pool.submit(call, 2.0)]
            wait_for(lambda: len(pair.calls) == 2 or None, "both instances to be busy")
            pair.gate.set()
            instances = sorted(f.result(TIMEOUT_S) for f in futures)
    finally:
        pair.gate.set()
    assert instances == [0, 1]
    assert sorted(i for i, _ in pair.calls) == [0, 1]
    assert server.model_config("pair").instance_group[0].count == 2


def test_a_failing_function_fails_its_request_and_the_server_keeps_serving(
    served: tuple[inferd.Server, Recorder, Recorder, int, int],
) -> None:
    server, _, _, http_port, _ = served
    http = triton_http.InferenceServerClient(f"127.0.0.1:{http_port}", network_timeout=TIMEOUT_S)
    minus = np.full((1, 2), -1.0, np.float32)
    with pytest.raises(InferenceServerException, match="negative input"):
        http.infer("broken", _http_inputs(minus, minus))
    plus = np.ones((1, 2), np.float32)
    with pytest.raises(InferenceServerException, match="returned 0 responses for 1 requests"):
        http.infer("broken", _http_inputs(plus, plus))
    with pytest.raises(InternalError, match="returned 0 responses"):
        server.infer("broken", {"A": plus, "B": plus})
    result = http.infer("batched", _http_inputs(plus, plus))
    np.testing.assert_array_equal(result.as_numpy("SUM"), plus * 2)


def test_a_bind_with_a_bad_tensor_is_a_config_error(
    served: tuple[inferd.Server, Recorder, Recorder, int, int], tmp_path: Path
) -> None:
    server = served[0]
    with pytest.raises(ConfigError, match="has no inference datatype"):
        server.bind("bad", lambda r: r, [("A", complex, (1,))], [("B", np.float32, (1,))])
    with pytest.raises(ConfigError, match="dynamic batching needs max_batch_size"):
        server.bind("bad", lambda r: r, AB, OUT, dynamic_batching=True)
    assert "bad" not in {entry.name for entry in server.models()}


def test_a_decoupled_function_streams_in_process_and_over_grpc(
    served: tuple[inferd.Server, Recorder, Recorder, int, int],
) -> None:
    server, _, _, _, grpc_port = served

    def count(requests: Sequence[Mapping[str, np.ndarray]]) -> Iterator[list[Any]]:
        wanted = [int(r["N"][0]) for r in requests]
        for i in range(max(wanted)):
            if i == 3:
                raise ValueError("three is too many")
            yield [{"OUT": np.array([i], np.int32)} if i < n else None for n in wanted]

    server.bind(
        "count",
        count,
        [("N", np.int32, (1,))],
        [("OUT", np.int32, (1,))],
        config={"model_transaction_policy": {"decoupled": True}},
    )
    parts = server.infer_stream("count", {"N": np.array([3], np.int32)})
    assert [p["OUT"].tolist() for p in parts] == [[0], [1], [2]]
    with pytest.raises(InternalError, match="three is too many"):
        list(server.infer_stream("count", {"N": np.array([5], np.int32)}))

    answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        n = triton_grpc.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([2], np.int32))
        client.async_stream_infer("count", [n], enable_empty_final_response=True)
        got: list[int] = []
        while True:
            result, error = answers.get(timeout=TIMEOUT_S)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            if result.get_response().outputs:
                got.append(int(result.as_numpy("OUT")[0]))
            if final:
                break
    finally:
        client.stop_stream()
    assert got == [0, 1]


def test_a_load_over_the_network_cannot_name_a_bound_function(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    with inferd.Server(
        model_repository=str(repo), model_control_mode="explicit", http_address="127.0.0.1"
    ) as server:
        server.bind("add", Recorder().function(0), AB, OUT, max_batch_size=4)
        key = server.model_config("add").parameters["bound_function_key"].string_value
        port = server.serve_http(free_port())
        config = {
            "backend": "function",
            "max_batch_size": 4,
            "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [{"name": "SUM", "data_type": "TYPE_FP32", "dims": [-1]}],
            "parameters": {"bound_function_key": {"string_value": key[::-1]}},
        }
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v2/repository/models/add/load",
            json={"parameters": {"config": json.dumps(config), "file:1/x": ""}},
            timeout=TIMEOUT_S,
        )
        assert reply.status_code == 400, reply.text
        assert "no function of this process is bound to it" in reply.json()["error"]
        assert server.model_ready("add")
