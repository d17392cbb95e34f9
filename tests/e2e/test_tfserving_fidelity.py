"""TF Serving's own examples, verbatim, on local equivalents of its test SavedModels: the README
quick start, the REST guide's ``half_plus_three``, every signature by ``signature_name`` on REST
and gRPC (official ``tensorflow-serving-api`` stubs), a TF1 SavedModel, and JSON's NaN and
Infinity tokens."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from tests.e2e import tf1_models
from tests.support import ServerProcess

tf = pytest.importorskip("tensorflow")
apis = pytest.importorskip("tensorflow_serving.apis.predict_pb2")

from tensorflow.core.example import example_pb2  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_metadata_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)


@pytest.fixture(scope="module")
def tf_serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """TF Serving's layout: ``<model>/<version>/saved_model.pb``, version 123 as in its tests."""
    root = tmp_path_factory.mktemp("tfserving") / "models"
    tf1_models.build(root / "saved_model_half_plus_two_cpu" / "123")
    tf1_models.build(root / "saved_model_half_plus_three" / "123", legacy=True)
    _string_identity(root / "tf_strings" / "1")
    server = ServerProcess(root).start(timeout_s=180)
    yield server
    server.stop()


def _string_identity(path: Path) -> None:
    class Identity(tf.Module):  # type: ignore[misc,name-defined]
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="x")])  # type: ignore[untyped-decorator]
        def serve(self, x: Any) -> dict[str, Any]:
            return {"y": tf.identity(x)}

    module = Identity()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def _curl(*args: str) -> Any:
    done = subprocess.run(["curl", "-s", *args], capture_output=True, check=True, text=True)
    return json.loads(done.stdout)


def test_readme_quick_start_verbatim(tf_server_url: str) -> None:
    """TF Serving's README: input x is float [-1, 1], the request sends rows of scalars."""
    answer = _curl(
        "-d",
        '{"instances": [1.0, 2.0, 5.0]}',
        "-X",
        "POST",
        f"{tf_server_url}/v1/models/saved_model_half_plus_two_cpu:predict",
    )
    assert answer == {"predictions": [2.5, 3.0, 4.5]}
    # The signature's own shape works too, and answers in it.
    r = httpx.post(
        f"{tf_server_url}/v1/models/saved_model_half_plus_two_cpu:predict",
        json={"instances": [[1.0], [2.0]]},
        timeout=60,
    )
    assert r.json() == {"predictions": [[2.5], [3.0]]}


@pytest.fixture(scope="module")
def tf_server_url(tf_serving: ServerProcess) -> str:
    return tf_serving.http_url


def test_rest_guide_half_plus_three_tf1_model(tf_serving: ServerProcess) -> None:
    """The REST guide's example, on a TF1 SavedModel tf.saved_model.load cannot load."""
    url = f"{tf_serving.http_url}/v1/models/saved_model_half_plus_three"
    assert httpx.get(url, timeout=60).json() == {
        "name": "saved_model_half_plus_three",
        "ready": True,
        "model_version_status": [
            {
                "version": "123",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ],
    }
    assert _curl("-d", '{"instances": [1.0,2.0,5.0]}', "-X", "POST", f"{url}:predict") == {
        "predictions": [3.5, 4.0, 5.5]
    }
    body = '{"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}, {"x": 2.0}]}'
    assert _curl("-d", body, "-X", "POST", f"{url}:regress") == {"results": [3.5, 4.0]}
    assert "loading as TF1" in tf_serving.log() or "as TF1 now" in tf_serving.log()


def test_every_signature_over_rest(tf_server_url: str) -> None:
    url = f"{tf_server_url}/v1/models/saved_model_half_plus_two_cpu"
    examples = [{"x": 1.0}, {"x": 2.0}]
    cases = [
        # The classification signature parses tf.Examples; it has scores and no classes.
        (":classify", {"signature_name": "classify_x_to_y"}, [[["", 2.5]], [["", 3.0]]]),
        # With no signature_name, classify uses the model's one classification signature.
        (":classify", {}, [[["", 2.5]], [["", 3.0]]]),
        (":regress", {"signature_name": "regress_x_to_y"}, [2.5, 3.0]),
        (":regress", {"signature_name": "regress_x_to_y2"}, [3.5, 4.0]),
    ]
    for verb, extra, results in cases:
        r = httpx.post(url + verb, json={**extra, "examples": examples}, timeout=60)
        assert r.status_code == 200, (verb, extra, r.text)
        assert r.json() == {"results": results}, (verb, extra)
    r = httpx.post(
        url + ":regress",
        json={"signature_name": "regress_x_to_y", "examples": [{"x": 1}]},
        timeout=60,
    )
    assert r.status_code == 400  # 1 is an int64 feature; the signature parses a float
    assert "Data types don't match" in r.json()["error"]
    r = httpx.post(
        url + ":predict", json={"signature_name": "nope", "instances": [1.0]}, timeout=60
    )
    assert r.status_code == 400
    assert r.json()["error"].startswith("unknown signature_name 'nope'; model")
    meta = httpx.get(url + "/metadata", timeout=60).json()["metadata"]["signature_def"][
        "signature_def"
    ]
    assert {name: s["method_name"] for name, s in meta.items()} == {
        "serving_default": "tensorflow/serving/predict",
        "classify_x_to_y": "tensorflow/serving/classify",
        "regress_x_to_y": "tensorflow/serving/regress",
        "regress_x_to_y2": "tensorflow/serving/regress",
        "regress_x2_to_y3": "tensorflow/serving/regress",
    }
    assert meta["classify_x_to_y"]["inputs"]["inputs"]["dtype"] == "DT_STRING"


def _example(x: float) -> Any:
    example = example_pb2.Example()
    example.features.feature["x"].float_list.value.append(x)
    return example


def test_every_signature_over_grpc_with_official_stubs(tf_serving: ServerProcess) -> None:
    with grpc.insecure_channel(tf_serving.grpc_address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        # resnet_client_grpc.py's pattern: the answer's typed float_val, TF Serving's default.
        request = apis.PredictRequest()
        request.model_spec.name = "saved_model_half_plus_two_cpu"
        request.model_spec.signature_name = "serving_default"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([[1.0], [2.0], [5.0]]))
        result = stub.Predict(request, 30.0)
        assert list(result.outputs["y"].float_val) == [2.5, 3.0, 4.5]
        assert result.outputs["y"].tensor_content == b""
        assert [d.size for d in result.outputs["y"].tensor_shape.dim] == [3, 1]
        assert result.model_spec.version.value == 123
        classify = classification_pb2.ClassificationRequest()
        classify.model_spec.name = "saved_model_half_plus_two_cpu"
        classify.model_spec.signature_name = "classify_x_to_y"
        classify.input.example_list.examples.extend([_example(1.0), _example(3.0)])
        classified = stub.Classify(classify, 30.0)
        assert [
            [(c.label, c.score) for c in r.classes] for r in classified.result.classifications
        ] == [
            [("", 2.5)],
            [("", 3.5)],
        ]
        assert classified.model_spec.signature_name == "classify_x_to_y"
        regress = regression_pb2.RegressionRequest()
        regress.model_spec.name = "saved_model_half_plus_two_cpu"
        regress.model_spec.signature_name = "regress_x_to_y2"
        listed = regress.input.example_list_with_context
        listed.examples.extend([_example(1.0), example_pb2.Example()])
        listed.context.features.feature["x"].float_list.value.append(4.0)
        regressed = stub.Regress(regress, 30.0)
        assert [r.value for r in regressed.result.regressions] == [3.5, 5.0]
        meta_request = get_model_metadata_pb2.GetModelMetadataRequest(
            metadata_field=["signature_def"]
        )
        meta_request.model_spec.name = "saved_model_half_plus_three"
        meta = stub.GetModelMetadata(meta_request, 30.0)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        assert meta.metadata["signature_def"].Unpack(signatures)
        assert sorted(signatures.signature_def) == ["serving_default", "tensorflow/serving/regress"]


def test_nan_and_infinity_tokens(tf_server_url: str) -> None:
    """TF Serving's REST guide: NaN, Infinity and -Infinity are numbers in requests and answers."""
    r = httpx.post(
        f"{tf_server_url}/v1/models/saved_model_half_plus_two_cpu:predict",
        content=b'{"instances": [NaN, Infinity, -Infinity, 1.0]}',
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.content == b'{"predictions":[NaN,Infinity,-Infinity,2.5]}'
    values = json.loads(r.content)["predictions"]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf, 2.5]
    r = httpx.post(
        f"{tf_server_url}/v1/models/saved_model_half_plus_two_cpu:regress",
        content=b'{"signature_name": "regress_x_to_y", "examples": [{"x": -Infinity}]}',
        timeout=60,
    )
    assert r.content == b'{"results":[-Infinity]}'


def test_tensorflow_carries_every_byte(tf_serving: ServerProcess) -> None:
    """TensorFlow strings are byte strings: NULs, empty, not UTF-8 and 1 MB all cross."""
    values = [
        b"he\x00llo",
        b"\x00\x01\x02\x03",
        b"abc\x00",
        b"",
        b"\xff\xfe\x00\xfd",
        b"m" * (1 << 20),
    ]
    array = np.empty(len(values), dtype=object)
    array[:] = values
    tensor = triton_grpc.InferInput("x", [len(values)], "BYTES")
    tensor.set_data_from_numpy(array)
    client = triton_grpc.InferenceServerClient(
        tf_serving.grpc_address, channel_args=[("grpc.max_receive_message_length", 64 << 20)]
    )
    result = client.infer("tf_strings", [tensor])
    assert result.as_numpy("y").reshape(-1).tolist() == values
    with grpc.insecure_channel(tf_serving.grpc_address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = apis.PredictRequest()
        request.model_spec.name = "tf_strings"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(values[:5]))
        answer = stub.Predict(request, 30.0)
    assert list(answer.outputs["y"].string_val) == values[:5]
