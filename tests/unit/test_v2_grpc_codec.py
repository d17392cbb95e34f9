"""gRPC codec: raw and typed contents of every datatype, the zero-copy split, responses, errors.

tritonclient.grpc is imported beside inferd's messages on purpose: inferd's live in their
own descriptor pool, so both load in one process, and tritonclient encodes and decodes here.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import _utils as triton_utils
from tritonclient.grpc import service_pb2 as triton_pb

from inferd.core import datatypes
from inferd.core.errors import InvalidInput
from inferd.core.types import InferResponse
from inferd.protocols import codecs
from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols.v2 import grpc_codec as codec

NUMERIC = [d for d in datatypes.ALL if not d.is_bytes]
TYPED = [d for d in datatypes.ALL if d.name not in ("FP16", "BF16")]


def _array(dt: datatypes.DataType, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    count = int(np.prod(shape))
    if dt.is_bytes:
        array = np.empty(count, dtype=object)
        array[:] = [f"s{i}".encode() * i for i in range(count)]
        return array.reshape(shape)
    if dt.name == "BOOL":
        even: np.ndarray = np.arange(count) % 2 == 0
        return even.reshape(shape)
    return np.arange(count).reshape(shape).astype(dt.numpy)


def _request(arrays: dict[str, np.ndarray], raw: bool = True, **fields: Any) -> bytes:
    message = pb.ModelInferRequest(model_name=fields.pop("model_name", "m"), **fields)
    for name, array in arrays.items():
        tensor = message.inputs.add(
            name=name, datatype=datatypes.of_array(array).name, shape=array.shape
        )
        if raw:
            message.raw_input_contents.append(bytes(codecs.to_raw(array)))
        else:
            fname = codec._CONTENTS_FIELD[datatypes.of_array(array).name]
            getattr(tensor.contents, fname).extend(array.ravel().tolist())
    return message.SerializeToString()


def _decode(data: bytes) -> Any:
    return codec.decode_request(codec.parse_infer_request(data))


@pytest.mark.parametrize("dt", datatypes.ALL, ids=lambda d: d.name)
def test_raw_contents_every_datatype(dt: datatypes.DataType) -> None:
    array = _array(dt)
    request = _decode(_request({"t": array}, id="r1"))
    assert request.model_name == "m"
    assert request.id == "r1"
    assert request.inputs["t"].dtype == dt.numpy
    np.testing.assert_array_equal(request.inputs["t"], array)


@pytest.mark.parametrize("dt", TYPED, ids=lambda d: d.name)
def test_typed_contents_every_datatype(dt: datatypes.DataType) -> None:
    array = _array(dt)
    decoded = _decode(_request({"t": array}, raw=False)).inputs["t"]
    assert decoded.dtype == dt.numpy
    assert decoded.shape == (2, 3)
    np.testing.assert_array_equal(decoded, array)


def test_large_request_is_split_zero_copy() -> None:
    big = np.arange(codec.SPLIT_ABOVE_BYTES // 2, dtype=np.float32).reshape(-1, 2)
    small = np.array([[7]], dtype=np.int64)
    data = _request({"big": big, "small": small}, id="z")
    wire = codec.parse_infer_request(data)
    assert len(wire.message.raw_input_contents) == 0  # cut out of the message
    request = codec.decode_request(wire)
    np.testing.assert_array_equal(request.inputs["big"], big)
    np.testing.assert_array_equal(request.inputs["small"], small)
    assert np.shares_memory(request.inputs["big"], np.frombuffer(data, dtype=np.uint8))
    assert request.id == "z"


def test_split_accepts_fields_in_any_order() -> None:
    big = np.arange(codec.SPLIT_ABOVE_BYTES // 4 + 1, dtype=np.float32)
    head = pb.ModelInferRequest(model_name="m", id="q")
    head.inputs.add(name="t", datatype="FP32", shape=[big.size])
    raw = pb.ModelInferRequest(raw_input_contents=[big.tobytes()])
    data = raw.SerializeToString() + head.SerializeToString()  # raw first: still one message
    request = _decode(data)
    np.testing.assert_array_equal(request.inputs["t"], big)
    assert request.id == "q"


def test_malformed_bytes_are_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        codec.parse_infer_request(b"\x0a\xff\xff" + b"\x00" * codec.SPLIT_ABOVE_BYTES)


def test_tritonclient_request_decodes() -> None:
    text = np.array([[b"hello", b""], [b"\x00\xff", "é".encode()]], dtype=object)
    inputs = []
    for name, array in {"text": text, "half": np.ones((2, 2), np.float16)}.items():
        inp = triton_grpc.InferInput(name, list(array.shape), datatypes.of_array(array).name)
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    outputs = [triton_grpc.InferRequestedOutput("out")]
    params = {"flag": True, "n": 3, "s": "x", "f": 0.5}
    message = triton_utils._get_inference_request(
        "m", inputs, "2", "id-9", outputs, 0, False, False, 0, None, params
    )
    request = _decode(message.SerializeToString())
    np.testing.assert_array_equal(request.inputs["text"], text)
    assert request.inputs["half"].dtype == np.float16
    assert request.model_version == "2"
    assert request.output_names() == ["out"]
    assert request.parameters == params


def test_parameters_round_trip() -> None:
    message = pb.ModelInferResponse()
    values = {"b": True, "i": -5, "big": 2**64 - 1, "d": 1.5, "s": "text"}
    codec.set_parameters(message.parameters, values)
    assert codec.parameters_to_dict(message.parameters) == values
    assert message.parameters["big"].WhichOneof("parameter_choice") == "uint64_param"


def test_response_decodes_in_tritonclient() -> None:
    outputs = {dt.name: _array(dt) for dt in datatypes.ALL if dt.name != "BF16"}
    response = InferResponse("m", "1", outputs, id="r", parameters={"k": 1})
    data = codec.encode_response(response).serialize()
    result = triton_grpc.InferResult(triton_pb.ModelInferResponse.FromString(data))
    for name, array in outputs.items():
        np.testing.assert_array_equal(result.as_numpy(name), array)
    parsed = result.get_response()
    assert (parsed.model_name, parsed.model_version, parsed.id) == ("m", "1", "r")
    assert parsed.parameters["k"].int64_param == 1


def test_bf16_response_raw_bytes() -> None:
    array = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    data = codec.encode_response(InferResponse("m", "1", {"t": array})).serialize()
    parsed = pb.ModelInferResponse.FromString(data)
    assert parsed.outputs[0].datatype == "BF16"
    assert parsed.raw_output_contents[0] == array.tobytes()


def test_outputs_in_shared_memory_keep_their_place_with_empty_contents() -> None:
    """Triton's answer: one raw_output_contents entry per output, empty for one written to
    shared memory, so a client indexing by position (perf_analyzer) finds the others."""
    outputs = {
        "in_shm": np.ones(3, np.float32),
        "on_wire": np.arange(4, dtype=np.int32),
        "also_shm": np.zeros(2, np.float32),
    }
    data = codec.encode_response(InferResponse("m", "1", outputs), ["in_shm", "also_shm"])
    parsed = triton_pb.ModelInferResponse.FromString(data.serialize())
    assert [o.name for o in parsed.outputs] == ["in_shm", "on_wire", "also_shm"]
    assert list(parsed.raw_output_contents) == [b"", outputs["on_wire"].tobytes(), b""]
    assert not any(o.parameters for o in parsed.outputs)
    result = triton_grpc.InferResult(parsed)
    np.testing.assert_array_equal(result.as_numpy("on_wire"), outputs["on_wire"])


def test_stream_response_success_and_error() -> None:
    ok = codec.encode_response(InferResponse("m", "1", {"y": np.ones(3, np.float32)}, id="a"))
    parsed = triton_pb.ModelStreamInferResponse.FromString(codec.StreamResponse(ok).serialize())
    assert parsed.error_message == ""
    assert parsed.infer_response.id == "a"
    assert parsed.infer_response.raw_output_contents[0] == np.ones(3, np.float32).tobytes()
    wire = codec.parse_infer_request(_request({"x": np.ones(1, np.float32)}, id="b"))
    failed = codec.StreamResponse(codec.error_header(wire), "input 'x': bad").serialize()
    parsed = triton_pb.ModelStreamInferResponse.FromString(failed)
    assert parsed.error_message == "input 'x': bad"
    assert parsed.infer_response.id == "b"


def _typed(name: str, datatype: str, shape: list[int], **contents: Any) -> bytes:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(
        name=name, datatype=datatype, shape=shape, contents=pb.InferTensorContents(**contents)
    )
    return message.SerializeToString()


def _mixed() -> bytes:
    message = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x00" * 4])
    message.inputs.add(name="x", datatype="FP32", shape=[1])
    message.inputs[0].contents.fp32_contents.append(1.0)
    return message.SerializeToString()


def _raw(datatype: str, shape: list[int], raw: bytes, inputs: int = 1) -> bytes:
    message = pb.ModelInferRequest(model_name="m", raw_input_contents=[raw])
    for i in range(inputs):
        message.inputs.add(name=f"x{i}", datatype=datatype, shape=shape)
    return message.SerializeToString()


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (_raw("FP32", [2], b"\x00" * 4), "input 'x0': shape [2] of FP32 needs 8 bytes, got 4"),
        (_raw("FP32", [1], b"\x00" * 4, inputs=2), "raw_input_contents has 1 entries"),
        (_raw("FLOAT", [1], b"\x00" * 4), "input 'x0': unknown datatype 'FLOAT'"),
        (_raw("", [1], b"\x00" * 4), "input 'x0': 'datatype' is missing"),
        (_raw("FP32", [-1], b""), "input 'x0': shape must be a list of non-negative"),
        (_raw("BYTES", [1], b"\x05\x00\x00\x00ab"), "input 'x0': BYTES element overruns"),
        (_mixed(), "contents field must not be specified when using raw_input_contents for 'x'"),
        (_typed("x", "FP32", [2], fp32_contents=[1.0]), "shape [2] needs 2 values, got 1"),
        (_typed("x", "FP32", [1], int_contents=[1]), "contents.int_contents does not carry FP32"),
        (_typed("x", "FP16", [1]), "input 'x': FP16 has no typed contents field"),
        (_typed("x", "INT8", [1], int_contents=[300]), "outside the INT8 range -128..127"),
        (_typed("x", "UINT8", [1], uint_contents=[256]), "outside the UINT8 range"),
        (_typed("", "FP32", [1], fp32_contents=[1.0]), "inputs[0]: 'name' is missing"),
        (pb.ModelInferRequest().SerializeToString(), "'model_name' is missing"),
    ],
)
def test_bad_requests_name_the_field(data: bytes, fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        _decode(data)
    assert fragment in info.value.message


def test_typed_contents_beside_raw_ones_are_named_before_the_count() -> None:
    """Triton's order: the input with typed contents is refused in Triton's words before any
    count of raw_input_contents (one raw entry, two inputs, the second typed)."""
    message = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x00" * 4])
    message.inputs.add(name="a", datatype="FP32", shape=[1])
    message.inputs.add(name="b", datatype="FP32", shape=[1])
    message.inputs[1].contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidInput) as info:
        _decode(message.SerializeToString())
    assert info.value.message == (
        "contents field must not be specified when using raw_input_contents for 'b' for model 'm'"
    )


def test_input_without_data() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[1])
    with pytest.raises(InvalidInput, match="input 'x' has no data"):
        _decode(message.SerializeToString())
    message.inputs[0].shape[:] = [0]  # an empty tensor needs no data
    assert _decode(message.SerializeToString()).inputs["x"].shape == (0,)


def test_input_given_twice() -> None:
    data = _request({"x": np.ones(1, np.float32)})
    message = pb.ModelInferRequest.FromString(data)
    message.inputs.append(message.inputs[0])
    message.raw_input_contents.append(message.raw_input_contents[0])
    with pytest.raises(InvalidInput, match="input 'x' is given twice"):
        _decode(message.SerializeToString())
