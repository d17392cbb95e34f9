"""Side by side with the real TorchServe 0.12 (opt-in: ``INFERD_TORCHSERVE_VENV``): the same
archives and the same requests give the same status codes and prediction bodies, and
describe, list and the management answers carry the same fields."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.torchserve_peer import TorchServePeer, peer_venv
from tests.e2e.torchserve_support import Ports, torchserve_store
from tests.support import ServerProcess

__all__ = ["torchserve_store"]

pytestmark = pytest.mark.skipif(
    peer_venv() is None,
    reason="set INFERD_TORCHSERVE_VENV to a venv with torchserve 0.12 (and Java installed)",
)

MODELS = ["linear=linear.mar", "echo=echo.mar", "batched=batched", "streaming=streaming.mar"]
JSON = {"content-type": "application/json"}
RAW = {"content-type": "application/octet-stream"}
TEXT = {"content-type": "text/plain"}
# (method, path, body, headers): inference calls whose answers must match byte for byte.
CALLS: list[tuple[str, str, bytes, dict[str, str]]] = [
    ("PUT", "/predictions/linear", b'{"x": [1, 2, 3, 4]}', {}),
    ("POST", "/predictions/linear", b'{"x": [1, 2, 3, 4]}', JSON),
    ("POST", "/predictions/linear/1.0", b'{"x": [0.5, 1, 0, -1]}', JSON),
    ("POST", "/predictions/linear", b'"fail"', JSON),
    ("POST", "/predictions/linear", b'"crash"', JSON),
    ("POST", "/predictions/linear/9.0", b'{"x": [1, 2, 3, 4]}', JSON),
    ("POST", "/predictions/nope", b"x", RAW),
    ("POST", "/explanations/linear", b'{"x": [1, 2, 3, 4]}', JSON),
    ("POST", "/predictions/echo", b"hello", TEXT),
    ("POST", "/predictions/echo", b"\x00\x01raw", RAW),
    ("POST", "/predictions/echo/1.0/url/path", b'{"k": [1, 2]}', JSON),
    ("POST", "/predictions/echo", b"created", TEXT),
    ("POST", "/predictions/echo", b"csv", TEXT),
    (
        "POST",
        "/predictions/echo",
        b"a=1&b=x+y",
        {"content-type": "application/x-www-form-urlencoded"},
    ),
    ("POST", "/predictions/batched", b"1", RAW),
    ("POST", "/predictions/streaming", b"go", RAW),
    ("GET", "/ping", b"", {}),
    ("GET", "/no/such/route", b"", {}),
]
MANAGEMENT_CALLS: list[tuple[str, str]] = [
    ("GET", "/models"),
    ("GET", "/models?limit=1"),
    ("GET", "/models?limit=2&next_page_token=1"),
    ("GET", "/models/nope"),
    ("GET", "/models/linear/7.0"),
    ("POST", "/models"),
    ("POST", "/models?url=missing.mar"),
    ("POST", "/models?url=linear.mar"),
    ("PUT", "/models/linear?min_worker=3&max_worker=1"),
    ("PUT", "/models/nope?min_worker=1"),
    ("PUT", "/models/linear/9.0/set-default"),
    ("DELETE", "/models/nope"),
    ("DELETE", "/models/linear/7.0"),
    ("PATCH", "/models"),
]


@dataclass
class Pair:
    peer: TorchServePeer
    ours: Ports


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, torchserve_store: Path) -> Iterator[Pair]:
    venv = peer_venv()
    assert venv is not None
    peer = TorchServePeer(venv, torchserve_store, tmp_path_factory.mktemp("peer"), MODELS)
    ports = Ports()
    ours = ServerProcess(
        tmp_path_factory.mktemp("ours") / "models",
        [
            "--model-store",
            str(torchserve_store),
            "--enable-model-api",
            "--models",
            *MODELS,
            *ports.args(),
        ],
    )
    ours.repository.mkdir()
    peer.start()
    try:
        ours.start(timeout_s=120)
        try:
            yield Pair(peer, ports)
        finally:
            ours.stop()
    finally:
        peer.stop()


def _shape(value: Any) -> Any:
    """A JSON document's structure: keys in order, value types; lists by their first item."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def test_same_predictions_and_errors(pair: Pair) -> None:
    theirs_url, ours_url = pair.peer.inference_url, pair.ours.inference_url
    for method, path, body, headers in CALLS:
        theirs = httpx.request(method, theirs_url + path, content=body, headers=headers, timeout=60)
        ours = httpx.request(method, ours_url + path, content=body, headers=headers, timeout=60)
        where = f"{method} {path} {body!r}"
        assert ours.status_code == theirs.status_code, where
        assert ours.content == theirs.content, where
        assert ours.headers.get("content-type") == theirs.headers.get("content-type"), where


def test_same_multipart_reading(pair: Pair) -> None:
    theirs_url, ours_url = pair.peer.inference_url, pair.ours.inference_url
    files = {"data": ("in.bin", b"\x89PNG", "image/png")}
    theirs = httpx.post(
        f"{theirs_url}/predictions/echo", files=files, data={"note": "hi"}, timeout=60
    )
    ours = httpx.post(f"{ours_url}/predictions/echo", files=files, data={"note": "hi"}, timeout=60)
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())


def test_same_management_answers(pair: Pair) -> None:
    theirs_url, ours_url = pair.peer.management_url, pair.ours.management_url
    for method, path in MANAGEMENT_CALLS:
        theirs = httpx.request(method, theirs_url + path, timeout=60)
        ours = httpx.request(method, ours_url + path, timeout=60)
        assert ours.status_code == theirs.status_code, f"{method} {path}"
        if theirs.status_code < 400 or path.startswith("/models/nope"):
            assert ours.json() == theirs.json(), f"{method} {path}"
        else:
            assert ours.json()["type"] == theirs.json()["type"], f"{method} {path}"
            assert ours.json()["code"] == theirs.json()["code"], f"{method} {path}"


def test_describe_carries_the_same_fields(pair: Pair) -> None:
    theirs_url, ours_url = pair.peer.management_url, pair.ours.management_url
    for name in ("linear", "echo", "batched"):
        theirs = httpx.get(f"{theirs_url}/models/{name}", timeout=60).json()
        ours = httpx.get(f"{ours_url}/models/{name}", timeout=60).json()
        assert _shape(ours) == _shape(theirs), name
        for field in ("modelName", "modelVersion", "modelUrl", "runtime", "minWorkers",
                      "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout",
                      "deviceType", "loadedAtStartup"):  # fmt: skip
            assert ours[0][field] == theirs[0][field], f"{name} {field}"
        assert len(ours[0]["workers"]) == len(theirs[0]["workers"])


def test_same_registration_lifecycle(pair: Pair) -> None:
    theirs_url, ours_url = pair.peer.management_url, pair.ours.management_url
    steps = [
        ("POST", "/models?url=linear_eager.mar&model_name=linear&initial_workers=1"),
        ("GET", "/models/linear/all"),
        ("DELETE", "/models/linear/1.0"),
        ("PUT", "/models/linear/2.0/set-default"),
        ("GET", "/models/linear"),
        ("PUT", "/models/linear?min_worker=2&synchronous=true"),
        ("DELETE", "/models/linear/1.0"),
        ("GET", "/models/linear/all"),
    ]
    for method, path in steps:
        theirs = httpx.request(method, theirs_url + path, timeout=120)
        ours = httpx.request(method, ours_url + path, timeout=120)
        assert ours.status_code == theirs.status_code, f"{method} {path}"
        if method == "GET":
            mine = [(d["modelVersion"], d["minWorkers"], len(d["workers"])) for d in ours.json()]
            peer = [(d["modelVersion"], d["minWorkers"], len(d["workers"])) for d in theirs.json()]
            assert mine == peer, path
        else:
            assert ours.json() == theirs.json(), f"{method} {path}"


def test_same_grpc_answers(pair: Pair) -> None:
    """The same RPCs to both servers' gRPC ports: answers, or status codes and details."""
    import grpc

    from inferd.protocols.torchserve import inference_pb2 as ipb
    from inferd.protocols.torchserve import inference_pb2_grpc, management_pb2_grpc
    from inferd.protocols.torchserve import management_pb2 as mpb

    stream = ipb.PredictionsRequest(model_name="streaming", input={"data": b"go"})
    calls: list[tuple[str, Any]] = [
        ("Predictions", ipb.PredictionsRequest(model_name="echo", input={"data": b"x"})),
        (
            "Predictions",
            ipb.PredictionsRequest(model_name="linear", input={"data": b'{"x": [1, 2, 3, 4]}'}),
        ),
        ("Predictions", ipb.PredictionsRequest(model_name="linear", input={"data": b'"fail"'})),
        ("Predictions", ipb.PredictionsRequest(model_name="linear", input={"data": b'"crash"'})),
        ("Predictions", ipb.PredictionsRequest(model_name="nope", input={"data": b"x"})),
        ("Predictions", ipb.PredictionsRequest(model_name="linear", model_version="9.0")),
        ("Predictions", ipb.PredictionsRequest()),
        ("ListModels", mpb.ListModelsRequest()),
        ("ListModels", mpb.ListModelsRequest(limit=1, next_page_token=1)),
        ("DescribeModel", mpb.DescribeModelRequest(model_name="nope")),
        ("RegisterModel", mpb.RegisterModelRequest()),
        ("RegisterModel", mpb.RegisterModelRequest(url="missing.mar")),
        ("ScaleWorker", mpb.ScaleWorkerRequest(model_name="nope")),
        ("SetDefault", mpb.SetDefaultRequest(model_name="echo", model_version="9.0")),
        ("UnregisterModel", mpb.UnregisterModelRequest(model_name="nope")),
    ]
    results = []
    servers = (
        (pair.peer.grpc_inference, pair.peer.grpc_management),
        (pair.ours.grpc_inference, pair.ours.grpc_management),
    )
    for inference_port, management_port in servers:
        with (
            grpc.insecure_channel(f"127.0.0.1:{inference_port}") as infer,
            grpc.insecure_channel(f"127.0.0.1:{management_port}") as manage,
        ):
            inference = inference_pb2_grpc.InferenceAPIsServiceStub(infer)  # type: ignore[no-untyped-call]
            stubs = {"Predictions": inference.Predictions}
            management = management_pb2_grpc.ManagementAPIsServiceStub(manage)  # type: ignore[no-untyped-call]
            answers = []
            for method, message in calls:
                call = stubs.get(method) or getattr(management, method)
                try:
                    answer = call(message, timeout=60)
                    answers.append(("OK", answer.SerializeToString()))
                except grpc.RpcError as exc:
                    answers.append((exc.code().name, exc.details()))
            parts = [r.prediction for r in inference.StreamPredictions(stream, timeout=60)]
            answers.append(("StreamPredictions", parts))
            results.append(answers)
    for (method, _), theirs, ours in zip(
        [*calls, ("StreamPredictions", stream)], results[0], results[1], strict=True
    ):
        assert ours == theirs, method
