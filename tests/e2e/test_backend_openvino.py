"""OpenVINO backend end to end: an IR built with OpenVINO's opset, and ONNX read by OpenVINO."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.e2e.backend_checks import (
    BATCHING,
    check_all_protocols,
    check_batching,
    unavailable_reason,
    version_dir,
    write_config,
)
from tests.support import ServerProcess

ov = pytest.importorskip("openvino")

RNG = np.random.default_rng(0)
WEIGHTS = RNG.standard_normal((8, 3)).astype(np.float32)
BIAS = RNG.standard_normal(3).astype(np.float32)


def expected_scores(server: ServerProcess, x: np.ndarray) -> np.ndarray:
    """OpenVINO's own answer, in process (its CPU kernels differ from numpy in the 4th digit),
    at f32 as the backend compiles by default (OpenVINO alone picks bf16 where the CPU has it)."""
    core = ov.Core()
    compiled = core.compile_model(
        core.read_model(str(server.repository / "linear" / "1" / "model.xml")),
        "CPU",
        {"INFERENCE_PRECISION_HINT": "f32"},
    )
    scores: np.ndarray = compiled.create_infer_request().infer({"features": x})["scores"]
    logits = x @ WEIGHTS + BIAS
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(scores, exp / exp.sum(axis=1, keepdims=True), atol=1e-3)
    return np.array(scores)


def save_ir(path: Path) -> None:
    from openvino import opset13 as ops

    x = ops.parameter(ov.PartialShape([-1, 8]), ov.Type.f32, name="features")
    logits = ops.add(ops.matmul(x, ops.constant(WEIGHTS), False, False), ops.constant(BIAS))
    scores = ops.softmax(logits, 1)
    scores.output(0).get_tensor().set_names({"scores"})
    ov.save_model(ov.Model([scores], [x], "linear"), str(path))


def save_onnx(path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"])],
        "triple",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializer=[numpy_helper.from_array(np.array(3.0, dtype=np.float32), "k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def ov_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("openvino") / "models"
    save_ir(version_dir(root, "linear") / "model.xml")
    save_ir(version_dir(root, "linear_batched") / "model.xml")
    write_config(root, "linear_batched", BATCHING)
    save_onnx(version_dir(root, "onnx_on_openvino") / "model.onnx")
    throughput = 'parameters { key: "PERFORMANCE_HINT" value: { string_value: "THROUGHPUT" } }'
    write_config(root, "onnx_on_openvino", f'backend: "openvino"\n{throughput}\n')
    save_ir(version_dir(root, "bad_hint") / "model.xml")
    write_config(
        root,
        "bad_hint",
        'parameters { key: "PERFORMANCE_HINT" value: { string_value: "FASTEST" } }\n',
    )
    # bad_hint fails to load on purpose: ready means "startup is done", not "all READY".
    server = ServerProcess(root, extra_args=["--strict-readiness=false"]).start(timeout_s=120)
    yield server
    server.stop()


def test_ir_model(ov_server: ServerProcess) -> None:
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    check_all_protocols(
        ov_server, "linear", {"features": x}, {"scores": expected_scores(ov_server, x)}
    )
    meta = httpx.get(f"{ov_server.http_url}/v2/models/linear", timeout=60).json()
    assert meta["platform"] == "openvino"
    assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 8]}]


def test_onnx_through_openvino(ov_server: ServerProcess) -> None:
    config = httpx.get(f"{ov_server.http_url}/v2/models/onnx_on_openvino/config", timeout=60).json()
    assert config["backend"] == "openvino"
    x = np.array([[1.0, 2.0], [3.0, -1.0]], dtype=np.float32)
    check_all_protocols(ov_server, "onnx_on_openvino", {"x": x}, {"y": 3.0 * x})


def test_dynamic_batching(ov_server: ServerProcess) -> None:
    rows = RNG.standard_normal((6, 8)).astype(np.float32)
    check_batching(
        ov_server, "linear_batched", "features", rows, "scores", expected_scores(ov_server, rows)
    )


def test_unknown_performance_hint(ov_server: ServerProcess) -> None:
    reason = unavailable_reason(ov_server, "bad_hint")
    assert "PERFORMANCE_HINT 'FASTEST'" in reason and "THROUGHPUT" in reason


def test_missing_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from inferd.backends.openvino import OpenVinoBackend
    from inferd.config.text import parse_config_text
    from inferd.core.errors import ModelLoadError

    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(ModelLoadError, match=r"pip install .*\[openvino\]"):
        OpenVinoBackend().complete_config(tmp_path, parse_config_text(""), 8)
