"""TF Serving gRPC end to end on the demo models: PredictionService (Predict, GetModelMetadata,
Classify, Regress) and ModelService.GetModelStatus, with the official ``tensorflow-serving-api``
stubs when they are installed and with inferd's own generated stubs always."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest

from inferd.protocols.tfserving import serving_pb2, serving_pb2_grpc, tensorflow_pb2
from tests.support import ServerProcess


@dataclass(frozen=True)
class Stubs:
    """One set of client stubs and message classes: the official ones or inferd's."""

    kind: str
    predict: ModuleType
    metadata: ModuleType
    status: ModuleType
    classification: ModuleType
    regression: ModuleType
    prediction_service: ModuleType
    model_service: ModuleType
    tensor: ModuleType  # TensorProto, DataType
    example: ModuleType  # Example, Feature...


def _ours() -> Stubs:
    s = serving_pb2
    return Stubs("inferd", s, s, s, s, s, serving_pb2_grpc, serving_pb2_grpc, tensorflow_pb2,
                 tensorflow_pb2)  # fmt: skip


def _official() -> Stubs:
    pytest.importorskip("tensorflow_serving.apis.predict_pb2")
    from tensorflow.core.example import example_pb2, feature_pb2  # noqa: F401
    from tensorflow.core.framework import tensor_pb2, types_pb2
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
        regression_pb2,
    )

    tensor = ModuleType("tensor")
    tensor.TensorProto = tensor_pb2.TensorProto  # type: ignore[attr-defined]
    tensor.DT_FLOAT = types_pb2.DT_FLOAT  # type: ignore[attr-defined]
    tensor.DT_INT64 = types_pb2.DT_INT64  # type: ignore[attr-defined]
    return Stubs(
        "official",
        predict_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        classification_pb2,
        regression_pb2,
        prediction_service_pb2_grpc,
        model_service_pb2_grpc,
        tensor,
        example_pb2,
    )


@pytest.fixture(scope="module", params=["inferd", "official"])
def stubs(request: pytest.FixtureRequest) -> Stubs:
    return _ours() if request.param == "inferd" else _official()


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_address) as channel:
        yield channel


def _float_tensor(stubs: Stubs, values: np.ndarray) -> Any:
    tensor = stubs.tensor.TensorProto(dtype=stubs.tensor.DT_FLOAT)
    for size in values.shape:
        tensor.tensor_shape.dim.add().size = size
    tensor.tensor_content = values.astype(np.float32).tobytes()
    return tensor


def _array(tensor: Any) -> np.ndarray:
    """A Predict output as TF Serving answers by default: in its typed value field."""
    shape = [d.size for d in tensor.tensor_shape.dim]
    assert not tensor.tensor_content
    values = {1: tensor.float_val, 9: tensor.int64_val}[tensor.dtype]
    return np.asarray(values).reshape(shape)


def _digits(repo: Path) -> tuple[np.ndarray, np.ndarray]:
    sample = json.loads((repo / "digits" / "sample.json").read_text())
    return np.asarray(sample["inputs"], dtype=np.float32), np.asarray(sample["labels"])


def test_predict(stubs: Stubs, channel: grpc.Channel) -> None:
    stub = stubs.prediction_service.PredictionServiceStub(channel)
    request = stubs.predict.PredictRequest()
    request.model_spec.name = "half_plus_two"
    request.model_spec.signature_name = "serving_default"
    request.inputs["x"].CopyFrom(_float_tensor(stubs, np.array([1.0, 2.0, 5.0])))
    result = stub.Predict(request, 10.0)
    np.testing.assert_array_equal(_array(result.outputs["y"]), [2.5, 3.0, 4.5])
    assert result.model_spec.name == "half_plus_two"
    assert result.model_spec.version.value == 1


def test_predict_typed_values_and_output_filter(
    stubs: Stubs, channel: grpc.Channel, demo_repo: Path
) -> None:
    rows, labels = _digits(demo_repo)
    stub = stubs.prediction_service.PredictionServiceStub(channel)
    request = stubs.predict.PredictRequest()
    request.model_spec.name = "digits"
    request.model_spec.version.value = 1
    tensor = request.inputs["input"]
    tensor.dtype = stubs.tensor.DT_FLOAT
    tensor.tensor_shape.dim.add().size = len(rows)
    tensor.tensor_shape.dim.add().size = 64
    tensor.float_val.extend(rows.reshape(-1).tolist())  # typed values, not tensor_content
    request.output_filter.append("label")
    result = stub.Predict(request, 10.0)
    assert list(result.outputs) == ["label"]
    predicted = _array(result.outputs["label"])
    assert predicted.shape == (len(rows),)
    assert (predicted == labels).mean() >= 0.875


def test_get_model_metadata(stubs: Stubs, channel: grpc.Channel) -> None:
    stub = stubs.prediction_service.PredictionServiceStub(channel)
    request = stubs.metadata.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "digits"
    result = stub.GetModelMetadata(request, 10.0)
    signatures = stubs.metadata.SignatureDefMap()
    assert result.metadata["signature_def"].Unpack(signatures)
    signature = signatures.signature_def["serving_default"]
    assert signature.method_name == "tensorflow/serving/predict"
    info = signature.inputs["input"]
    assert info.dtype == stubs.tensor.DT_FLOAT
    assert [d.size for d in info.tensor_shape.dim] == [-1, 64]
    assert signature.outputs["label"].dtype == stubs.tensor.DT_INT64
    assert result.model_spec.version.value == 1


def test_get_model_status(stubs: Stubs, channel: grpc.Channel) -> None:
    stub = stubs.model_service.ModelServiceStub(channel)
    request = stubs.status.GetModelStatusRequest()
    request.model_spec.name = "half_plus_two"
    result = stub.GetModelStatus(request, 10.0)
    (status,) = result.model_version_status
    assert status.version == 1
    assert status.state == stubs.status.ModelVersionStatus.AVAILABLE
    assert status.status.error_code == 0
    request.model_spec.version.value = 7
    with pytest.raises(grpc.RpcError) as caught:
        stub.GetModelStatus(request, 10.0)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_classify(stubs: Stubs, channel: grpc.Channel, demo_repo: Path) -> None:
    rows, labels = _digits(demo_repo)
    stub = stubs.prediction_service.PredictionServiceStub(channel)
    request = stubs.classification.ClassificationRequest()
    request.model_spec.name = "digits"
    for row in rows:
        example = request.input.example_list.examples.add()
        example.features.feature["input"].float_list.value.extend(row.tolist())
    result = stub.Classify(request, 10.0)
    assert len(result.result.classifications) == len(rows)
    best = []
    for classes in result.result.classifications:
        assert [c.label for c in classes.classes] == [str(i) for i in range(10)]
        scores = np.array([c.score for c in classes.classes])
        assert scores.sum() == pytest.approx(1.0, abs=1e-4)
        best.append(int(scores.argmax()))
    assert (np.array(best) == labels).mean() >= 0.875


def test_regress_with_context(stubs: Stubs, channel: grpc.Channel) -> None:
    stub = stubs.prediction_service.PredictionServiceStub(channel)
    request = stubs.regression.RegressionRequest()
    request.model_spec.name = "half_plus_two"
    listed = request.input.example_list_with_context
    for value in (1.0, 4.0):
        listed.examples.add().features.feature["x"].float_list.value.append(value)
    listed.examples.add()  # no feature of its own: the context's x applies
    listed.context.features.feature["x"].float_list.value.append(10.0)
    result = stub.Regress(request, 10.0)
    assert [r.value for r in result.result.regressions] == [2.5, 4.0, 7.0]


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        (lambda r: setattr(r.model_spec, "name", "nope"), grpc.StatusCode.NOT_FOUND, "nope"),
        (
            lambda r: setattr(r.model_spec, "signature_name", "other"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "signature_name 'other'",
        ),
        (
            lambda r: setattr(r.inputs["x"], "tensor_content", b"\0" * 5),
            grpc.StatusCode.INVALID_ARGUMENT,
            "tensor_content has 5 bytes",
        ),
        (
            lambda r: setattr(r.inputs["x"], "dtype", 3),  # DT_INT32: same byte count
            grpc.StatusCode.INVALID_ARGUMENT,
            "datatype INT32",
        ),
    ],
    ids=["unknown model", "unknown signature", "short content", "wrong dtype"],
)
def test_errors(channel: grpc.Channel, change: Any, code: grpc.StatusCode, words: str) -> None:
    stubs = _ours()
    stub = stubs.prediction_service.PredictionServiceStub(channel)
    request = stubs.predict.PredictRequest()
    request.model_spec.name = "half_plus_two"
    request.inputs["x"].CopyFrom(_float_tensor(stubs, np.array([1.0, 2.0])))
    change(request)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(request, 10.0)
    assert caught.value.code() == code
    assert words in caught.value.details()


def _fields(descriptor: Any) -> dict[str, tuple[int, int, str]]:
    return {
        f.name: (f.number, f.type, f.message_type.full_name if f.message_type else "")
        for f in descriptor.fields
    }


def test_messages_match_tf_serving() -> None:
    """Every field of ours has the official message's number, type and message type."""
    official = _official()
    from tensorflow_serving.apis import input_pb2, model_pb2

    pairs = [
        (serving_pb2.PredictRequest, official.predict.PredictRequest),
        (serving_pb2.PredictResponse, official.predict.PredictResponse),
        (serving_pb2.ModelSpec, model_pb2.ModelSpec),
        (serving_pb2.GetModelMetadataResponse, official.metadata.GetModelMetadataResponse),
        (serving_pb2.SignatureDefMap, official.metadata.SignatureDefMap),
        (serving_pb2.GetModelStatusResponse, official.status.GetModelStatusResponse),
        (serving_pb2.ModelVersionStatus, official.status.ModelVersionStatus),
        (serving_pb2.ClassificationResponse, official.classification.ClassificationResponse),
        (serving_pb2.RegressionRequest, official.regression.RegressionRequest),
        (serving_pb2.Input, input_pb2.Input),
        (tensorflow_pb2.TensorProto, official.tensor.TensorProto),
        (tensorflow_pb2.Example, official.example.Example),
    ]
    for ours, theirs in pairs:
        mine, reference = _fields(ours.DESCRIPTOR), _fields(theirs.DESCRIPTOR)
        assert ours.DESCRIPTOR.full_name == theirs.DESCRIPTOR.full_name
        for name, field in mine.items():
            assert reference[name] == field, f"{ours.DESCRIPTOR.full_name}.{name}"


def test_typed_values_by_default_tensor_content_when_asked(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """TF Serving answers Predict in typed value fields (``float_val``, ``int64_val``...);
    ``--tfserving-tensor-content`` (its ``--enable_serialization_as_tensor_content``) packs
    them into ``tensor_content``."""
    from inferd.demo.models import write_demo_repository

    root = tmp_path_factory.mktemp("content") / "models"
    write_demo_repository(root, models=["half_plus_two"])
    server = ServerProcess(root, extra_args=["--tfserving-tensor-content"]).start()
    stubs = _official()
    try:
        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = stubs.prediction_service.PredictionServiceStub(channel)
            request = stubs.predict.PredictRequest()
            request.model_spec.name = "half_plus_two"
            request.inputs["x"].CopyFrom(_float_tensor(stubs, np.array([1.0, 2.0, 5.0])))
            result = stub.Predict(request, 10.0)
    finally:
        server.stop()
    y = result.outputs["y"]
    assert list(y.float_val) == []
    assert y.tensor_content == np.array([2.5, 3.0, 4.5], dtype=np.float32).tobytes()
