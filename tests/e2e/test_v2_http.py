"""KServe v2 HTTP end to end: tritonclient.http (JSON and binary) and httpx on a real server."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http

from tests.support import ServerProcess, binary_header


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> triton_http.InferenceServerClient:
    return triton_http.InferenceServerClient(server.http_address)


def _digits_sample(repo: Path) -> tuple[np.ndarray, np.ndarray]:
    sample = json.loads((repo / "digits" / "sample.json").read_text())
    return np.asarray(sample["inputs"], dtype=np.float32), np.asarray(sample["labels"])


def test_health_and_server_metadata(client: triton_http.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "inferd"
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_and_config(client: triton_http.InferenceServerClient) -> None:
    assert client.is_model_ready("digits")
    assert client.is_model_ready("digits", "1")
    meta = client.get_model_metadata("digits")
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]} in meta["outputs"]
    config = client.get_model_config("half_plus_two")
    assert config["max_batch_size"] == 64
    assert config["input"][0]["dims"] == [1]
    assert config["input"][0]["reshape"] == {"shape": []}
    assert config["input"][0]["data_type"] == "TYPE_FP32"


@pytest.mark.parametrize("binary", [False, True])
def test_half_plus_two(client: triton_http.InferenceServerClient, binary: bool) -> None:
    x = np.array([[1.0], [2.0], [5.0]], dtype=np.float32)
    inp = triton_http.InferInput("x", [3, 1], "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = triton_http.InferRequestedOutput("y", binary_data=binary)
    result = client.infer("half_plus_two", [inp], outputs=[out], request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("y"), [[2.5], [3.0], [4.5]])
    assert result.get_response()["id"] == "req-7"
    assert result.get_response()["model_version"] == "1"


def test_digits_classifies_held_out_rows(
    client: triton_http.InferenceServerClient, demo_repo: Path
) -> None:
    rows, labels = _digits_sample(demo_repo)
    inp = triton_http.InferInput("input", list(rows.shape), "FP32")
    inp.set_data_from_numpy(rows)
    result = client.infer("digits", [inp])
    predicted = result.as_numpy("label").reshape(-1)
    probs = result.as_numpy("probabilities")
    assert probs.shape == (len(rows), 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(predicted, probs.argmax(axis=1))
    assert (predicted == labels).mean() >= 0.875


def test_requested_output_subset(
    client: triton_http.InferenceServerClient, demo_repo: Path
) -> None:
    rows, _ = _digits_sample(demo_repo)
    inp = triton_http.InferInput("input", [1, 64], "FP32")
    inp.set_data_from_numpy(rows[:1])
    result = client.infer("digits", [inp], outputs=[triton_http.InferRequestedOutput("label")])
    names = [o["name"] for o in result.get_response()["outputs"]]
    assert names == ["label"]
    assert result.as_numpy("label").shape == (1, 1)


def test_resnet50_binary(client: triton_http.InferenceServerClient) -> None:
    rng = np.random.default_rng(0)
    image = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
    inp = triton_http.InferInput("input", [1, 3, 224, 224], "FP32")
    inp.set_data_from_numpy(image, binary_data=True)
    result = client.infer("resnet50", [inp])
    scores = result.as_numpy("output")
    assert scores.shape == (1, 1000)
    assert np.isfinite(scores).all()


def test_compressed_request_and_response(client: triton_http.InferenceServerClient) -> None:
    x = np.array([[4.0]], dtype=np.float32)
    for algorithm in ("gzip", "deflate"):
        inp = triton_http.InferInput("x", [1, 1], "FP32")
        inp.set_data_from_numpy(x, binary_data=False)
        result = client.infer(
            "half_plus_two",
            [inp],
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        np.testing.assert_array_equal(result.as_numpy("y"), [[4.0]])


def test_gzip_raw_body_with_httpx(server: ServerProcess) -> None:
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [[1], [3]]}]}
    ).encode()
    r = httpx.post(
        f"{server.http_url}/v2/models/half_plus_two/infer",
        content=gzip.compress(body),
        headers={"Content-Encoding": "gzip", "Accept-Encoding": "deflate"},
        timeout=60,
    )
    assert r.status_code == 200
    assert r.headers["content-encoding"] == "deflate"
    assert r.json()["outputs"][0]["data"] == [2.5, 3.5]
    raw = zlib.compress(body)
    r = httpx.post(
        f"{server.http_url}/v2/models/half_plus_two/versions/1/infer",
        content=raw,
        headers={"Content-Encoding": "deflate"},
        timeout=60,
    )
    assert r.json()["outputs"][0]["shape"] == [2, 1]


def test_nested_and_flat_json_data(server: ServerProcess) -> None:
    url = f"{server.http_url}/v2/models/half_plus_two/infer"
    for data in ([[2.0], [6.0]], [2.0, 6.0]):
        body = {"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": data}]}
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"] == [
            {"name": "y", "datatype": "FP32", "shape": [2, 1], "data": [3.0, 5.0]}
        ]


def test_binary_output_by_request_parameter(server: ServerProcess) -> None:
    body = {
        "inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}],
        "parameters": {"binary_data_output": True},
    }
    r = httpx.post(f"{server.http_url}/v2/models/half_plus_two/infer", json=body, timeout=60)
    assert r.status_code == 200
    header_len = int(r.headers["inference-header-content-length"])
    header = json.loads(r.content[:header_len])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 4}
    assert np.frombuffer(r.content[header_len:], dtype=np.float32).tolist() == [2.5]


def test_repository_index(server: ServerProcess) -> None:
    r = httpx.post(f"{server.http_url}/v2/repository/index", json={"ready": True}, timeout=60)
    assert r.status_code == 200
    names = {(e["name"], e["version"], e["state"]) for e in r.json()}
    assert names == {
        ("digits", "1", "READY"),
        ("half_plus_two", "1", "READY"),
        ("resnet50", "1", "READY"),
    }


def test_a_repeated_binary_header_decodes_each_body(server: ServerProcess) -> None:
    """The same JSON header with new tensors, then with too few bytes, then right again: each
    answer is its own (the header's decode is remembered, the checks are not skipped)."""
    header = binary_header("x", [2, 1], "FP32", 8, parameters={"binary_data_output": True})
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    url = f"{server.http_url}/v2/models/half_plus_two/infer"
    for values in ([1.0, 2.0], [5.0, -4.0], [0.0, 10.0]):
        body = header + np.array(values, np.float32).tobytes()
        r = httpx.post(url, content=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        split = int(r.headers["inference-header-content-length"])
        expected = [v / 2 + 2 for v in values]
        assert np.frombuffer(r.content[split:], np.float32).tolist() == expected
    r = httpx.post(url, content=header + b"\0" * 4, headers=headers, timeout=60)
    assert r.status_code == 400
    assert "binary_data_size 8 overruns the binary data (4 bytes left)" in r.json()["error"]
    r = httpx.post(
        url,
        content=header + np.array([3.0, 4.0], np.float32).tobytes(),
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 200
    split = int(r.headers["inference-header-content-length"])
    assert np.frombuffer(r.content[split:], np.float32).tolist() == [3.5, 4.0]


def test_every_request_gets_an_id_of_its_own(demo_repo: Path) -> None:
    """A request without an id gets one the server makes, unique to the server: each serving
    process (the kernel spreads connections over them) makes ids of its own."""
    server = ServerProcess(demo_repo).start()
    try:
        url = f"{server.http_url}/v2/models/half_plus_two/infer"
        body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
        ids = [httpx.post(url, json=body, timeout=60).headers["x-request-id"] for _ in range(30)]
    finally:
        server.stop()
    assert len(set(ids)) == len(ids), sorted(ids)
