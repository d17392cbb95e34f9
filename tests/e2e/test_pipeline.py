"""The ``resnet`` demo pipeline (JPEG bytes -> Python preprocess -> classifier -> Python top
classes) over TF Serving REST (the resnet example's b64 call), TF Serving gRPC, v2 JSON and
binary. A tiny ONNX classifier with resnet50's inputs and outputs stands in for resnet50 so
most tests are fast; one runs the real demo resnet50 (built once per session, conftest)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as triton_http
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from inferd.demo import pipeline
from inferd.demo.models import write_demo_repository
from inferd.protocols.tfserving import serving_pb2, serving_pb2_grpc, tensorflow_pb2
from tests.support import ServerProcess

RNG = np.random.default_rng(7)
WEIGHTS = RNG.standard_normal((pipeline.CLASSES, 3)).astype(np.float32)


def _tiny_classifier() -> bytes:
    """resnet50's interface (input [batch, 3, 224, 224] -> output [batch, 1000]) in 3 ops."""
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("Gemm", ["flat", "w"], ["output"], transB=1),
        ],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1000])],
        initializer=[numpy_helper.from_array(WEIGHTS, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _jpeg(color: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    pixels = np.zeros((size[1], size[0], 3), np.uint8)
    pixels[:] = color
    pixels[: size[1] // 2, :, 0] = 255 - color[0]  # two halves, so resizing matters
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=95)
    return out.getvalue()


def _expected_classes(jpeg: bytes) -> list[int]:
    """What the pipeline should answer, computed here in one process."""
    namespace: dict[str, object] = {}
    source = pipeline.PREPROCESS_MODEL.replace("import triton_python_backend_utils as pb_utils", "")
    exec(compile(source, "preprocess", "exec"), namespace)
    chw = namespace["decode"](jpeg)  # type: ignore[operator]
    logits = WEIGHTS @ chw.mean(axis=(1, 2))
    return [int(i) for i in np.argsort(-logits, kind="stable")[: pipeline.TOP_K]]


def _write_repo(root: Path, classifier: bytes | None, demo_repo: Path | None = None) -> Path:
    """The pipeline's models, with the tiny classifier or (a link to) the demo resnet50."""
    write_demo_repository(root, models=pipeline_names())
    (root / "resnet50" / "1").mkdir(parents=True)
    model = root / "resnet50" / "1" / "model.onnx"
    if classifier is not None:
        model.write_bytes(classifier)
    else:
        assert demo_repo is not None
        model.symlink_to(demo_repo / "resnet50" / "1" / "model.onnx")
    return root


def pipeline_names() -> list[str]:
    return [pipeline.PREPROCESS, pipeline.POSTPROCESS, pipeline.PIPELINE]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = _write_repo(tmp_path_factory.mktemp("pipeline") / "models", _tiny_classifier())
    server = ServerProcess(root).start(timeout_s=120)
    yield server
    server.stop()


RED, BLUE = _jpeg((200, 30, 30)), _jpeg((20, 40, 220))


def test_tfserving_rest_b64_as_in_the_resnet_example(served: ServerProcess) -> None:
    body = {"instances": [{"b64": base64.b64encode(RED).decode()}]}
    r = httpx.post(f"{served.http_url}/v1/models/resnet:predict", json=body, timeout=30)
    assert r.status_code == 200, r.text
    (prediction,) = r.json()["predictions"]
    assert prediction["classes"] == _expected_classes(RED)
    assert prediction["labels"] == [f"class {i}" for i in prediction["classes"]]
    probabilities = prediction["probabilities"]
    assert probabilities == sorted(probabilities, reverse=True) and 0 < probabilities[0] <= 1


def test_v2_binary_batch(served: ServerProcess) -> None:
    # v2 JSON carries BYTES as UTF-8 text, which JPEG bytes are not: binary tensors carry them.
    client = triton_http.InferenceServerClient(served.http_address)
    inp = triton_http.InferInput("image_bytes", [2, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[RED], [BLUE]], dtype=object), binary_data=True)
    result = client.infer("resnet", [inp])
    classes = result.as_numpy("classes")
    assert classes.tolist() == [_expected_classes(RED), _expected_classes(BLUE)]
    assert result.as_numpy("labels")[1, 0] == f"class {classes[1, 0]}".encode()


def test_tfserving_grpc_string_tensor(served: ServerProcess) -> None:
    with grpc.insecure_channel(served.grpc_address) as channel:
        stub = serving_pb2_grpc.PredictionServiceStub(channel)  # type: ignore[no-untyped-call]
        request = serving_pb2.PredictRequest()
        request.model_spec.name = "resnet"
        request.model_spec.signature_name = "serving_default"
        tensor = request.inputs["image_bytes"]
        tensor.dtype = tensorflow_pb2.DT_STRING
        tensor.tensor_shape.dim.add().size = 1
        tensor.string_val.append(BLUE)
        result = stub.Predict(request, 30.0)
        assert list(result.outputs["classes"].int64_val) == _expected_classes(BLUE)


def test_bad_images_and_datatypes_name_the_problem(served: ServerProcess) -> None:
    body = {"instances": [{"b64": base64.b64encode(b"not a jpeg").decode()}]}
    r = httpx.post(f"{served.http_url}/v1/models/resnet:predict", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "ensemble 'resnet' step 0 (model 'resnet_preprocess')" in error
    assert "input 'image_bytes' is not an image PIL can decode" in error
    r = httpx.post(
        f"{served.http_url}/v2/models/resnet/infer",
        json={
            "inputs": [{"name": "image_bytes", "datatype": "FP32", "shape": [1, 1], "data": [1]}]
        },
        timeout=60,
    )
    assert r.status_code == 400
    assert "image_bytes" in r.json()["error"] and "BYTES" in r.json()["error"]
    # The pipeline serves on.
    r = httpx.post(
        f"{served.http_url}/v1/models/resnet:predict",
        json={"instances": [{"b64": base64.b64encode(BLUE).decode()}]},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["predictions"][0]["classes"] == _expected_classes(BLUE)


def test_the_demo_resnet50_pipeline(tmp_path: Path, demo_repo: Path) -> None:
    root = _write_repo(tmp_path / "models", None, demo_repo)
    server = ServerProcess(root).start(timeout_s=300)
    try:
        body = {"instances": [{"b64": base64.b64encode(RED).decode()}]}
        r = httpx.post(f"{server.http_url}/v1/models/resnet:predict", json=body, timeout=120)
        assert r.status_code == 200, r.text
        (prediction,) = r.json()["predictions"]
        assert len(prediction["classes"]) == pipeline.TOP_K
        assert prediction["labels"] == [f"class {i}" for i in prediction["classes"]]
    finally:
        server.stop()


def test_onnx_stand_in_is_valid() -> None:
    onnx.checker.check_model(onnx.load_from_string(_tiny_classifier()))
