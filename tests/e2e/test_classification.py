"""Triton's classification extension over HTTP (JSON and binary) and gRPC, with a label file
(``label_filename``), through tritonclient's ``class_count`` and raw v2 JSON."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from tests.support import ServerProcess

CONFIG = """name: "scores"
backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] label_filename: "labels.txt" }]
"""
X = np.array([[0.1, 0.6, 0.2, 0.1], [0.7, 0.05, 0.05, 0.2]], np.float32)
TOP2 = [[b"0.600000:1:dog", b"0.200000:2:bird"], [b"0.700000:0:cat", b"0.200000:3"]]


@pytest.fixture(scope="module")
def scores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("classes") / "models"
    (root / "scores" / "1").mkdir(parents=True)
    (root / "scores" / "config.pbtxt").write_text(CONFIG)
    (root / "scores" / "labels.txt").write_text("cat\ndog\nbird\n")  # index 3 has no label
    server = ServerProcess(root).start()
    yield server
    server.stop()


@pytest.mark.parametrize("binary", [True, False])
def test_class_count_over_http(scores: ServerProcess, binary: bool) -> None:
    client = triton_http.InferenceServerClient(scores.http_address)
    inp = triton_http.InferInput("INPUT0", [2, 4], "FP32")
    inp.set_data_from_numpy(X, binary_data=binary)
    wanted = [triton_http.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=2)]
    result = client.infer("scores", [inp], outputs=wanted)
    got = result.as_numpy("OUTPUT0").tolist()
    if not binary:  # tritonclient gives JSON strings as str
        got = [[s.encode() for s in row] for row in got]
    assert got == TOP2
    assert result.get_output("OUTPUT0")["datatype"] == "BYTES"


def test_class_count_over_grpc(scores: ServerProcess) -> None:
    with triton_grpc.InferenceServerClient(scores.grpc_address) as client:
        inp = triton_grpc.InferInput("INPUT0", [2, 4], "FP32")
        inp.set_data_from_numpy(X)
        wanted = [triton_grpc.InferRequestedOutput("OUTPUT0", class_count=2)]
        result = client.infer("scores", [inp], outputs=wanted)
        assert result.as_numpy("OUTPUT0").tolist() == TOP2
        assert list(result.get_output("OUTPUT0").shape) == [2, 2]


def test_v2_json_parameters_and_bad_counts(scores: ServerProcess) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 4, 3, 2]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 5}}],
    }
    r = httpx.post(f"{scores.http_url}/v2/models/scores/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["datatype"] == "BYTES" and out["shape"] == [1, 4]  # K is capped at 4 classes
    assert out["data"] == ["4.000000:1:dog", "3.000000:2:bird", "2.000000:3", "1.000000:0:cat"]
    body["outputs"] = [{"name": "OUTPUT0", "parameters": {"classification": -1}}]
    r = httpx.post(f"{scores.http_url}/v2/models/scores/infer", json=body, timeout=60)
    assert r.status_code == 400
    assert "'classification' must be a positive integer" in r.json()["error"]
