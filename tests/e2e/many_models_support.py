"""Lazy serving's test models and probes, shared by the one-process and several-worker tests:
echo models (their files are what the budget counts), ONNX tables that really hold memory,
and readers of the metrics and the index's residency."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

from tests.support import ServerProcess

ECHO = """name: "{name}"
backend: "echo"
max_batch_size: 8
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }}]
output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }}]
{extra}
"""
BROKEN = 'parameters [{ key: "die_by" value: { string_value: "nonsense" } }]'


def write_echo(root: Path, name: str, extra: str = "", padding: int = 0) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "weights.bin").write_bytes(b"\0" * padding or b"echo")
    (folder / "config.pbtxt").write_text(ECHO.format(name=name, extra=extra))


def body(value: float) -> dict[str, Any]:
    return {
        "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [value] * 2}]
    }


def infer(url: str, model: str, value: float = 1.0, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v2/models/{model}/infer", json=body(value), headers=headers, timeout=30
    )


def metric(server: ServerProcess, name: str) -> float:
    text = httpx.get(f"{server.http_url}/metrics", timeout=60).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found is not None, name
    return float(found.group(1))


def residency(server: ServerProcess) -> dict[str, dict[str, Any]]:
    rows = httpx.post(f"{server.http_url}/v2/repository/index", json={}, timeout=60).json()
    return {r["name"]: r["residency"] for r in rows}


TABLE_WIDTH = 256  # floats per row of ``write_table``'s table
TABLE = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [{{ name: "x" data_type: TYPE_INT64 dims: [1] }}]
output [{{ name: "y" data_type: TYPE_FP32 dims: [1, {width}] }}]
{extra}
"""


def write_table(root: Path, name: str, mib: int, value: float, extra: str = "") -> None:
    """An ONNX model whose weights (a table of ``mib`` MiB, every entry ``value``) stay in
    memory while it is loaded: it answers row ``x`` of the table."""
    rows = (mib << 20) // (4 * TABLE_WIDTH)
    table = np.full((rows, TABLE_WIDTH), value, np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "x"], ["y"], axis=0)],
        name,
        [helper.make_tensor_value_info("x", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TABLE_WIDTH])],
        [numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    save(model, str(root / name / "1" / "model.onnx"))
    (root / name / "config.pbtxt").write_text(
        TABLE.format(name=name, width=TABLE_WIDTH, extra=extra)
    )


def table_row(url: str, model: str) -> httpx.Response:
    """Row 0 of a ``write_table`` model, on a connection of its own."""
    request = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [0]}]}
    with httpx.Client(timeout=60) as client:
        return client.post(f"{url}/v2/models/{model}/infer", json=request)
