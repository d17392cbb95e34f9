"""Small ONNX models and data for the optimize and tune tests, built from code in a second."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def write_tie_model(model_dir: Path) -> None:
    """Eight classes whose logits differ by about 1e-4: INT8 cannot keep their order."""
    rng = np.random.default_rng(1)
    base = rng.uniform(-1, 1, (16, 1)).astype(np.float32)
    weights = base + rng.normal(0, 1e-4, (16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"], name="scores")],
        "ties",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 8])],
        initializer=[numpy_helper.from_array(weights, "w")],
    )
    _save(graph, model_dir / "1" / "model.onnx")


def write_small_cnn(model_dir: Path) -> None:
    """Conv + Relu + pooling + Gemm on 3x8x8 inputs, seeded weights with clear class margins."""
    rng = np.random.default_rng(2)
    conv_w = rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32)
    conv_b = rng.normal(0, 0.1, 8).astype(np.float32)
    fc_w = rng.normal(0, 1.0, (4, 8)).astype(np.float32)
    fc_b = np.zeros(4, dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
            helper.make_node("Flatten", ["p"], ["f"], axis=1, name="flatten"),
            helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1, name="fc"),
        ],
        "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])],
        initializer=[
            numpy_helper.from_array(conv_w, "cw"),
            numpy_helper.from_array(conv_b, "cb"),
            numpy_helper.from_array(fc_w, "fw"),
            numpy_helper.from_array(fc_b, "fb"),
        ],
    )
    _save(graph, model_dir / "1" / "model.onnx")


def write_digits_held_out(path: Path) -> None:
    """The digits demo's held-out split (same split as inferd.demo.models) with labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    _, x_test, _, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    np.savez(path, input=x_test.astype(np.float32), labels=y_test.astype(np.int64))


def inferd(
    *args: str, timeout_s: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The real command line, in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "inferd", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ},
        check=False,
    )
