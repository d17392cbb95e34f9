"""Bad input gets a 4xx naming the problem, and the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from inferd.demo.models import write_demo_repository
from tests.support import ServerProcess, binary_header

X = {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}


def _post(server: ServerProcess, body: object, model: str = "half_plus_two") -> httpx.Response:
    return httpx.post(f"{server.http_url}/v2/models/{model}/infer", json=body, timeout=60)


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"inputs": [{**X, "datatype": "FP64"}]}, 400, "datatype FP64 does not match"),
        ({"inputs": [{**X, "datatype": "FLOAT"}]}, 400, "unknown datatype 'FLOAT'"),
        ({"inputs": [{**X, "data": [1.0, 2.0]}]}, 400, "needs 1 values, got 2"),
        ({"inputs": [{**X, "data": [[1.0], [2.0, 3.0]]}]}, 400, "input 'x'"),
        ({"inputs": [{**X, "data": ["a"]}]}, 400, "not a (nested) list of FP32"),
        ({"inputs": [{**X, "shape": [1, 2], "data": [1.0, 2.0]}]}, 400, "does not match"),
        ({"inputs": [{**X, "shape": [-1, 1]}]}, 400, "non-negative integers"),
        ({"inputs": [{**X, "name": "z"}]}, 400, "unexpected input 'z'"),
        ({"inputs": []}, 400, "'inputs' must be a non-empty list"),
        ({"inputs": [X, X]}, 400, "given twice"),
        ({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32"}]}, 400, "has no 'data'"),
        ({"inputs": [X], "outputs": [{"name": "nope"}]}, 400, "unknown output 'nope'"),
        ({"inputs": [{**X, "shape": [65, 1], "data": [1.0] * 65}]}, 400, "max_batch_size"),
        ({"inputs": [X], "id": 5}, 400, "'id' must be a string"),
    ],
)
def test_bad_v2_request(server: ServerProcess, body: object, status: int, fragment: str) -> None:
    r = _post(server, body)
    assert r.status_code == status, r.text
    assert fragment in r.json()["error"]
    assert _post(server, {"inputs": [X]}).json()["outputs"][0]["data"] == [2.5]


def test_missing_input(server: ServerProcess) -> None:
    r = _post(
        server, {"inputs": [{"name": "other", "shape": [1], "datatype": "FP32", "data": [1]}]}
    )
    assert r.status_code == 400
    assert "unexpected input 'other'" in r.json()["error"]


def test_malformed_json_and_unknown_model(server: ServerProcess) -> None:
    url = f"{server.http_url}/v2/models/half_plus_two/infer"
    r = httpx.post(url, content=b'{"inputs": [', timeout=60)
    assert r.status_code == 400
    assert r.json()["error"].startswith("malformed JSON")
    r = _post(server, {"inputs": [X]}, model="nope")
    assert (r.status_code, r.json()["error"]) == (
        404,
        "Request for unknown model: 'nope' is not found",
    )
    r = httpx.post(
        f"{server.http_url}/v2/models/half_plus_two/versions/3/infer",
        json={"inputs": [X]},
        timeout=60,
    )
    assert r.status_code == 404
    assert r.json()["error"] == "Request for unknown model: 'half_plus_two' version 3 is not found"
    r = httpx.get(f"{server.http_url}/v2/models/nope", timeout=60)
    assert r.status_code == 404
    r = httpx.get(f"{server.http_url}/v2/nothing/here", timeout=60)
    assert r.status_code == 404
    r = httpx.get(url, timeout=60)
    assert r.status_code == 405


def test_binary_length_mismatch(server: ServerProcess) -> None:
    header = binary_header("x", [2, 1], "FP32", 4)
    r = httpx.post(
        f"{server.http_url}/v2/models/half_plus_two/infer",
        content=header + b"\x00\x00\x80\x3f",
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=60,
    )
    assert r.status_code == 400
    assert "needs 8 bytes, got 4" in r.json()["error"]
    r = httpx.post(
        f"{server.http_url}/v2/models/half_plus_two/infer",
        content=header + b"\x00" * 12,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=60,
    )
    assert r.status_code == 400


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with a tiny body limit, a corrupt model and a bad config beside a good one."""
    root = tmp_path_factory.mktemp("broken") / "models"
    write_demo_repository(root, models=["half_plus_two"])
    (root / "corrupt" / "1").mkdir(parents=True)
    (root / "corrupt" / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    (root / "badconfig" / "1").mkdir(parents=True)
    (root / "badconfig" / "1" / "model.onnx").write_bytes(
        (root / "half_plus_two" / "1" / "model.onnx").read_bytes()
    )
    (root / "badconfig" / "config.pbtxt").write_text(
        'name: "badconfig"\nmodel_repository_agents {}\n'
    )
    # Two models fail to load on purpose: ready means "startup is done", not "all READY".
    args = ["--http-max-body-bytes", "500", "--strict-readiness=false"]
    server = ServerProcess(root, extra_args=args).start()
    yield server
    server.stop()


def test_failed_models_are_unavailable_with_reason(limited_server: ServerProcess) -> None:
    url = limited_server.http_url
    index = httpx.post(f"{url}/v2/repository/index", timeout=60).json()
    by_name = {e["name"]: e for e in index}
    assert by_name["half_plus_two"]["state"] == "READY"
    assert by_name["corrupt"]["state"] == "UNAVAILABLE"
    assert "cannot read ONNX model" in by_name["corrupt"]["reason"]
    assert by_name["badconfig"]["state"] == "UNAVAILABLE"
    assert "model_repository_agents" in by_name["badconfig"]["reason"]
    r = httpx.post(f"{url}/v2/models/corrupt/infer", json={"inputs": [X]}, timeout=60)
    assert r.status_code == 503
    assert "cannot read ONNX model" in r.json()["error"]
    assert httpx.get(f"{url}/v2/models/corrupt/ready", timeout=60).status_code == 400
    r = httpx.post(f"{url}/v2/models/half_plus_two/infer", json={"inputs": [X]}, timeout=60)
    assert r.json()["outputs"][0]["data"] == [2.5]


def test_index_ready_must_be_a_boolean(limited_server: ServerProcess) -> None:
    url = limited_server.http_url
    ready = httpx.post(f"{url}/v2/repository/index", json={"ready": True}, timeout=30)
    assert [e["name"] for e in ready.json()] == ["half_plus_two"]
    values: list[object] = ["yes", 1, {}]
    for value in values:  # once read as true, whatever it was
        r = httpx.post(f"{url}/v2/repository/index", json={"ready": value}, timeout=30)
        assert r.status_code == 400
        assert r.json() == {"error": "'ready' must be a boolean"}


def test_body_over_limit(limited_server: ServerProcess) -> None:
    big = {"inputs": [{"name": "x", "shape": [64, 1], "datatype": "FP32", "data": [1.123456] * 64}]}
    r = httpx.post(f"{limited_server.http_url}/v2/models/half_plus_two/infer", json=big, timeout=60)
    assert r.status_code == 413
    assert "exceeds the limit of 500 bytes" in r.json()["error"]
    r = httpx.post(
        f"{limited_server.http_url}/v2/models/half_plus_two/infer", json={"inputs": [X]}, timeout=60
    )
    assert r.status_code == 200
