"""Explicit model control: --load-model at start, then load/unload over HTTP and gRPC.

Also Triton's ways of loading: a config override, and a model uploaded in the load call
(``file:`` parameters). Bad calls answer 4xx naming the problem and change nothing.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.e2e.lifecycle_support import (
    HALF_PLUS_THREE,
    HALF_PLUS_TWO,
    HPT,
    HTTP,
    index,
    infer,
    states,
    write_version,
)
from tests.support import ServerProcess

CONFIG = {
    "max_batch_size": 4,
    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": []}}],
    "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": []}}],
}


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("explicit") / "models"
    write_version(root / HPT, 1)
    write_version(root / "other", 1, HALF_PLUS_THREE)
    server = ServerProcess(
        root,
        extra_args=[
            "--model-control-mode",
            "explicit",
            "--load-model",
            HPT,
            "--model-cache-dir",
            str(root.parent / "cache"),
        ],
    ).start()
    yield server
    server.stop()


def _post(server: ServerProcess, path: str, body: object = None) -> httpx.Response:
    return HTTP.post(f"{server.http_url}/v2/repository{path}", json=body, timeout=30)


def test_only_the_named_model_loads_and_the_index_lists_the_rest(explicit: ServerProcess) -> None:
    assert index(explicit) == [
        {"name": HPT, "version": "1", "state": "READY", "reason": ""},
        {"name": "other", "version": "", "state": "UNAVAILABLE", "reason": "unloaded"},
    ]
    assert index(explicit, ready=True) == [index(explicit)[0]]


def test_load_and_unload_over_http(explicit: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(explicit.http_address)
    client.load_model("other")
    assert client.is_model_ready("other")
    assert infer(explicit, "other", [1.0]).json()["outputs"][0]["data"] == [3.5]
    client.unload_model("other", unload_dependents=True)
    assert not client.is_model_ready("other")
    assert states(explicit, "other") == {"1": "UNAVAILABLE"}
    r = infer(explicit, "other", [1.0])
    assert r.status_code == 503 and "unloaded" in r.json()["error"]
    status = HTTP.get(f"{explicit.http_url}/v1/models/other").json()
    assert status["model_version_status"][0]["state"] == "END"
    assert (status["name"], status["ready"]) == ("other", False)  # KServe v1: not ready
    client.unload_model("other")  # unloading twice is fine


def test_load_and_unload_over_grpc(explicit: ServerProcess) -> None:
    with triton_grpc.InferenceServerClient(explicit.grpc_address) as client:
        client.load_model("other")
        assert client.is_model_ready("other")
        index_entries = client.get_model_repository_index(as_json=True)["models"]
        assert {"name": "other", "version": "1", "state": "READY"} in index_entries
        client.unload_model("other")
        assert not client.is_model_ready("other")
        with pytest.raises(InferenceServerException) as info:
            client.load_model("nope")
        assert info.value.status() == "StatusCode.NOT_FOUND"
        assert "unknown model 'nope'" in info.value.message()


def test_a_config_override_replaces_the_file(explicit: ServerProcess) -> None:
    override = {**CONFIG, "parameters": {"version_labels": {"string_value": "stable=1"}}}
    client = triton_http.InferenceServerClient(explicit.http_address)
    client.load_model("other", config=json.dumps(override))
    config = HTTP.get(f"{explicit.http_url}/v2/models/other/config").json()
    assert config["max_batch_size"] == 4
    r = infer(explicit, "other", [2.0], path="/labels/stable")
    assert r.json()["model_version"] == "1" and r.json()["outputs"][0]["data"] == [4.0]
    client.load_model("other")  # without the override: the repository's own config again
    assert HTTP.get(f"{explicit.http_url}/v2/models/other/config").json()["max_batch_size"] == 64


def test_a_model_uploaded_in_the_load_call(explicit: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(explicit.http_address)
    files = {"file:1/model.onnx": HALF_PLUS_THREE, "file:2/model.onnx": HALF_PLUS_TWO}
    config = {**CONFIG, "version_policy": {"all": {}}}
    client.load_model("sent", config=json.dumps(config), files=files)
    assert infer(explicit, "sent", [1.0], path="/versions/1").json()["outputs"][0]["data"] == [3.5]
    assert infer(explicit, "sent", [1.0]).json()["model_version"] == "2"
    with triton_grpc.InferenceServerClient(explicit.grpc_address) as grpc_client:
        grpc_client.load_model("sent", config=json.dumps(CONFIG), files=files)
        x = triton_grpc.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
        result = grpc_client.infer("sent", [x])
        assert result.get_response().model_version == "2"  # policy: the latest only
    assert states(explicit, "sent") == {"1": "UNAVAILABLE", "2": "READY"}  # 1: 'unloaded'
    assert not (Path(explicit.repository) / "sent").exists()  # the repository is untouched


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("model", "parameters", "status", "fragment"),
    [
        ("nope", {}, 404, "unknown model 'nope': no such folder"),
        (HPT, {"config": "{not json"}, 400, "parameters.config is not valid JSON"),
        (HPT, {"config": '{"max_batch_size": "many"}'}, 400, "parameters.config"),
        (HPT, {"config": '{"name": "other"}'}, 400, "names model 'other'"),
        (HPT, {"config": '{"no_such_field": 1}'}, 400, "no_such_field"),
        ("new", {"file:1/model.onnx": _b64(HALF_PLUS_TWO)}, 400, "need a 'config' parameter"),
        ("new", {"config": "{}", "file:../../escape": _b64(b"x")}, 400, "leaves its folder"),
        ("new", {"config": "{}", "file:/abs/x": _b64(b"x")}, 400, "absolute path"),
        ("new", {"config": "{}", "file:1/model.onnx": "%%%"}, 400, "not valid base64"),
        ("new", {"config": "{}", "file:1/model.onnx": _b64(b"junk")}, 400, "failed to load"),
        # names the file system cannot hold: the client's doing, a 400 (was a 500 OSError)
        (
            "new",
            {"config": "{}", f"file:1/{'a' * 300}.onnx": _b64(b"x")},
            400,
            f"file parameter 'file:1/{'a' * 78}... (307 characters)': a file or folder name is "
            "too long (at most 255 bytes each)",
        ),
        ("new", {"config": "{}", f"file:{'d' * 300}/m": _b64(b"x")}, 400, "name is too long"),
        ("m" * 300, {}, 404, "unknown model 'mmm"),
    ],
)
def test_bad_loads_are_4xx_and_change_nothing(
    explicit: ServerProcess, model: str, parameters: dict[str, str], status: int, fragment: str
) -> None:
    before = index(explicit)
    r = _post(explicit, f"/models/{model}/load", {"parameters": parameters})
    assert r.status_code == status, r.text
    assert fragment in r.json()["error"]
    after = [e for e in index(explicit) if e["name"] != "new"]
    assert after == [e for e in before if e["name"] != "new"]
    assert infer(explicit, HPT, [1.0]).json()["outputs"][0]["data"] == [2.5]
    assert not (Path(explicit.repository).parent / "escape").exists()


def test_unknown_model_unload_is_404(explicit: ServerProcess) -> None:
    r = _post(explicit, "/models/nope/unload")
    assert r.status_code == 404 and "unknown model 'nope'" in r.json()["error"]


def test_mode_none_refuses_repository_changes(server: ServerProcess) -> None:
    # Mode none with no admin token: the admin API is off altogether (403 / PERMISSION_DENIED).
    r = _post(server, "/models/digits/load")
    assert r.status_code == 403
    assert "the admin API is off" in r.json()["error"]
    r = _post(server, "/models/digits/unload")
    assert r.status_code == 403
    r = HTTP.put(f"{server.http_url}/v2/repository/models/x", content=b"PK\x03\x04")
    assert r.status_code == 403 and "--admin-token" in r.json()["error"]
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        with pytest.raises(InferenceServerException) as info:
            client.unload_model("digits")
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
    assert infer(server, HPT, [1.0]).json()["outputs"][0]["data"] == [2.5]
