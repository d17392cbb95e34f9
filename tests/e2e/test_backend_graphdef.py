"""Frozen TensorFlow GraphDefs (``platform: "tensorflow_graphdef"``, ``model.graphdef``): a small
inception-like graph built here, its node names with '/', an NHWC input, an output with a label
file, the seeds' tritonclient loop with ``class_count``, and configs that do not fit the graph."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from tests.support import ServerProcess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

SIZE, CLASSES = 8, 6
WEIGHTS = np.random.default_rng(3).standard_normal((3, CLASSES)).astype(np.float32)
SOFTMAX = "Tiny/Predictions/Softmax"

# The seeds' inception_graphdef config, shrunk: the same fields and names.
CONFIG = f"""name: "tiny_graphdef"
platform: "tensorflow_graphdef"
max_batch_size: 128
input [ {{ name: "input" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ {SIZE}, {SIZE}, 3 ] }} ]
output [ {{ name: "{SOFTMAX}" data_type: TYPE_FP32 dims: [ {CLASSES} ]
           label_filename: "tiny_labels.txt" }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def _graphdef() -> bytes:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, SIZE, SIZE, 3], name="input")
        with tf.name_scope("Tiny"):
            pooled = tf.reduce_mean(x, axis=[1, 2])
            logits = tf.matmul(pooled, tf.constant(WEIGHTS), name="Logits")
            with tf.name_scope("Predictions"):
                tf.nn.softmax(logits, name="Softmax")
    return bytes(graph.as_graph_def().SerializeToString())


def _expected(x: np.ndarray) -> np.ndarray:
    logits = x.mean(axis=(1, 2)) @ WEIGHTS
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities: np.ndarray = shifted / shifted.sum(axis=1, keepdims=True)
    return probabilities


def _model(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.graphdef").write_bytes(_graphdef())
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("graphdef") / "models"
    _model(root, "tiny_graphdef", CONFIG)
    labels = "".join(f"label{i}\n" for i in range(CLASSES))
    (root / "tiny_graphdef" / "tiny_labels.txt").write_text(labels)
    # Inputs left out of the config are the graph's placeholders; no platform: by the file.
    _model(root, "bare", f'max_batch_size: 4\noutput [ {{ name: "{SOFTMAX}" }} ]\n')
    _model(
        root,
        "wrong_node",
        CONFIG.replace(SOFTMAX, "Tiny/Nope").replace("tiny_graphdef", "wrong_node"),
    )
    _model(root, "no_outputs", 'platform: "tensorflow_graphdef"\nmax_batch_size: 4\n')
    server = ServerProcess(root, extra_args=["--strict-readiness=false"]).start(timeout_s=180)
    yield server
    server.stop()


def test_the_seeds_tritonclient_loop(served: ServerProcess) -> None:
    x = np.random.default_rng(1).random((3, SIZE, SIZE, 3), dtype=np.float32)
    client = triton_http.InferenceServerClient(served.http_address)
    inp = triton_http.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    plain = client.infer("tiny_graphdef", [inp]).as_numpy(SOFTMAX)
    np.testing.assert_allclose(plain, _expected(x), rtol=1e-5)
    wanted = [triton_http.InferRequestedOutput(SOFTMAX, class_count=2)]
    classes = client.infer("tiny_graphdef", [inp], outputs=wanted).as_numpy(SOFTMAX)
    expected = _expected(x)
    for i, row in enumerate(classes):
        index = int(np.argmax(expected[i]))
        score, got, label = row[0].decode().split(":")
        assert (int(got), label) == (index, f"label{index}")
        assert abs(float(score) - expected[i, index]) < 1e-5
    meta = client.get_model_metadata("tiny_graphdef")
    assert meta["platform"] == "tensorflow_graphdef"
    assert meta["outputs"] == [{"name": SOFTMAX, "datatype": "FP32", "shape": [-1, CLASSES]}]


def test_grpc_and_a_config_completed_from_placeholders(served: ServerProcess) -> None:
    x = np.ones((2, SIZE, SIZE, 3), np.float32)
    with triton_grpc.InferenceServerClient(served.grpc_address) as client:
        inp = triton_grpc.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer("bare", [inp]).as_numpy(SOFTMAX)
        np.testing.assert_allclose(got, _expected(x), rtol=1e-5)
        config = client.get_model_config("bare", as_json=True)["config"]
        assert config["platform"] == "tensorflow_graphdef"
        assert config["input"][0]["name"] == "input"
        assert config["input"][0]["dims"] == [str(SIZE), str(SIZE), "3"]


def test_configs_that_do_not_fit_the_graph(served: ServerProcess) -> None:
    index = httpx.post(f"{served.http_url}/v2/repository/index", json={}, timeout=60).json()
    reasons = {e["name"]: e.get("reason", "") for e in index}
    assert "config output 'Tiny/Nope' is not a node of the graph" in reasons["wrong_node"]
    assert "list its outputs (graph node names) in config.pbtxt" in reasons["no_outputs"]
