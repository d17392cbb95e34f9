"""triton_python_backend_utils: types, BYTES serialization, the auto-complete ModelConfig."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferd.backends.python import pb_utils


def test_type_names_and_numpy_types() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_to_numpy_type(9) is np.int64
    assert pb_utils.numpy_to_triton_type(np.float16) == 10
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert np.dtype(pb_utils.triton_string_to_numpy("TYPE_BF16")).name == "bfloat16"


def test_bytes_serialization_round_trips_any_bytes() -> None:
    values = np.array([b"\x00", "é", b"\xff" * 3], dtype=object)
    encoded = pb_utils.serialize_byte_tensor(values)
    assert encoded.shape == () and encoded.dtype == object
    decoded = pb_utils.deserialize_bytes_tensor(encoded.item())
    assert decoded.tolist() == [b"\x00", "é".encode(), b"\xff\xff\xff"]


def test_tensors_and_responses() -> None:
    tensor = pb_utils.Tensor("T", np.array(["a", "b"]))
    assert tensor.as_numpy().tolist() == [b"a", b"b"] and tensor.triton_dtype() == 13
    response = pb_utils.InferenceResponse([tensor], parameters={"k": 1})
    assert pb_utils.get_output_tensor_by_name(response, "T") is tensor
    assert pb_utils.get_output_tensor_by_name(response, "U") is None
    assert json.loads(response.parameters()) == {"k": 1} and not response.has_error()
    request = pb_utils.InferenceRequest(inputs=[tensor], parameters={"p": True}, request_id="r")
    assert pb_utils.get_input_tensor_by_name(request, "T") is tensor
    assert json.loads(request.parameters()) == {"p": True} and request.request_id() == "r"


def test_auto_complete_config() -> None:
    config = pb_utils.ModelConfig(
        {"name": "m", "max_batch_size": 0, "input": [{"name": "A", "data_type": "TYPE_FP32"}]}
    )
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "B", "data_type": "TYPE_INT32", "dims": [1]})
    config.add_output({"name": "C", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    result = config.as_dict()
    assert result["input"] == [
        {"name": "A", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "B", "data_type": "TYPE_INT32", "dims": [1]},
    ]
    assert result["max_batch_size"] == 8 and result["dynamic_batching"] == {}
    with pytest.raises(pb_utils.TritonModelException, match="the config has data_type"):
        config.add_input({"name": "B", "data_type": "TYPE_FP64", "dims": [1]})
    with pytest.raises(pb_utils.TritonModelException, match="exceeds the model's 4"):
        config.set_max_batch_size(4)


def test_the_logger_logs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="model"):
        pb_utils.Logger.log_info("hello")
        pb_utils.Logger.log("careful", pb_utils.Logger.WARNING)
    assert [(r.levelname, r.message) for r in caplog.records] == [
        ("INFO", "hello"),
        ("WARNING", "careful"),
    ]
