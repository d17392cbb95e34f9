"""A misspelt model name gets Triton's "unknown model" answer and the closest name served, over
KServe v2 HTTP and gRPC and TF Serving REST and gRPC, in the default layout (a model host and
frontends, each answering from its copy of the models table)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from inferd.demo.models import write_demo_repository
from inferd.protocols.tfserving import serving_pb2, serving_pb2_grpc, tensorflow_pb2
from tests.support import ServerProcess

MISSPELT = "half_plus_tow"
GUESS = "; did you mean 'half_plus_two'?"
UNKNOWN = f"Request for unknown model: '{MISSPELT}' is not found{GUESS}"
X = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
HTTP = httpx.Client(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("guess") / "models"
    write_demo_repository(root, models=["half_plus_two", "digits"])
    proc = ServerProcess(root, extra_args=["--http-workers", "3"]).start()
    yield proc
    proc.stop()


def test_v2_http(server: ServerProcess) -> None:
    # Several connections: each frontend worker answers some of them from its own table.
    for _ in range(6):
        r = httpx.post(f"{server.http_url}/v2/models/{MISSPELT}/infer", json=X, timeout=30)
        assert (r.status_code, r.json()["error"]) == (404, UNKNOWN)
    r = HTTP.get(f"{server.http_url}/v2/models/{MISSPELT}")
    assert (r.status_code, r.json()["error"]) == (404, UNKNOWN)
    r = HTTP.get(f"{server.http_url}/v2/models/{MISSPELT}/ready")
    assert r.status_code in (400, 404)
    # Nothing close: no guess; a version that is not there: Triton's words alone.
    r = HTTP.post(f"{server.http_url}/v2/models/resnet/infer", json=X)
    assert r.json()["error"] == "Request for unknown model: 'resnet' is not found"
    r = HTTP.post(f"{server.http_url}/v2/models/half_plus_two/versions/3/infer", json=X)
    assert r.json()["error"] == "Request for unknown model: 'half_plus_two' version 3 is not found"
    ok = HTTP.post(f"{server.http_url}/v2/models/half_plus_two/infer", json=X).json()
    assert ok["outputs"][0]["data"] == [2.5]


def test_v2_grpc(server: ServerProcess) -> None:
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    x = triton_grpc.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer(MISSPELT, [x], client_timeout=30)
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert info.value.message() == UNKNOWN
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(MISSPELT, client_timeout=30)
    assert info.value.message() == UNKNOWN
    answer = client.infer("half_plus_two", [x], client_timeout=30)
    assert answer.as_numpy("y").ravel().tolist() == [2.5]


def test_tfserving_rest(server: ServerProcess) -> None:
    r = HTTP.post(f"{server.http_url}/v1/models/{MISSPELT}:predict", json={"instances": [1.0]})
    assert r.status_code == 404
    assert r.json()["error"] == UNKNOWN
    r = HTTP.get(f"{server.http_url}/v1/models/{MISSPELT}")
    assert r.status_code == 404 and r.json()["error"] == UNKNOWN


def test_tfserving_grpc(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub: Any = serving_pb2_grpc.PredictionServiceStub(channel)  # type: ignore[no-untyped-call]
        request = serving_pb2.PredictRequest()
        request.model_spec.name = MISSPELT
        tensor = tensorflow_pb2.TensorProto(dtype=tensorflow_pb2.DT_FLOAT, float_val=[1.0])
        tensor.tensor_shape.dim.add(size=1)
        request.inputs["x"].CopyFrom(tensor)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, 30.0)
        assert info.value.code() is grpc.StatusCode.NOT_FOUND
        assert info.value.details() == UNKNOWN
        request.model_spec.name = "half_plus_two"
        assert list(stub.Predict(request, 30.0).outputs["y"].float_val) == [2.5]
