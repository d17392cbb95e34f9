"""BYTES tensors round-trip any byte string (NULs, empty strings, bytes that are not UTF-8,
1 MB elements) over every protocol and every backend that takes strings; where a framework
cannot carry a byte, the answer is a 400 that says so, never a shortened string. (TensorFlow's
string tensors: ``test_tfserving_fidelity.py``, whose server has TensorFlow loaded already.)"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols import grpc_service_pb2_grpc as pb_grpc
from inferd.protocols.tfserving import serving_pb2, serving_pb2_grpc, tensorflow_pb2
from tests.e2e.backend_checks import version_dir, write_config
from tests.support import ServerProcess

MEGABYTE = b"m" * (1 << 20)
VALUES = [b"he\x00llo", b"\x00\x01\x02\x03", b"abc\x00", b"", b"\xff\xfe\x00\xfd", MEGABYTE]
TEXT = [b"he\x00llo", b"\x00\x01\x02\x03", b"abc\x00", b"", "é€".encode(), MEGABYTE + b"\x00"]
ECHO = """backend: "echo"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_STRING dims: [-1] }]
"""


def _strings(values: list[bytes]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _onnx_identity(path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "strings",
        [helper.make_tensor_value_info("x", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path.write_bytes(model.SerializeToString())


def _openvino_identity(path: Path) -> bool:
    try:
        import openvino as ov
        from openvino import opset13 as ops
    except ImportError:
        return False
    x = ops.parameter(ov.PartialShape([-1]), ov.Type.string, name="x")
    y = ops.reshape(x, ops.constant(np.array([-1], dtype=np.int64)), False)
    y.output(0).get_tensor().set_names({"y"})
    ov.save_model(ov.Model([y], [x], "strings"), str(path))
    return True


@pytest.fixture(scope="module")
def strings_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("bytes") / "models"
    write_config(root, "echo_bytes", ECHO)
    version_dir(root, "echo_bytes")
    _onnx_identity(version_dir(root, "onnx_strings") / "model.onnx")
    if _openvino_identity(version_dir(root, "ov_strings") / "model.xml"):
        write_config(root, "ov_strings", 'backend: "openvino"\n')
    server = ServerProcess(root).start(timeout_s=180)
    yield server
    server.stop()


def _grpc_client(server: ServerProcess) -> triton_grpc.InferenceServerClient:
    options = [("grpc.max_receive_message_length", 64 << 20)]
    return triton_grpc.InferenceServerClient(server.grpc_address, channel_args=options)


def _infer_grpc(server: ServerProcess, model: str, name: str, values: list[bytes]) -> np.ndarray:
    tensor = triton_grpc.InferInput(name, [len(values)], "BYTES")
    tensor.set_data_from_numpy(_strings(values))
    result = _grpc_client(server).infer(model, [tensor])
    output = result.get_response().outputs[0].name
    array: np.ndarray = result.as_numpy(output)
    return array.reshape(-1)


def test_every_protocol_carries_every_byte(strings_server: ServerProcess) -> None:
    """The echo model over v2 HTTP binary and JSON, v2 gRPC raw and typed, TF Serving REST
    and gRPC."""
    server, model = strings_server, "echo_bytes"
    # v2 HTTP, binary tensor data (tritonclient.http).
    client = triton_http.InferenceServerClient(server.http_address)
    tensor = triton_http.InferInput("INPUT0", [len(VALUES)], "BYTES")
    tensor.set_data_from_numpy(_strings(VALUES), binary_data=True)
    wanted = [triton_http.InferRequestedOutput("OUTPUT0", binary_data=True)]
    result = client.infer(model, [tensor], outputs=wanted)
    assert result.as_numpy("OUTPUT0").tolist() == VALUES
    # v2 gRPC, raw_input_contents (tritonclient.grpc).
    assert _infer_grpc(server, model, "INPUT0", VALUES).tolist() == VALUES
    # v2 gRPC, typed bytes_contents.
    with grpc.insecure_channel(server.grpc_address) as channel:
        request = pb.ModelInferRequest(model_name=model)
        request.inputs.add(name="INPUT0", datatype="BYTES", shape=[len(VALUES)])
        request.inputs[0].contents.bytes_contents.extend(VALUES)
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        answer = stub.ModelInfer(request, timeout=30)
    assert _raw_bytes(answer.raw_output_contents[0]) == VALUES
    # v2 HTTP JSON: text strings keep their NULs; bytes that are not UTF-8 must go binary.
    text = [v.decode() for v in TEXT]
    doc: dict[str, Any] = {
        "inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [6], "data": text}]
    }
    r = httpx.post(f"{server.http_url}/v2/models/{model}/infer", json=doc, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == text
    doc["inputs"][0]["parameters"] = {"binary_data_size": 4 + 2}
    del doc["inputs"][0]["data"]
    doc["inputs"][0]["shape"] = [1]
    header = json.dumps(doc).encode()
    r = httpx.post(
        f"{server.http_url}/v2/models/{model}/infer",
        content=header + b"\x02\x00\x00\x00\xff\x00",
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=60,
    )
    assert r.status_code == 400
    assert r.json()["error"] == (
        "output 'OUTPUT0' holds bytes that are not UTF-8; request it as binary data"
    )
    # TF Serving REST: b64 in; out as text when it is UTF-8, else as b64 objects.
    b64 = [{"b64": base64.b64encode(v).decode()} for v in VALUES]
    r = httpx.post(f"{server.http_url}/v1/models/{model}:predict", json={"inputs": b64}, timeout=30)
    assert r.status_code == 200, r.text
    assert [base64.b64decode(o["b64"]) for o in r.json()["outputs"]] == VALUES
    r = httpx.post(
        f"{server.http_url}/v1/models/{model}:predict", json={"instances": text}, timeout=60
    )
    assert r.json() == {"predictions": text}
    # TF Serving gRPC: string_val.
    with grpc.insecure_channel(
        server.grpc_address, options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as channel:
        predict = serving_pb2.PredictRequest()
        predict.model_spec.name = model
        tensor_proto = predict.inputs["INPUT0"]
        tensor_proto.dtype = tensorflow_pb2.DT_STRING
        tensor_proto.tensor_shape.dim.add().size = len(VALUES)
        tensor_proto.string_val.extend(VALUES)
        tf_stub = serving_pb2_grpc.PredictionServiceStub(channel)  # type: ignore[no-untyped-call]
        out = tf_stub.Predict(predict, timeout=30)
    assert list(out.outputs["OUTPUT0"].string_val) == VALUES


def _raw_bytes(raw: bytes) -> list[bytes]:
    items, offset = [], 0
    while offset < len(raw):
        size = int.from_bytes(raw[offset : offset + 4], "little")
        items.append(raw[offset + 4 : offset + 4 + size])
        offset += 4 + size
    return items


def test_onnx_runtime_carries_every_utf8_string(strings_server: ServerProcess) -> None:
    """ORT's Python API takes text: UTF-8 crosses intact (NULs, empty, 1 MB); other bytes
    are refused by name, with the rest of a batch unharmed."""
    assert _infer_grpc(strings_server, "onnx_strings", "x", TEXT).tolist() == TEXT
    with pytest.raises(InferenceServerException) as info:
        _infer_grpc(strings_server, "onnx_strings", "x", VALUES)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == (
        "input 'x': element 4 is not UTF-8 text; ONNX Runtime carries strings as text, "
        "so it cannot take arbitrary bytes"
    )


def test_openvino_refuses_what_it_cannot_carry(strings_server: ServerProcess) -> None:
    """OpenVINO's Python API holds strings in fixed-width numpy arrays: every byte but a
    trailing NUL crosses; a trailing NUL is a 400."""
    if not (strings_server.repository / "ov_strings").exists():
        pytest.skip("OpenVINO is not installed")
    carried = [v for v in VALUES if not v.endswith(b"\x00")]
    assert _infer_grpc(strings_server, "ov_strings", "x", carried).tolist() == carried
    with pytest.raises(InferenceServerException) as info:
        _infer_grpc(strings_server, "ov_strings", "x", VALUES)
    assert info.value.message() == (
        "input 'x': element 2 ends with a NUL byte, which OpenVINO's Python API cannot carry"
    )
