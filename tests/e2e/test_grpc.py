"""KServe v2 gRPC end to end: tritonclient.grpc, a raw stub, health, reflection, real servers."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from tritonclient.grpc import InferenceServerClient as Client
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.grpc_address) as c:
        yield c


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_address) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> Any:
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _input(name: str, array: np.ndarray, datatype: str = "") -> triton_grpc.InferInput:
    inp = triton_grpc.InferInput(name, list(array.shape), datatype or _datatype(array))
    inp.set_data_from_numpy(array)
    return inp


def _datatype(array: np.ndarray) -> str:
    return {"float32": "FP32", "int32": "INT32", "int64": "INT64"}[array.dtype.name]


def _digits_sample(repo: Path) -> tuple[np.ndarray, np.ndarray]:
    sample = json.loads((repo / "digits" / "sample.json").read_text())
    return np.asarray(sample["inputs"], dtype=np.float32), np.asarray(sample["labels"])


def test_health_and_server_metadata(client: Client) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("digits")
    assert client.is_model_ready("digits", "1")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "inferd"
    assert "model_repository" in meta["extensions"]


def test_model_metadata(client: Client) -> None:
    meta = client.get_model_metadata("digits", as_json=True)
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "64"]}]
    assert {"name": "label", "datatype": "INT64", "shape": ["-1", "1"]} in meta["outputs"]


def test_model_config_parses_as_tritons(client: Client) -> None:
    config = client.get_model_config("half_plus_two").config
    assert config.name == "half_plus_two"
    assert config.max_batch_size == 64
    assert config.platform == "onnxruntime_onnx"
    assert [(i.name, list(i.dims)) for i in config.input] == [("x", [1])]
    assert config.input[0].data_type == triton_grpc.model_config_pb2.TYPE_FP32
    assert config.input[0].HasField("reshape")
    digits = client.get_model_config("digits", as_json=True)["config"]
    assert [o["name"] for o in digits["output"]] == ["label", "probabilities"]


def test_repository_index(client: Client) -> None:
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {(m["name"], m["version"], m["state"]) for m in index} == {
        ("digits", "1", "READY"),
        ("half_plus_two", "1", "READY"),
        ("resnet50", "1", "READY"),
    }


def test_half_plus_two(client: Client) -> None:
    x = np.array([[1.0], [2.0], [5.0]], dtype=np.float32)
    outputs = [triton_grpc.InferRequestedOutput("y")]
    result = client.infer("half_plus_two", [_input("x", x)], outputs=outputs, request_id="r-7")
    np.testing.assert_array_equal(result.as_numpy("y"), [[2.5], [3.0], [4.5]])
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == (
        "r-7",
        "half_plus_two",
        "1",
    )


def test_digits_labels_and_requested_outputs(client: Client, demo_repo: Path) -> None:
    inputs, labels = _digits_sample(demo_repo)
    result = client.infer("digits", [_input("input", inputs)])
    np.testing.assert_array_equal(result.as_numpy("label").ravel(), labels)
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (len(labels), 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(probabilities.argmax(axis=1), labels)
    only = client.infer(
        "digits", [_input("input", inputs)], outputs=[triton_grpc.InferRequestedOutput("label")]
    )
    assert [o.name for o in only.get_response().outputs] == ["label"]
    np.testing.assert_array_equal(only.as_numpy("label").ravel(), labels)


def test_async_infer(client: Client) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    for i in range(8):
        x = np.array([[float(i)]], dtype=np.float32)
        client.async_infer(
            "half_plus_two",
            [_input("x", x)],
            callback=lambda result, error: answers.put((result, error)),
            request_id=str(i),
        )
    got = {}
    for _ in range(8):
        result, error = answers.get(timeout=60)
        assert error is None
        got[result.get_response().id] = float(result.as_numpy("y")[0, 0])
    assert got == {str(i): i / 2 + 2 for i in range(8)}


def test_stream_infer_goes_on_after_an_error(client: Client) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(6):
            model = "nope" if i == 3 else "half_plus_two"
            x = np.array([[float(i)], [10.0]], dtype=np.float32)
            client.async_stream_infer(model, [_input("x", x)], request_id=str(i))
        got, errors = {}, []
        for _ in range(6):
            result, error = answers.get(timeout=60)
            if error is not None:
                errors.append(error.message())
            else:
                got[result.get_response().id] = result.as_numpy("y").ravel().tolist()
    finally:
        client.stop_stream()
    assert errors == ["Request for unknown model: 'nope' is not found"]
    assert got == {str(i): [i / 2 + 2, 7.0] for i in (0, 1, 2, 4, 5)}


def test_stream_more_requests_than_in_flight_slots(client: Client) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    count = 300  # above STREAM_MAX_IN_FLIGHT: slots must come back as answers leave
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        x = _input("x", np.array([[2.0]], dtype=np.float32))
        for i in range(count):
            client.async_stream_infer("half_plus_two", [x], request_id=str(i))
        got = [answers.get(timeout=60) for _ in range(count)]
    finally:
        client.stop_stream()
    assert all(error is None for _, error in got)
    assert sorted(int(r.get_response().id) for r, _ in got) == list(range(count))
    assert {float(r.as_numpy("y")[0, 0]) for r, _ in got} == {3.0}


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda c: c.register_cuda_shared_memory("g", "aGFuZGxl", 0, 16), "needs a GPU"),
    ],
)
def test_unimplemented(client: Client, call: Any, fragment: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call(client)
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert fragment in info.value.message()


def test_typed_contents_over_a_raw_stub(stub: Any) -> None:
    request = pb.ModelInferRequest(model_name="half_plus_two", id="typed")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 1])
    request.inputs[0].contents.fp32_contents.extend([4.0, -4.0])
    response = stub.ModelInfer(request)
    assert response.id == "typed"
    assert response.outputs[0].name == "y"
    assert list(response.outputs[0].shape) == [2, 1]
    y = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
    np.testing.assert_array_equal(y, [4.0, 0.0])


def test_grpc_health_service(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    for service in ("", "inference.GRPCInferenceService", "digits"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == serving
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest(service="half_plus_two"))
    assert next(watch).status == serving
    watch.cancel()


def test_reflection(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    assert set(database.get_services()) >= {
        "inference.GRPCInferenceService",
        "grpc.health.v1.Health",
    }
    infer = database.FindFileContainingSymbol("inference.ModelInferRequest")
    assert infer.package == "inference"


def _bad_raw(**fields: Any) -> Any:
    request = pb.ModelInferRequest(model_name="half_plus_two")
    request.inputs.add(name="x", datatype=fields.pop("datatype", "FP32"), shape=[2, 1])
    request.raw_input_contents.append(fields.pop("raw", b"\x00" * 8))
    for key, value in fields.items():
        setattr(request, key, value)
    return request


def _mixed() -> Any:
    request = _bad_raw()
    request.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    return request


def _missing_input() -> Any:
    request = pb.ModelInferRequest(model_name="half_plus_two")
    request.inputs.add(name="z", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(b"\x00" * 4)
    return request


@pytest.mark.parametrize(
    ("request_", "code", "fragment"),
    [
        (_bad_raw(model_name="nope"), "NOT_FOUND", "Request for unknown model: 'nope' is not"),
        (_bad_raw(model_version="7"), "NOT_FOUND", "'half_plus_two' version 7 is not found"),
        (_bad_raw(datatype="INT32"), "INVALID_ARGUMENT", "datatype INT32 does not match"),
        (_bad_raw(datatype="FLOAT"), "INVALID_ARGUMENT", "input 'x': unknown datatype 'FLOAT'"),
        (_bad_raw(raw=b"\x00" * 5), "INVALID_ARGUMENT", "needs 8 bytes, got 5"),
        (_mixed(), "INVALID_ARGUMENT", "contents field must not be specified when using"),
        (pb.ModelInferRequest(model_name="half_plus_two"), "INVALID_ARGUMENT", "missing input 'x'"),
        (_missing_input(), "INVALID_ARGUMENT", "unexpected input 'z'"),
    ],
)
def test_bad_input(stub: Any, request_: Any, code: str, fragment: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request_)
    assert info.value.code() == getattr(grpc.StatusCode, code)
    assert fragment in info.value.details()
    good = stub.ModelInfer(_bad_raw(raw=np.array([2.0, 4.0], np.float32).tobytes()))
    assert np.frombuffer(good.raw_output_contents[0], np.float32).tolist() == [3.0, 4.0]


def test_bad_input_with_tritonclient(client: Client) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("digits", [_input("input", np.zeros((1, 63), np.float32))])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'input': shape [1,63] does not match the model's [-1,64]" in info.value.message()
    with pytest.raises(InferenceServerException, match="unknown output 'nope'"):
        client.infer(
            "digits",
            [_input("input", np.zeros((1, 64), np.float32))],
            outputs=[triton_grpc.InferRequestedOutput("nope")],
        )
    assert client.is_server_ready()


@pytest.fixture(scope="module")
def big_server(demo_repo: Path) -> Iterator[ServerProcess]:
    """half_plus_two taking 20 M rows: a 64 MiB tensor under the default message limit."""
    args = ["--load-model", "half_plus_two", "--default-max-batch-size", "20000000"]
    proc = ServerProcess(demo_repo, extra_args=args).start()
    yield proc
    proc.stop()


def test_64_mib_tensor_passes_by_default(big_server: ServerProcess) -> None:
    rows = 16 * 1024 * 1024  # 64 MiB of FP32
    x = (np.arange(rows) % 4096).astype(np.float32).reshape(rows, 1)
    with Client(big_server.grpc_address) as client:
        y = client.infer("half_plus_two", [_input("x", x)]).as_numpy("y")
    np.testing.assert_array_equal(y, x / 2 + 2)


def test_message_limit_and_env_settings(demo_repo: Path) -> None:
    env = {"INFERD_GRPC_MAX_MESSAGE_BYTES": str(1024 * 1024)}
    proc = ServerProcess(demo_repo, extra_args=["--load-model", "half_plus_two"], env=env)
    proc.start()
    try:
        with Client(proc.grpc_address) as client:
            with pytest.raises(InferenceServerException) as info:
                client.infer("half_plus_two", [_input("x", np.zeros((300_000, 1), np.float32))])
            assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert client.infer("half_plus_two", [_input("x", np.ones((1, 1), np.float32))])
    finally:
        proc.stop()


def test_allow_grpc_false(demo_repo: Path) -> None:
    args = ["--load-model", "half_plus_two", "--allow-grpc=false"]
    proc = ServerProcess(demo_repo, extra_args=args).start()
    try:
        with Client(proc.grpc_address) as client, pytest.raises(InferenceServerException):
            client.is_server_live()
        assert "gRPC" not in proc.log()
    finally:
        assert proc.stop() == 0
