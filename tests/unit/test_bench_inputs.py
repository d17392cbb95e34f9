"""inferd bench inputs and bodies: shapes against the model, data files, and every encoding.

Bodies are decoded with inferd's own server-side decoders, so what the bench sends is what
a server reads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from inferd.bench import encode, inputs
from inferd.bench.inputs import InputTensor
from inferd.bench.options import BenchError, Target
from inferd.bench.specs import ModelSpec, TensorSpec
from inferd.core.datatypes import BY_NAME
from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols.v2 import http as v2_http

HALF = ModelSpec("half", "", (TensorSpec("x", "FP32", (-1, 1)),), 64)
DIGITS = ModelSpec("digits", "", (TensorSpec("input", "FP32", (-1, 64)),), 64)
IMAGE = ModelSpec("img", "", (TensorSpec("pixels", "UINT8", (-1, -1, -1, 3)),), 8)
FIXED = ModelSpec(
    "fixed", "", (TensorSpec("a", "INT64", (2, 3)), TensorSpec("b", "BYTES", (2,))), 0
)
NO_CONFIG = ModelSpec("mls", "", (TensorSpec("x", "FP32", (-1, 4)),), None)


def test_batch_dim_takes_the_batch_size() -> None:
    assert inputs.resolve_shapes(HALF, 8, {}) == {"x": (8, 1)}
    assert inputs.resolve_shapes(NO_CONFIG, 3, {}) == {"x": (3, 4)}  # leading -1: batches
    assert inputs.resolve_shapes(FIXED, 1, {}) == {"a": (2, 3), "b": (2,)}


def test_shape_flag_fills_variable_dims_with_or_without_the_batch_dim() -> None:
    assert inputs.resolve_shapes(IMAGE, 2, {"pixels": (32, 16, 3)}) == {"pixels": (2, 32, 16, 3)}
    assert inputs.resolve_shapes(IMAGE, 2, {"pixels": (4, 32, 16, 3)}) == {"pixels": (4, 32, 16, 3)}


@pytest.mark.parametrize(
    ("spec", "batch", "shapes", "message"),
    [
        (IMAGE, 1, {}, r"variable dims \[-1, -1, -1, 3\]; give --shape pixels:DIMS"),
        (IMAGE, 1, {"pixels": (32, 16, 4)}, "does not match the model's"),
        (HALF, 1, {"x": (3,)}, r"shape \[1, 3\] for input 'x' does not match"),
        (HALF, 1, {"y": (1,)}, "has no input 'y'"),
        (HALF, 65, {}, "max_batch_size 64"),
        (FIXED, 2, {}, "does not batch"),
    ],
)
def test_shape_errors(
    spec: ModelSpec, batch: int, shapes: dict[str, tuple[int, ...]], message: str
) -> None:
    with pytest.raises(BenchError, match=message):
        inputs.resolve_shapes(spec, batch, shapes)


def test_generated_data_has_the_model_datatypes() -> None:
    (sample,) = inputs.generated(FIXED, {"a": (2, 3), "b": (2,)}, "random")
    a, b = sample
    assert a.array.dtype == np.int64 and a.array.shape == (2, 3)
    assert b.array.dtype == object and all(isinstance(v, bytes) for v in b.array)
    (zeros,) = inputs.generated(HALF, {"x": (4, 1)}, "zero")
    assert zeros[0].array.tolist() == [[0.0]] * 4 and zeros[0].array.dtype == np.float32
    with pytest.raises(BenchError, match="describes no inputs"):
        inputs.generated(ModelSpec("m", "", (), None), {}, "random")


def test_perf_analyzer_data_file_repeats_one_row_over_the_batch(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    row = list(range(64))
    path.write_bytes(orjson.dumps({"data": [{"input": row}, {"input": {"content": row * 3}}]}))
    first, second = inputs.from_file(path, DIGITS, {"input": (3, 64)}, 3)
    assert first[0].array.shape == (3, 64) and first[0].array[2, 63] == 63
    np.testing.assert_array_equal(first[0].array, second[0].array)
    path.write_bytes(orjson.dumps({"data": [{"input": {"content": [1.0], "shape": [1]}}]}))
    with pytest.raises(BenchError, match="does not match the model's"):
        inputs.from_file(path, DIGITS, {"input": (1, 64)}, 1)
    path.write_bytes(orjson.dumps({"data": [{"input": [1.0, 2.0]}]}))
    with pytest.raises(BenchError, match="needs 64 values, got 2"):
        inputs.from_file(path, DIGITS, {"input": (1, 64)}, 1)
    path.write_bytes(orjson.dumps({"data": [{"other": [1.0]}]}))
    with pytest.raises(BenchError, match="no input 'other'"):
        inputs.from_file(path, DIGITS, {"input": (1, 64)}, 1)


def test_v2_request_file_is_sent_as_written(tmp_path: Path) -> None:
    path = tmp_path / "request.json"
    doc = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [2, 1], "data": [[1], [2]]}]}
    path.write_bytes(orjson.dumps(doc))
    ((x,),) = inputs.from_file(path, HALF, {"x": (1, 1)}, 1)
    assert x.datatype.name == "INT32" and x.array.tolist() == [[1], [2]]  # the server judges
    ((x,),) = inputs.from_file(path, ModelSpec("mls", "", (), None), {}, 1)  # no metadata
    assert x.array.shape == (2, 1)
    doc["inputs"][0]["shape"] = [2, 2]
    doc["inputs"][0]["data"] = [1, 2, 3, 4]
    path.write_bytes(orjson.dumps(doc))
    with pytest.raises(BenchError, match="does not match the model's"):
        inputs.from_file(path, HALF, {"x": (1, 1)}, 1)


def test_bad_data_files(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{nope")
    with pytest.raises(BenchError, match="not JSON"):
        inputs.from_file(path, HALF, {"x": (1, 1)}, 1)
    path.write_text("[]")
    with pytest.raises(BenchError, match="expected"):
        inputs.from_file(path, HALF, {"x": (1, 1)}, 1)
    with pytest.raises(BenchError, match="No such file"):
        inputs.from_file(tmp_path / "missing.json", HALF, {"x": (1, 1)}, 1)


SAMPLE = (
    InputTensor("x", BY_NAME["FP32"], np.arange(6, dtype=np.float32).reshape(3, 2)),
    InputTensor("s", BY_NAME["BYTES"], np.array([b"a", b"bc", b""], dtype=object)),
)


def _decode_http(request: bytes) -> tuple[dict[str, str], object]:
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /p/v2/models/m/infer HTTP/1.1"
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    assert int(headers["content-length"]) == len(body)
    length = headers.get("inference-header-content-length")
    binary = memoryview(body)[int(length) :] if length else None
    doc = orjson.loads(body[: int(length)] if length else body)
    return headers, v2_http.decode_request(doc, binary, "m", "")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_v2_http_bodies_decode_on_the_server_side(binary: bool) -> None:
    body, header_length = (
        encode.v2_binary_body(SAMPLE) if binary else (encode.v2_json_body(SAMPLE), None)
    )
    ctype = "application/octet-stream" if binary else "application/json"
    request = encode.http_request("/p/v2/models/m/infer", "h:1", body, ctype, header_length)
    headers, decoded = _decode_http(request)
    assert headers["content-type"] == ctype
    assert ("inference-header-content-length" in headers) is binary
    np.testing.assert_array_equal(decoded.inputs["x"], SAMPLE[0].array)  # type: ignore[attr-defined]
    assert decoded.inputs["s"].tolist() == [b"a", b"bc", b""]  # type: ignore[attr-defined]
    if binary:
        assert decoded.parameters == {"binary_data_output": True}  # type: ignore[attr-defined]


def test_grpc_body_carries_raw_tensors() -> None:
    request = pb.ModelInferRequest.FromString(encode.grpc_body("m", "2", SAMPLE))
    assert (request.model_name, request.model_version) == ("m", "2")
    assert [(i.name, i.datatype, list(i.shape)) for i in request.inputs] == [
        ("x", "FP32", [3, 2]),
        ("s", "BYTES", [3]),
    ]
    assert np.frombuffer(request.raw_input_contents[0], np.float32).tolist() == list(range(6))
    assert request.raw_input_contents[1] == b"\x01\x00\x00\x00a\x02\x00\x00\x00bc\x00\x00\x00\x00"


def test_tfserving_bodies_are_row_instances() -> None:
    one = (InputTensor("x", BY_NAME["FP16"], np.array([1.5, 2.0], dtype=np.float16)),)
    assert orjson.loads(encode.tfserving_body(one)) == {"instances": [1.5, 2.0]}
    assert orjson.loads(encode.tfserving_body(SAMPLE)) == {
        "instances": [
            {"x": [0.0, 1.0], "s": "a"},
            {"x": [2.0, 3.0], "s": "bc"},
            {"x": [4.0, 5.0], "s": ""},
        ]
    }


def test_workloads_per_protocol() -> None:
    from inferd.bench.options import from_args
    from inferd.cli import build_parser

    target = Target("t", "h", 9, "")
    for argv, protocol, encoding, marker in [
        ([], "http", "v2 binary", b"/v2/models/m/versions/3/infer"),
        (["--json"], "http", "v2 json", b"application/json"),
        (
            ["--service-kind", "tfserving"],
            "http",
            "tfserving json",
            b"/v1/models/m/versions/3:predict",
        ),
        (["-i", "grpc"], "grpc", "grpc", b"\n\x01m\x12\x013"),
    ]:
        options = from_args(build_parser().parse_args(["bench", "-m", "m", "-x", "3", *argv]))
        workload = encode.build(options, target, [SAMPLE[:1]])
        assert (workload.protocol, workload.encoding) == (protocol, encoding)
        assert len(workload.requests) == 1 and marker in workload.requests[0]
