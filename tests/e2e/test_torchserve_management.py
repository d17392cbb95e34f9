"""TorchServe's management API (HTTP and gRPC) and its gRPC inference API, with inferd's admin
and inference tokens, on archives of the model store; gRPC through stubs generated from the
protos, the flow of TorchServe's ``torchserve_grpc_client.py`` among them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import empty_pb2

from inferd.protocols.torchserve import (
    inference_pb2,
    inference_pb2_grpc,
    management_pb2,
    management_pb2_grpc,
)
from tests.e2e.torchserve_support import Ports, torchserve_store
from tests.support import ServerProcess

__all__ = ["torchserve_store"]

ADMIN = "admin-secret"
INFERENCE = "inference-secret"
INPUT = b'{"x": [1, 2, 3, 4]}'
# What torchserve_grpc_client.py sends with every call (with --auth-token).
METADATA = (("protocol", "gRPC"), ("session_id", "12345"), ("authorization", f"Bearer {ADMIN}"))


@pytest.fixture(scope="module")
def ports() -> Ports:
    return Ports()


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, torchserve_store: Path, ports: Ports
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("ts-managed") / "models"
    repository.mkdir()
    server = ServerProcess(
        repository,
        [
            "--model-store",
            str(torchserve_store),
            "--enable-model-api",
            "--admin-token",
            ADMIN,
            "--auth-token",
            INFERENCE,
            "--models",
            "echo=echo.mar",
            *ports.args(),
        ],
        token=f"Bearer {ADMIN}",
    ).start(timeout_s=120)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def admin(served: ServerProcess, ports: Ports) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=ports.management_url, headers=headers, timeout=120) as session:
        yield session


@pytest.fixture(scope="module")
def inference(served: ServerProcess, ports: Ports) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {INFERENCE}"}
    with httpx.Client(base_url=ports.inference_url, headers=headers, timeout=60) as session:
        yield session


@pytest.fixture(scope="module")
def stubs(
    served: ServerProcess, ports: Ports
) -> Iterator[tuple[inference_pb2_grpc.InferenceAPIsServiceStub, Any]]:
    with (
        grpc.insecure_channel(f"localhost:{ports.grpc_inference}") as infer_channel,
        grpc.insecure_channel(f"localhost:{ports.grpc_management}") as manage_channel,
    ):
        yield (
            inference_pb2_grpc.InferenceAPIsServiceStub(infer_channel),  # type: ignore[no-untyped-call]
            management_pb2_grpc.ManagementAPIsServiceStub(manage_channel),  # type: ignore[no-untyped-call]
        )


def test_register_list_describe_unregister(admin: httpx.Client, inference: httpx.Client) -> None:
    registered = admin.post("/models?url=linear.mar&initial_workers=1&synchronous=true")
    assert registered.status_code == 200
    assert registered.json() == {
        "status": 'Model "linear" Version: 1.0 registered with 1 initial workers'
    }
    assert inference.put("/predictions/linear", content=INPUT).json() == {"y": [2.0, 6.0]}
    listed = admin.get("/models").json()
    assert listed == {
        "models": [
            {"modelName": "echo", "modelUrl": "echo.mar"},
            {"modelName": "linear", "modelUrl": "linear.mar"},
        ]
    }
    page = admin.get("/models?limit=1").json()
    assert page == {"nextPageToken": "1", "models": [{"modelName": "echo", "modelUrl": "echo.mar"}]}
    assert admin.get("/models?limit=1&next_page_token=1").json()["models"][0]["modelName"] == (
        "linear"
    )
    described = admin.get("/models/linear").json()
    assert len(described) == 1
    model = described[0]
    assert list(model)[:10] == [
        "modelName",
        "modelVersion",
        "modelUrl",
        "runtime",
        "minWorkers",
        "maxWorkers",
        "batchSize",
        "maxBatchDelay",
        "responseTimeout",
        "startupTimeout",
    ]
    assert (model["modelVersion"], model["batchSize"], model["maxBatchDelay"]) == ("1.0", 1, 100)
    assert model["loadedAtStartup"] is False
    assert [w["status"] for w in model["workers"]] == ["READY"]
    assert model["workers"][0]["pid"] > 0
    assert model["jobQueueStatus"] == {"remainingCapacity": 100, "pendingRequests": 0}
    customized = admin.get("/models/linear?customized=true").json()[0]
    assert customized["customizedMetadata"] == {}
    gone = admin.delete("/models/linear")
    assert gone.json() == {"status": 'Model "linear" unregistered'}
    assert inference.put("/predictions/linear", content=INPUT).status_code == 404
    assert admin.get("/models/linear").json()["type"] == "ModelNotFoundException"


def test_versions_the_default_and_scaling(admin: httpx.Client, inference: httpx.Client) -> None:
    first = admin.post("/models?url=linear.mar&model_name=lin&batch_size=2&max_batch_delay=20")
    assert first.status_code == 200
    second = admin.post("/models?url=linear_eager.mar&model_name=lin")
    assert second.json() == {"status": 'Model "lin" Version: 2.0 registered with 1 initial workers'}
    versions = admin.get("/models/lin/all").json()
    assert [(v["modelVersion"], v["modelUrl"]) for v in versions] == [
        ("1.0", "linear.mar"),
        ("2.0", "linear_eager.mar"),
    ]
    assert (versions[0]["batchSize"], versions[0]["maxBatchDelay"]) == (2, 20)
    assert admin.get("/models/lin").json()[0]["modelVersion"] == "1.0"  # the first stays default
    assert inference.put("/predictions/lin/2.0", content=INPUT).json() == {"y": [2.0, 6.0]}
    refused = admin.delete("/models/lin/1.0")
    assert refused.status_code == 403
    assert refused.json()["type"] == "InvalidModelVersionException"
    switched = admin.put("/models/lin/2.0/set-default")
    assert switched.json() == {
        "status": 'Default version successfully updated for model "lin" to "2.0"'
    }
    assert admin.get("/models/lin").json()[0]["modelVersion"] == "2.0"
    scaled = admin.put("/models/lin/2.0?min_worker=2&synchronous=true")
    assert scaled.json() == {"status": "Workers scaled to 2 for model: lin, version: 2.0"}
    workers = admin.get("/models/lin/2.0").json()[0]["workers"]
    assert len({w["pid"] for w in workers}) == 2
    bad = admin.put("/models/lin?min_worker=3&max_worker=1")
    assert bad.status_code == 400
    assert bad.json()["message"] == "max_worker cannot be less than min_worker."
    assert admin.delete("/models/lin/1.0").status_code == 200
    assert [v["modelVersion"] for v in admin.get("/models/lin/all").json()] == ["2.0"]
    assert admin.delete("/models/lin").status_code == 200


def test_register_errors(
    admin: httpx.Client, torchserve_store: Path, served: ServerProcess
) -> None:
    assert admin.post("/models").json() == {
        "code": 400,
        "type": "BadRequestException",
        "message": "Parameter url is required.",
    }
    missing = admin.post("/models?url=missing.mar")
    assert missing.status_code == 404
    assert missing.json()["message"] == "Model not found at: missing.mar"
    assert admin.post("/models?url=echo.mar").json() == {
        "code": 409,
        "type": "ConflictStatusException",
        "message": "Model version 1.0 is already registered for model echo",
    }
    remote = admin.post("/models?url=http://example.invalid/m.mar")
    assert remote.status_code == 404
    assert "does not match any allowed URL" in remote.json()["message"]
    builtin = admin.post("/models?url=imageclass.mar")
    assert builtin.status_code == 500
    assert "torchvision" in builtin.json()["message"]
    shutil.copy(torchserve_store / "linear.mar", torchserve_store / "late.mar")
    try:
        late = admin.post("/models?url=late.mar")
    finally:
        (torchserve_store / "late.mar").unlink()
    assert late.status_code == 500
    assert "--allow-python-models" in late.json()["message"]
    assert "late" not in [m["modelName"] for m in admin.get("/models").json()["models"]]


def test_tokens_guard_both_ports(ports: Ports, served: ServerProcess) -> None:
    anonymous = httpx.get(f"{ports.management_url}/models", timeout=60)
    assert anonymous.status_code == 400
    assert anonymous.json()["type"] == "InvalidKeyException"
    predicted = httpx.post(f"{ports.inference_url}/predictions/echo", content=b"x", timeout=60)
    assert predicted.status_code == 400
    assert httpx.get(f"{ports.inference_url}/ping", timeout=60).status_code == 200


def test_the_grpc_client_flow(stubs: tuple[Any, Any], torchserve_store: Path) -> None:
    """``torchserve_grpc_client.py register densenet161``, ``infer densenet161 kitten.jpg``
    and ``unregister densenet161``: the same calls, messages and metadata."""
    infer_stub, manage_stub = stubs
    params: dict[str, Any] = {
        "url": "densenet161.mar",
        "initial_workers": 1,
        "synchronous": True,
        "model_name": "densenet161",
    }
    manage_stub.RegisterModel(management_pb2.RegisterModelRequest(**params), metadata=METADATA)
    data = (torchserve_store.parent / "kitten.jpg").read_bytes()
    response = infer_stub.Predictions(
        inference_pb2.PredictionsRequest(model_name="densenet161", input={"data": data}),
        metadata=METADATA,
    )
    scores = json.loads(response.prediction.decode("utf-8"))
    assert list(scores) == ["tabby", "tiger_cat", "Egyptian_cat", "lynx", "Persian_cat"]
    assert abs(sum(scores.values()) - 1) < 1e-3
    streamed = list(
        infer_stub.StreamPredictions(
            inference_pb2.PredictionsRequest(model_name="densenet161", input={"data": data}),
            metadata=METADATA,
        )
    )
    assert [json.loads(r.prediction) for r in streamed] == [scores]
    manage_stub.UnregisterModel(
        management_pb2.UnregisterModelRequest(model_name="densenet161"), metadata=METADATA
    )
    with pytest.raises(grpc.RpcError) as gone:
        infer_stub.Predictions(
            inference_pb2.PredictionsRequest(model_name="densenet161", input={"data": data}),
            metadata=METADATA,
        )
    assert gone.value.code() == grpc.StatusCode.INTERNAL
    assert gone.value.details() == (
        "Model not found: densenet161\norg.pytorch.serve.archive.model.ModelNotFoundException"
    )


def test_grpc_streams_a_streaming_handler(stubs: tuple[Any, Any]) -> None:
    infer_stub, manage_stub = stubs
    manage_stub.RegisterModel(
        management_pb2.RegisterModelRequest(url="streaming.mar", synchronous=True),
        metadata=METADATA,
    )
    request = inference_pb2.PredictionsRequest(model_name="streaming", input={"data": b"go"})
    parts = [r.prediction for r in infer_stub.StreamPredictions(request, metadata=METADATA)]
    assert parts == [b"part0 ", b"part1 ", b"part2 ", b"end"]
    assert infer_stub.Predictions(request, metadata=METADATA).prediction == b"end"
    manage_stub.UnregisterModel(
        management_pb2.UnregisterModelRequest(model_name="streaming"), metadata=METADATA
    )


def test_every_grpc_call(stubs: tuple[Any, Any]) -> None:
    infer_stub, manage_stub = stubs
    health = infer_stub.Ping(empty_pb2.Empty(), metadata=METADATA)
    assert json.loads(health.health) == {"status": "Healthy"}
    listed = json.loads(
        manage_stub.ListModels(management_pb2.ListModelsRequest(limit=10), metadata=METADATA).msg
    )
    assert listed == {"models": [{"modelName": "echo", "modelUrl": "echo.mar"}]}
    described = json.loads(
        manage_stub.DescribeModel(
            management_pb2.DescribeModelRequest(model_name="echo"), metadata=METADATA
        ).msg
    )
    assert described[0]["modelName"] == "echo" and described[0]["loadedAtStartup"] is True
    echo = infer_stub.Predictions(
        inference_pb2.PredictionsRequest(model_name="echo", input={"body": b"hi", "k": b"v"}),
        metadata=METADATA,
    )
    assert json.loads(echo.prediction)["params"] == {"body": "bytearray", "k": "bytearray"}
    requests = [
        inference_pb2.PredictionsRequest(model_name="echo", input={"n": b"%d" % i}, sequence_id="s")
        for i in range(3)
    ] + [inference_pb2.PredictionsRequest(model_name="nope", input={"n": b"x"}, sequence_id="s")]
    answers = list(infer_stub.StreamPredictions2(iter(requests), metadata=METADATA))
    assert [json.loads(a.prediction)["values"]["n"] for a in answers[:3]] == ["0", "1", "2"]
    assert answers[3].status.code == grpc.StatusCode.INTERNAL.value[0]
    assert answers[3].status.message.startswith("Model not found: nope")
    scaled = manage_stub.ScaleWorker(
        management_pb2.ScaleWorkerRequest(model_name="echo", min_worker=1, synchronous=True),
        metadata=METADATA,
    )
    assert scaled.msg == "Workers scaled to 1 for model: echo"
    defaulted = manage_stub.SetDefault(
        management_pb2.SetDefaultRequest(model_name="echo", model_version="1.0"), metadata=METADATA
    )
    assert defaulted.msg == 'Default version successfully updated for model "echo" to "1.0"'
    with pytest.raises(grpc.RpcError) as missing:
        manage_stub.DescribeModel(
            management_pb2.DescribeModelRequest(model_name="nope"), metadata=METADATA
        )
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert missing.value.details().startswith("Model not found: nope\n")
    with pytest.raises(grpc.RpcError) as refused:
        manage_stub.RegisterModel(management_pb2.RegisterModelRequest(), metadata=METADATA)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as anonymous:
        manage_stub.ListModels(management_pb2.ListModelsRequest(limit=1))
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
