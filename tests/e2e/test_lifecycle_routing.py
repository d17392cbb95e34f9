"""Version labels, canary split and shadow copies, end to end over v2 HTTP, TF Serving and gRPC.

Version 1 is y = 0.5x + 2 and version 2 is y = 0.5x + 3, so every answer says which version
computed it (and ``model_version`` says so too).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from inferd.protocols.tfserving import serving_pb2, serving_pb2_grpc, tensorflow_pb2
from tests.e2e.lifecycle_support import (
    HALF_PLUS_THREE,
    HTTP,
    infer,
    write_version,
)
from tests.support import ServerProcess, wait_for

M = "canary"
CONFIG = """version_policy { all {} }
parameters { key: "version_labels" value: { string_value: "stable=1,canary=2" } }
parameters { key: "traffic_split" value: { string_value: "stable=90,canary=10" } }
"""


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("routing") / "models"
    write_version(root / M, 1)
    write_version(root / M, 2, HALF_PLUS_THREE)
    (root / M / "config.pbtxt").write_text(CONFIG)
    server = ServerProcess(
        root, extra_args=["--model-control-mode", "explicit", "--load-model", "*"]
    )
    server.start()
    yield server
    server.stop()


def _routing(server: ServerProcess, **change: Any) -> dict[str, Any]:
    if change:
        r = HTTP.post(f"{server.http_url}/v2/repository/models/{M}/routing", json=change)
    else:
        r = HTTP.get(f"{server.http_url}/v2/models/{M}/routing")
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _version(r: Any) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["model_version"])


def test_labels_from_config_route_every_protocol(routed: ServerProcess) -> None:
    assert infer(routed, M, [1.0], path="/labels/stable").json()["outputs"][0]["data"] == [2.5]
    assert _version(infer(routed, M, [1.0], path="/labels/canary")) == "2"
    assert _version(infer(routed, M, [1.0], parameters={"version_label": "canary"})) == "2"
    tf = HTTP.post(
        f"{routed.http_url}/v1/models/{M}/labels/canary:predict", json={"instances": [1.0]}
    )
    assert tf.json() == {"predictions": [3.5]}
    status = HTTP.get(f"{routed.http_url}/v1/models/{M}/labels/stable").json()
    assert [s["version"] for s in status["model_version_status"]] == ["1"]
    meta = HTTP.get(f"{routed.http_url}/v2/models/{M}/labels/canary").json()
    assert meta["name"] == M
    with triton_grpc.InferenceServerClient(routed.grpc_address) as client:
        x = triton_grpc.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
        result = client.infer(M, [x], parameters={"version_label": "stable"})
        assert result.as_numpy("y").tolist() == [[2.5]]
    r = infer(routed, M, [1.0], path="/labels/beta")
    assert r.status_code == 404 and "no version label 'beta'" in r.json()["error"]
    r = HTTP.post(f"{routed.http_url}/v1/models/{M}/labels/beta:predict", json={"instances": [1]})
    assert r.status_code == 404


def test_the_canary_split_holds_over_many_requests(routed: ServerProcess) -> None:
    counts = Counter(_version(infer(routed, M, [1.0], id=uuid.uuid4().hex)) for _ in range(1000))
    assert counts["1"] + counts["2"] == 1000
    assert 850 <= counts["1"] <= 950, counts  # 90 % within a generous tolerance
    sticky = {_version(infer(routed, M, [1.0], id="customer-7")) for _ in range(50)}
    assert len(sticky) == 1
    tf = Counter(
        str(HTTP.post(f"{routed.http_url}/v1/models/{M}:predict", json={"instances": [1.0]}).json())
        for _ in range(200)
    )
    assert set(tf) == {"{'predictions': [2.5]}", "{'predictions': [3.5]}"}
    assert infer(routed, M, [1.0], path="/versions/2").json()["model_version"] == "2"


def test_labels_and_split_change_over_the_api(routed: ServerProcess) -> None:
    url = f"{routed.http_url}/v2/repository/models/{M}/labels"
    r = HTTP.post(url, json={"labels": {"canary": 1, "next": 2}})
    assert r.status_code == 200 and r.json()["labels"] == {"canary": 1, "next": 2, "stable": 1}
    assert _version(infer(routed, M, [1.0], path="/labels/canary")) == "1"
    r = HTTP.post(url, json={"labels": {"next": None, "canary": 2}})
    assert r.json()["labels"] == {"canary": 2, "stable": 1}
    r = HTTP.post(url, json={"labels": {"canary": 9}})
    assert r.status_code == 400 and "version 9 of model 'canary' is not ready" in r.json()["error"]
    r = HTTP.post(url, json={"labels": {"1st": 1}})
    assert r.status_code == 400 and "must start with a letter" in r.json()["error"]

    assert _routing(routed, traffic_split={"canary": 100})["traffic_split"] == {"canary": 100.0}
    assert {_version(infer(routed, M, [1.0], id=str(i))) for i in range(20)} == {"2"}
    r = HTTP.post(
        f"{routed.http_url}/v2/repository/models/{M}/routing", json={"traffic_split": {"1": -1}}
    )
    assert r.status_code == 400 and "must be a number >= 0" in r.json()["error"]
    assert _routing(routed, traffic_split=None)["traffic_split"] == {}
    assert {_version(infer(routed, M, [1.0], id=str(i))) for i in range(20)} == {"2"}  # latest
    assert _routing(routed, traffic_split={"stable": 90, "canary": 10})["labels"]["stable"] == 1


def test_shadow_copies_count_agreement_and_never_answer(routed: ServerProcess) -> None:
    # Version 2 answers 1.0 more than version 1: it disagrees exactly, agrees within 1.5.
    for tolerance, field in ((0.0, "disagreed"), (1.5, "agreed")):
        shadow = {"version": 2, "fraction": 1.0, "tolerance": tolerance}
        assert _routing(routed, shadow=shadow)["shadow_stats"]["sent"] == 0
        for value in range(10):
            r = infer(routed, M, [float(value)], path="/versions/1")
            assert r.json()["outputs"][0]["data"] == [value / 2 + 2]  # the primary's answer

        def counted(field: str = field) -> dict[str, Any] | None:
            stats: dict[str, Any] = _routing(routed)["shadow_stats"]
            return stats if stats[field] == 10 else None

        stats = wait_for(counted, f"10 shadow answers {field}")
        assert stats["sent"] == 10 and stats["failed"] == 0 and stats["max_abs_diff"] == 1.0
        assert stats["agreed" if field == "disagreed" else "disagreed"] == 0
    second = HTTP.get(f"{routed.http_url}/v2/models/{M}/versions/2/stats").json()
    assert second["model_stats"][0]["inference_stats"]["success"]["count"] >= 20
    routed_doc = _routing(routed, shadow=None)
    assert routed_doc["shadow"] is None
    assert "shadow v2 of model 'canary'" in routed.log()


def test_config_parameters_that_do_not_parse_fail_the_load(
    routed: ServerProcess, tmp_path: Path
) -> None:
    r = HTTP.post(
        f"{routed.http_url}/v2/repository/models/{M}/load",
        json={"parameters": {"config": '{"parameters": {"traffic_split": {"string_value": "1"}}}'}},
    )
    assert r.status_code == 400
    assert "parameters: traffic_split: '1' is not KEY=VALUE" in r.json()["error"]
    assert _version(infer(routed, M, [1.0], path="/labels/stable")) == "1"  # still serving


def test_tf_serving_grpc_labels_and_split(routed: ServerProcess) -> None:
    with grpc.insecure_channel(routed.grpc_address) as channel:
        stub = serving_pb2_grpc.PredictionServiceStub(channel)  # type: ignore[no-untyped-call]

        def predict(label: str = "") -> float:
            request = serving_pb2.PredictRequest()
            request.model_spec.name = M
            if label:
                request.model_spec.version_label = label
            tensor = request.inputs["x"]
            tensor.dtype = tensorflow_pb2.DT_FLOAT
            tensor.tensor_shape.dim.add().size = 1
            tensor.float_val.append(1.0)
            y = stub.Predict(request, 10.0).outputs["y"]
            values = y.float_val or np.frombuffer(y.tensor_content, dtype=np.float32)
            return float(values[0])

        assert predict("stable") == 2.5 and predict("canary") == 3.5
        assert {predict() for _ in range(100)} == {2.5, 3.5}  # the 90/10 split
        with pytest.raises(grpc.RpcError) as info:
            predict("beta")
        assert info.value.code() is grpc.StatusCode.NOT_FOUND


@pytest.fixture(scope="module")
def workers3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The layout ``inferd serve`` runs by default: a model host and two frontends, each with
    a copy of this small model (each makes the shadow copies of the requests it runs)."""
    root = tmp_path_factory.mktemp("routing3") / "models"
    write_version(root / M, 1)
    write_version(root / M, 2, HALF_PLUS_THREE)
    (root / M / "config.pbtxt").write_text(CONFIG)
    args = ["--model-control-mode", "explicit", "--load-model", "*", "--http-workers", "3"]
    server = ServerProcess(root, extra_args=args)
    server.start()
    yield server
    server.stop()


def test_shadow_counts_are_the_servers_whichever_worker_answers(workers3: ServerProcess) -> None:
    base = workers3.http_url
    shadow = {"version": 2, "fraction": 1.0, "tolerance": 1.5}
    assert _routing(workers3, shadow=shadow)["shadow_stats"]["sent"] == 0
    sent = 12
    for value in range(sent):  # a connection each: the kernel spreads them over the workers
        body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}
        r = httpx.post(f"{base}/v2/models/{M}/versions/1/infer", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [value / 2 + 2]

    def stats_once() -> dict[str, Any]:
        r = httpx.get(f"{base}/v2/models/{M}/routing", timeout=30)  # a fresh connection
        assert r.status_code == 200, r.text
        found: dict[str, Any] = r.json()["shadow_stats"]
        return found

    def counted() -> dict[str, Any] | None:
        stats = stats_once()
        return stats if stats["agreed"] == sent else None

    wait_for(counted, f"{sent} shadow answers agreed, server-wide")
    expected = {"sent": sent, "agreed": sent, "disagreed": 0, "failed": 0, "skipped": 0}
    for _ in range(9):  # whichever worker each connection reaches
        stats = stats_once()
        assert {k: stats[k] for k in expected} == expected and stats["max_abs_diff"] == 1.0
        models = httpx.get(f"{base}/v2/dashboard/models", timeout=30).json()["models"]
        row = next(m for m in models if m["name"] == M)
        assert row["routing"]["shadow_stats"]["sent"] == sent
        assert row["routing"]["shadow_stats"]["agreed"] == sent
    cleared = _routing(workers3, shadow=None)
    assert cleared["shadow"] is None and cleared["shadow_stats"]["sent"] == 0
