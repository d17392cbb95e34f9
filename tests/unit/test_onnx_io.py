"""An ONNX file's inputs, outputs, initializer names and metadata, read without its weights,
are what onnx.load reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from inferd.backends.onnx_io import light_model
from inferd.demo.models import write_demo_repository


def _graph_model(initializer_in_inputs: bool) -> onnx.ModelProto:
    table = numpy_helper.from_array(np.arange(4000, dtype=np.float32).reshape(1000, 4), "table")
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [-1, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 1, 4])
    inputs = [x]
    if initializer_in_inputs:  # as exporters before IR 4 wrote them
        inputs.append(helper.make_tensor_value_info("table", TensorProto.FLOAT, [1000, 4]))
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "x"], ["y"])], "g", inputs, [y], [table]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    helper.set_model_props(model, {"inferd.optimize.level": "all", "author": "me"})
    return model


def _same(path: Path) -> None:
    full = onnx.load(str(path), load_external_data=False)
    light = light_model(path)
    assert light.ir_version == full.ir_version
    assert list(light.opset_import) == list(full.opset_import)
    assert list(light.metadata_props) == list(full.metadata_props)
    assert list(light.graph.input) == list(full.graph.input)
    assert list(light.graph.output) == list(full.graph.output)
    assert [i.name for i in light.graph.initializer] == [i.name for i in full.graph.initializer]
    assert all(not i.raw_data and not i.float_data for i in light.graph.initializer)
    assert light.ByteSize() < 2000


@pytest.mark.parametrize("initializer_in_inputs", [False, True])
def test_a_graph_with_weights(tmp_path: Path, initializer_in_inputs: bool) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_graph_model(initializer_in_inputs), str(path))
    _same(path)


def test_the_demo_models(tmp_path: Path) -> None:
    write_demo_repository(tmp_path, models=["half_plus_two", "digits"])
    for name in ("half_plus_two", "digits"):
        _same(tmp_path / name / "1" / "model.onnx")


@pytest.mark.parametrize("content", [b"", b"\xff\xff\xff", b"\x0a\x05abc"])
def test_what_is_not_onnx_is_a_value_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ValueError):
        light_model(path)
