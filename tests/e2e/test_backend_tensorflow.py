"""TensorFlow backend end to end: SavedModels saved at test time, in Triton's layout and in TF
Serving's, including the demo ``saved_model_half_plus_two`` and TF Serving's own curl command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest

from inferd.demo.models import SAVED_MODEL_DEMO, write_demo_repository
from tests.e2e.backend_checks import (
    BATCHING,
    check_all_protocols,
    check_batching,
    infer_grpc,
    infer_v2_http,
    unavailable_reason,
    version_dir,
    write_config,
)
from tests.support import ServerProcess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if TYPE_CHECKING:
    import tensorflow as tf
else:
    tf = pytest.importorskip("tensorflow")

RNG = np.random.default_rng(0)
WEIGHTS = RNG.standard_normal((4, 3)).astype(np.float32)


class Classifier(tf.Module):  # type: ignore[misc]
    """Two signatures: scores and labels of features, and the lengths of strings."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(WEIGHTS)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="features")])  # type: ignore[untyped-decorator]
    def classify(self, features: Any) -> dict[str, Any]:
        scores = tf.nn.softmax(tf.matmul(features, self.w))
        return {"scores": scores, "label": tf.argmax(scores, axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])  # type: ignore[untyped-decorator]
    def lengths(self, text: Any) -> dict[str, Any]:
        return {"length": tf.strings.length(text), "upper": tf.strings.upper(text)}


@pytest.fixture(scope="module")
def classifier() -> Classifier:
    return Classifier()


def _save(module: Classifier, path: Path) -> None:
    signatures = {"serving_default": module.classify, "lengths": module.lengths}
    tf.saved_model.save(module, str(path), signatures=signatures)


@pytest.fixture(scope="module")
def tf_server(
    classifier: Classifier, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tensorflow") / "models"
    write_demo_repository(root, models=[SAVED_MODEL_DEMO])  # TF Serving's layout
    _save(classifier, version_dir(root, "classifier") / "model.savedmodel")  # Triton's layout
    for name, config in (
        ("classifier_batched", BATCHING),
        ("lengths", 'parameters { key: "signature_name" value: { string_value: "lengths" } }'),
        ("no_such_signature", 'parameters { key: "signature_name" value: { string_value: "x" } }'),
    ):
        os.symlink(
            version_dir(root, "classifier") / "model.savedmodel",
            version_dir(root, name) / "model.savedmodel",
        )
        write_config(root, name, config)
    # no_such_signature fails to load on purpose: ready means "startup is done", not "all READY".
    server = ServerProcess(root, extra_args=["--strict-readiness=false"]).start(timeout_s=180)
    yield server
    server.stop()


def _expected(classifier: Classifier, x: np.ndarray) -> dict[str, np.ndarray]:
    out = classifier.classify(tf.constant(x))
    return {"scores": out["scores"].numpy(), "label": out["label"].numpy()}


def test_tf_serving_demo_model_with_curl(tf_server: ServerProcess) -> None:
    body = '{"instances": [1.0, 2.0, 5.0]}'
    url = f"{tf_server.http_url}/v1/models/{SAVED_MODEL_DEMO}:predict"
    if shutil.which("curl"):
        done = subprocess.run(
            ["curl", "-s", "-d", body, "-X", "POST", url], capture_output=True, check=True
        )
        answer = json.loads(done.stdout)
    else:
        answer = httpx.post(url, content=body, timeout=60).json()
    assert answer == {"predictions": [2.5, 3.0, 4.5]}
    meta = httpx.get(f"{tf_server.http_url}/v2/models/{SAVED_MODEL_DEMO}", timeout=60).json()
    assert meta["platform"] == "tensorflow_savedmodel"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}]


def test_savedmodel_over_every_protocol(tf_server: ServerProcess, classifier: Classifier) -> None:
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    check_all_protocols(tf_server, "classifier", {"features": x}, _expected(classifier, x))
    meta = httpx.get(f"{tf_server.http_url}/v2/models/classifier", timeout=60).json()
    assert meta["outputs"] == [
        {"name": "label", "datatype": "INT64", "shape": [-1, 1]},
        {"name": "scores", "datatype": "FP32", "shape": [-1, 3]},
    ]


def test_signature_name_parameter_and_strings(tf_server: ServerProcess) -> None:
    text = np.array([b"abc", b"", b"hello"], dtype=object).reshape(3, 1)
    for result in (
        infer_v2_http(tf_server, "lengths", {"text": text}),
        infer_grpc(tf_server, "lengths", {"text": text}),
    ):
        np.testing.assert_array_equal(result.as_numpy("length").reshape(-1), [3, 0, 5])
        assert result.as_numpy("upper").reshape(-1).tolist() == [b"ABC", b"", b"HELLO"]
    r = httpx.post(
        f"{tf_server.http_url}/v1/models/lengths:predict",
        json={"inputs": ["ab", "xyz"]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == {"length": [2, 3], "upper": ["AB", "XYZ"]}


def test_dynamic_batching(tf_server: ServerProcess, classifier: Classifier) -> None:
    rows = RNG.standard_normal((6, 4)).astype(np.float32)
    scores = _expected(classifier, rows)["scores"]
    check_batching(tf_server, "classifier_batched", "features", rows, "scores", scores)


def test_unknown_signature(tf_server: ServerProcess) -> None:
    reason = unavailable_reason(tf_server, "no_such_signature")
    assert "no signature 'x'" in reason and "lengths, serving_default" in reason


def test_tf_serving_grpc_with_official_stubs(tf_server: ServerProcess) -> None:
    """The resnet_client_grpc.py pattern, with tensorflow-serving-api's own stubs."""
    grpc = pytest.importorskip("grpc")
    apis = pytest.importorskip("tensorflow_serving.apis.predict_pb2")
    services = pytest.importorskip("tensorflow_serving.apis.prediction_service_pb2_grpc")
    with grpc.insecure_channel(tf_server.grpc_address) as channel:
        stub = services.PredictionServiceStub(channel)
        request = apis.PredictRequest()
        request.model_spec.name = SAVED_MODEL_DEMO
        request.model_spec.signature_name = "serving_default"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([1.0, 2.0, 5.0], dtype=tf.float32))
        result = stub.Predict(request, 10.0)
    np.testing.assert_array_equal(tf.make_ndarray(result.outputs["y"]), [2.5, 3.0, 4.5])
    assert result.model_spec.name == SAVED_MODEL_DEMO
    assert result.model_spec.version.value == 1


def test_missing_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from inferd.backends.tensorflow import TensorFlowBackend
    from inferd.config.text import parse_config_text
    from inferd.core.errors import ModelLoadError

    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(ModelLoadError, match=r"pip install .*\[tensorflow\]"):
        TensorFlowBackend().complete_config(tmp_path, parse_config_text(""), 8)
