"""TensorFlow Serving REST v1 end to end, with the requests users copy from TF Serving's guide."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import numpy as np

from tests.support import ServerProcess


def test_curl_half_plus_two_verbatim(server: ServerProcess) -> None:
    out = subprocess.run(
        [
            "curl",
            "-s",
            "-d",
            '{"instances": [1.0, 2.0, 5.0]}',
            "-X",
            "POST",
            f"{server.http_url}/v1/models/half_plus_two:predict",
        ],
        capture_output=True,
        check=True,
        text=True,
    )
    assert json.loads(out.stdout) == {"predictions": [2.5, 3.0, 4.5]}


def test_predict_versions_and_columnar(server: ServerProcess) -> None:
    url = f"{server.http_url}/v1/models/half_plus_two/versions/1:predict"
    r = httpx.post(
        url, json={"signature_name": "serving_default", "instances": [[1.0], [3.0]]}, timeout=60
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [2.5, 3.5]}  # the model's own shape, as TF Serving
    r = httpx.post(url, json={"inputs": {"x": [0.0, 10.0]}}, timeout=60)
    assert r.json() == {"outputs": [2.0, 7.0]}
    r = httpx.post(url, json={"inputs": [4.0]}, timeout=60)
    assert r.json() == {"outputs": [4.0]}


def test_predict_multi_output_rows(server: ServerProcess, demo_repo: Path) -> None:
    sample = json.loads((demo_repo / "digits" / "sample.json").read_text())
    rows = sample["inputs"][:3]
    r = httpx.post(
        f"{server.http_url}/v1/models/digits:predict",
        json={"instances": [{"input": row} for row in rows]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    predictions = r.json()["predictions"]
    assert len(predictions) == 3
    assert set(predictions[0]) == {"label", "probabilities"}
    labels = [p["label"] for p in predictions]
    assert labels == [int(np.argmax(p["probabilities"])) for p in predictions]
    r = httpx.post(f"{server.http_url}/v1/models/digits:predict", json={"inputs": rows}, timeout=60)
    outputs = r.json()["outputs"]
    assert outputs["label"] == labels


def test_classify_and_regress(server: ServerProcess, demo_repo: Path) -> None:
    sample = json.loads((demo_repo / "digits" / "sample.json").read_text())
    r = httpx.post(
        f"{server.http_url}/v1/models/digits:classify",
        json={"examples": [{"input": sample["inputs"][0]}]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    (result,) = r.json()["results"]
    assert [label for label, _ in result] == [str(i) for i in range(10)]
    assert abs(sum(score for _, score in result) - 1.0) < 1e-5
    r = httpx.post(
        f"{server.http_url}/v1/models/half_plus_two:regress",
        json={"examples": [{"x": 1.0}, {"x": 4.0}]},
        timeout=60,
    )
    assert r.json() == {"results": [2.5, 4.0]}
    r = httpx.post(
        f"{server.http_url}/v1/models/half_plus_two:classify",
        json={"examples": [{"x": 1.0}]},
        timeout=60,
    )
    assert r.status_code == 400
    assert ":classify does not fit" in r.json()["error"]


def test_model_status_and_metadata(server: ServerProcess) -> None:
    r = httpx.get(f"{server.http_url}/v1/models/half_plus_two", timeout=60)
    assert r.json() == {
        "name": "half_plus_two",  # KServe v1's model readiness, beside TF Serving's status
        "ready": True,
        "model_version_status": [
            {
                "version": "1",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ],
    }
    r = httpx.get(f"{server.http_url}/v1/models/half_plus_two/versions/1/metadata", timeout=60)
    meta = r.json()
    assert meta["model_spec"] == {"name": "half_plus_two", "signature_name": "", "version": "1"}
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["inputs"]["x"]["dtype"] == "DT_FLOAT"
    assert sig["inputs"]["x"]["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}]
    assert sig["method_name"] == "tensorflow/serving/predict"


def test_kserve_v1_liveness_and_model_readiness(server: ServerProcess) -> None:
    """As KServe's v1 client asks: GET / is {"status": "alive"} for an API client (a browser
    still goes to the dashboard), and a model's status says whether it is ready."""
    for accept in ({}, {"accept": "application/json"}, {"accept": "*/*"}):
        r = httpx.get(f"{server.http_url}/", headers=accept, timeout=60)
        assert r.status_code == 200 and r.json() == {"status": "alive"}, accept
        assert r.headers["content-type"].startswith("application/json")
    browser = {"accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    r = httpx.get(f"{server.http_url}/", headers=browser, timeout=60)
    assert r.status_code == 302 and r.headers["location"] == "/dashboard/"
    assert "accept" in r.headers["vary"]
    ready = httpx.get(f"{server.http_url}/v1/models/half_plus_two/versions/1", timeout=60).json()
    assert (ready["name"], ready["ready"]) == ("half_plus_two", True)
    assert httpx.get(f"{server.http_url}/v1/models/nope", timeout=60).status_code == 404


def test_bad_tfserving_requests(server: ServerProcess) -> None:
    base = f"{server.http_url}/v1/models"
    cases = [
        (f"{base}/half_plus_two:predict", b"{not json", 400, "malformed JSON"),
        (f"{base}/half_plus_two:predict", b'{"instances": []}', 400, "non-empty list"),
        (f"{base}/half_plus_two:predict", b'{"instances": ["a"]}', 400, "DT_FLOAT"),
        (f"{base}/half_plus_two:predict", b'{"instances": [1], "inputs": [1]}', 400, "exactly one"),
        (f"{base}/nope:predict", b'{"instances": [1.0]}', 404, "unknown model: 'nope' is not"),
        (
            f"{base}/half_plus_two/versions/9:predict",
            b'{"instances": [1.0]}',
            404,
            "version 9 is not found",
        ),
        (f"{base}/half_plus_two/labels/stable:predict", b'{"instances": [1.0]}', 404, "label"),
        (
            f"{base}/half_plus_two:predict",
            b'{"signature_name": "other", "instances": [1.0]}',
            400,
            "signature_name",
        ),
        (f"{base}/digits:predict", b'{"instances": [{"inputz": [1]}]}', 400, "unknown input"),
    ]
    for url, body, status, fragment in cases:
        r = httpx.post(url, content=body, timeout=60)
        assert r.status_code == status, (url, body, r.text)
        assert fragment in r.json()["error"], (url, body, r.text)
    assert httpx.get(f"{base}/half_plus_two", timeout=60).status_code == 200
