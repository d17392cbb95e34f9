"""inferd started as deploy/kserve's ClusterServingRuntime starts it, on a folder laid out as
KServe's storage initializer lays out /mnt/models (the storageUri's objects under it, paths
kept): the probes' routes answer, and the models answer on every protocol the runtime lists
(v1, v2, grpc-v2), a joblib pickle included (present at start, so allowed by default). And with
an example InferenceService's args after the runtime's, as KServe appends them: one model's
files directly in /mnt/models, as KServe's scikit-learn server takes them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from inferd.demo.models import write_demo_repository
from tests.manifests import DEPLOY
from tests.support import ServerProcess

pytest.importorskip("sklearn")
import joblib
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

RUNTIME = DEPLOY / "kserve" / "inferd-runtime.yaml"
EXAMPLES = DEPLOY / "kserve" / "examples"
TIMEOUT_S = 60.0


def _container() -> dict[str, Any]:
    (runtime,) = [d for d in yaml.safe_load_all(RUNTIME.read_text()) if d]
    (container,) = runtime["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def runtime_args(mnt_models: Path, pod_name: str) -> list[str]:
    """The runtime's args as the pod runs them, with the test's folder for /mnt/models and
    $(POD_NAME) expanded; the ports are the harness's (free ones)."""
    args = []
    for arg in _container()["args"]:
        if arg.startswith(("--http-port=", "--grpc-port=")):
            continue
        arg = arg.replace("=/mnt/models", f"={mnt_models}")
        args.append(arg.replace("$(POD_NAME)", pod_name))
    return args


@pytest.fixture(scope="module")
def iris() -> tuple[np.ndarray, LogisticRegression]:
    x, y = load_iris(return_X_y=True)
    return x.astype(np.float32), LogisticRegression(max_iter=500).fit(x.astype(np.float32), y)


@pytest.fixture(scope="module")
def pod(
    tmp_path_factory: pytest.TempPathFactory, iris: tuple[np.ndarray, LogisticRegression]
) -> Iterator[ServerProcess]:
    # s3://models/onnx/half_plus_two/1/model.onnx and s3://models/sklearn/iris/1/model.joblib,
    # as two storageUris would bring them: here one folder holding both.
    mnt_models = tmp_path_factory.mktemp("kserve") / "mnt" / "models"
    write_demo_repository(mnt_models, models=["half_plus_two"])
    (mnt_models / "iris" / "1").mkdir(parents=True)
    joblib.dump(iris[1], mnt_models / "iris" / "1" / "model.joblib")
    env = {e["name"]: e["value"] for e in _container()["env"] if "value" in e}
    args = [*runtime_args(mnt_models, "iris-predictor-0"), "--http-workers", "3"]
    server = ServerProcess(mnt_models, args, env=env, repository_flag=False)
    server.start(timeout_s=120, until=_container()["readinessProbe"]["httpGet"]["path"])
    yield server
    server.stop()


def test_the_probes_answer_and_the_log_is_json(pod: ServerProcess) -> None:
    for probe in ("readinessProbe", "livenessProbe"):
        path = _container()[probe]["httpGet"]["path"]
        assert httpx.get(f"{pod.http_url}{path}", timeout=TIMEOUT_S).status_code == 200
    ready = [json.loads(line) for line in pod.log().splitlines() if "server ready" in line]
    assert ready[0]["message"] == "server ready; models ready: half_plus_two, iris"


def test_v2_and_v1_answer(pod: ServerProcess, iris: tuple[np.ndarray, LogisticRegression]) -> None:
    body = {"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [1.0, 4.0]}]}
    answer = httpx.post(
        f"{pod.http_url}/v2/models/half_plus_two/infer", json=body, timeout=TIMEOUT_S
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [2.5, 4.0]
    x, model = iris
    rows = x[[0, 60, 120]]
    predicted = httpx.post(
        f"{pod.http_url}/v1/models/iris:predict",
        json={"instances": rows.tolist()},
        timeout=TIMEOUT_S,
    )
    assert predicted.status_code == 200, predicted.text
    labels = [p["label"] for p in predicted.json()["predictions"]]
    assert labels == model.predict(rows).tolist()
    # what KServe's Prometheus aggregation scrapes (the runtime's prometheus.kserve.io/path)
    metrics = httpx.get(f"{pod.http_url}/metrics", timeout=TIMEOUT_S).text
    assert 'inferd_request_success_total{model="iris",version="1"} 1.0' in metrics


def test_grpc_v2_answers(pod: ServerProcess) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(pod.grpc_address)
    try:
        assert client.is_server_ready()
        data = np.array([[3.0]], dtype=np.float32)
        tensor = grpcclient.InferInput("x", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer("half_plus_two", [tensor], client_timeout=TIMEOUT_S)
        assert result.as_numpy("y").tolist() == [[3.5]]
    finally:
        client.close()


@pytest.fixture(scope="module")
def single(
    tmp_path_factory: pytest.TempPathFactory, iris: tuple[np.ndarray, LogisticRegression]
) -> Iterator[ServerProcess]:
    # s3://models/sklearn/iris/model.joblib, the storageUri of examples/sklearn.yaml
    mnt_models = tmp_path_factory.mktemp("kserve-single") / "mnt" / "models"
    mnt_models.mkdir(parents=True)
    joblib.dump(iris[1], mnt_models / "model.joblib")
    (isvc,) = [d for d in yaml.safe_load_all((EXAMPLES / "sklearn.yaml").read_text()) if d]
    args = [
        *runtime_args(mnt_models, "iris-predictor-0"),
        *isvc["spec"]["predictor"]["model"]["args"],
    ]
    server = ServerProcess(mnt_models, [*args, "--http-workers", "3"], repository_flag=False)
    server.start(timeout_s=120)
    yield server
    server.stop()


def test_one_models_files_serve_under_the_inference_services_name(
    single: ServerProcess, iris: tuple[np.ndarray, LogisticRegression]
) -> None:
    index = httpx.post(f"{single.http_url}/v2/repository/index", timeout=TIMEOUT_S).json()
    assert index == [{"name": "iris", "version": "1", "state": "READY", "reason": ""}]
    x, model = iris
    rows = x[[0, 60, 120]]
    predicted = httpx.post(
        f"{single.http_url}/v1/models/iris:predict",
        json={"instances": rows.tolist()},
        timeout=TIMEOUT_S,
    )
    assert predicted.status_code == 200, predicted.text
    assert [p["label"] for p in predicted.json()["predictions"]] == model.predict(rows).tolist()
    missing = httpx.get(f"{single.http_url}/v2/models/model", timeout=TIMEOUT_S)
    assert missing.status_code == 404
