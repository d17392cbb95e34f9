"""No code execution from the network: a malicious pickle through every entry point.

The pickle's payload creates a marker file when unpickled. Sent through the load API's
``file:`` entries (HTTP and gRPC), an archive upload, ``inferd repo push`` and an S3 bucket a
polling server follows, it never runs, and the answer says why (``--allow-pickle``). A pickle
present at start loads; ``--allow-pickle always`` with an admin token lets admins send one.
Python models follow ``--allow-python-models`` the same way, in worker processes too.
Config paths stay in the model folder; TensorFlow graphs that read files are refused.
"""

from __future__ import annotations

import base64
import builtins
import json
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from inferd.app.repo_cli import pack
from tests.e2e.lifecycle_support import HTTP, index
from tests.e2e.s3_support import CREDENTIALS, MotoServer
from tests.support import ServerProcess, wait_for

pytest.importorskip("joblib")

SKLEARN = {"backend": "sklearn", "max_batch_size": 8}


class Payload:
    """Unpickling this creates ``path`` (a harmless stand-in for any code)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (builtins.open, (str(self.path), "w"))


def evil_pickle(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker))


def model_folder(root: Path, name: str, marker: Path, config: str = 'backend: "sklearn"\n') -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.joblib").write_bytes(evil_pickle(marker))
    (folder / "config.pbtxt").write_text(config)
    return folder


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("code") / "models"
    root.mkdir()
    server = ServerProcess(root, extra_args=["--model-control-mode", "explicit"]).start()
    yield server
    server.stop()


def _refused(text: str) -> None:
    assert "is a pickle" in text and "--allow-pickle" in text, text


def test_load_api_file_entries_over_http(explicit: ServerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "ran-http"
    body = {
        "parameters": {
            "config": json.dumps(SKLEARN),
            "file:1/model.joblib": base64.b64encode(evil_pickle(marker)).decode(),
        }
    }
    r = HTTP.post(f"{explicit.http_url}/v2/repository/models/evil/load", json=body)
    assert r.status_code == 400
    _refused(r.json()["error"])
    assert "sent through the repository API" in r.json()["error"]
    assert not marker.exists()


def test_load_api_file_entries_over_grpc(explicit: ServerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "ran-grpc"
    with (
        triton_grpc.InferenceServerClient(explicit.grpc_address) as client,
        pytest.raises(InferenceServerException) as info,
    ):
        client.load_model(
            "evil_grpc",
            config=json.dumps(SKLEARN),
            files={"file:1/model.joblib": evil_pickle(marker)},
        )
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    _refused(info.value.message())
    assert not marker.exists()


def test_archive_upload(explicit: ServerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "ran-upload"
    archive = pack(model_folder(tmp_path, "evil_up", marker))
    r = HTTP.put(
        f"{explicit.http_url}/v2/repository/models/evil_up",
        content=archive,
        headers={"content-type": "application/gzip"},
    )
    assert r.status_code == 400
    _refused(r.json()["error"])
    assert not marker.exists()
    assert not (explicit.repository / "evil_up").exists()  # the repository is as it was


def test_inferd_repo_push(explicit: ServerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "ran-push"
    folder = model_folder(tmp_path, "evil_push", marker)
    done = subprocess.run(
        [sys.executable, "-m", "inferd", "repo", "push", str(folder), "--url", explicit.http_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    _refused(done.stderr)
    assert not marker.exists()


PYTHON_CONFIG = """backend: "python"
max_batch_size: 8
input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]
"""


def python_model(marker: Path) -> str:
    """A native Python model that creates ``marker`` as soon as it is imported."""
    return (
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n\n\n"
        "class Model:\n    def infer(self, inputs):\n        return {'Y': inputs['X'] * 2}\n"
    )


def python_folder(root: Path, name: str, marker: Path, config: str = PYTHON_CONFIG) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(python_model(marker))
    (folder / "config.pbtxt").write_text(config)
    return folder


def test_a_python_model_sent_through_the_api_does_not_run(
    explicit: ServerProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "ran-python"
    # No inputs in the config: completing it would run the model's code; refused before that.
    body = {
        "parameters": {
            "config": json.dumps({"backend": "python"}),
            "file:1/model.py": base64.b64encode(python_model(marker).encode()).decode(),
        }
    }
    r = HTTP.post(f"{explicit.http_url}/v2/repository/models/evil_py/load", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert "model.py is a Python model" in error and "--allow-python-models" in error, error
    assert "sent through the repository API" in error
    r = HTTP.put(
        f"{explicit.http_url}/v2/repository/models/evil_py_up",
        content=pack(python_folder(tmp_path, "evil_py_up", marker)),
        headers={"content-type": "application/gzip"},
    )
    assert r.status_code == 400 and "--allow-python-models" in r.json()["error"]
    assert not (explicit.repository / "evil_py_up").exists()
    assert not marker.exists()


def test_the_operators_own_code_runs_in_worker_processes(tmp_path: Path) -> None:
    """By default (startup) the models present at start run: a Python model, and a pickle
    loaded in a worker process (process_instances), which gets the grants with its recipe.
    ``--allow-python-models never`` refuses the Python model before any of its code runs."""
    sklearn = pytest.importorskip("sklearn.linear_model")
    import joblib

    root = tmp_path / "models"
    started = tmp_path / "ran-at-start"
    python_folder(root, "py_start", started)
    (root / "sk_proc" / "1").mkdir(parents=True)
    estimator = sklearn.LinearRegression().fit([[0.0], [1.0]], [1.0, 3.0])  # y = 2x + 1
    joblib.dump(estimator, root / "sk_proc" / "1" / "model.joblib")
    (root / "sk_proc" / "config.pbtxt").write_text(
        'backend: "sklearn"\nmax_batch_size: 8\n'
        'parameters { key: "process_instances" value: { string_value: "true" } }\n'
    )
    server = ServerProcess(root).start(timeout_s=180)
    try:
        x = {"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [1.5]}
        r = HTTP.post(f"{server.http_url}/v2/models/py_start/infer", json={"inputs": [x]})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [3.0]
        assert started.exists()
        x = {"name": "input", "shape": [1, 1], "datatype": "FP32", "data": [2.0]}
        r = HTTP.post(f"{server.http_url}/v2/models/sk_proc/infer", json={"inputs": [x]})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == pytest.approx([5.0])
    finally:
        server.stop()
    started.unlink()
    server = ServerProcess(
        root, extra_args=["--allow-python-models", "never", "--strict-readiness=false"]
    ).start(timeout_s=180)
    try:
        (entry,) = [e for e in index(server) if e["name"] == "py_start"]
        assert entry["state"] == "UNAVAILABLE"
        assert "--allow-python-models never" in entry["reason"], entry
        assert not started.exists()
    finally:
        server.stop()


def test_config_paths_stay_in_the_model_folder(explicit: ServerProcess, tmp_path: Path) -> None:
    folder = model_folder(
        tmp_path, "escape", tmp_path / "unused", 'default_model_filename: "../../../etc/passwd"\n'
    )
    r = HTTP.put(
        f"{explicit.http_url}/v2/repository/models/escape",
        content=pack(folder),
        headers={"content-type": "application/gzip"},
    )
    assert r.status_code == 400
    assert "default_model_filename" in r.json()["error"]
    assert "leaves its folder" in r.json()["error"]


def test_a_simple_cross_site_request_cannot_load(explicit: ServerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "ran-csrf"
    body = json.dumps(
        {
            "parameters": {
                "config": json.dumps(SKLEARN),
                "file:1/model.joblib": base64.b64encode(evil_pickle(marker)).decode(),
            }
        }
    )
    url = f"{explicit.http_url}/v2/repository/models/csrf/load"
    r = HTTP.post(url, content=body, headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "text/plain" in r.json()["error"]
    r = HTTP.post(url, content=body, headers={"origin": "http://evil.example"})
    assert r.status_code == 403 and "--cors-allow-origin" in r.json()["error"]
    assert not marker.exists()


def test_an_admin_may_send_code_when_the_operator_says_so(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    args = ["--model-control-mode", "explicit", "--allow-pickle", "--admin-token", "root-secret"]
    server = ServerProcess(root, extra_args=args).start()
    try:
        marker = tmp_path / "ran-allowed"
        body = {
            "parameters": {
                "config": json.dumps(SKLEARN),
                "file:1/model.joblib": base64.b64encode(evil_pickle(marker)).decode(),
            }
        }
        url = f"{server.http_url}/v2/repository/models/allowed/load"
        assert HTTP.post(url, json=body).status_code == 401
        assert not marker.exists()
        r = HTTP.post(url, json=body, headers={"authorization": "Bearer root-secret"})
        # The pickle ran (the operator allowed it); it is no estimator, so the load fails.
        assert marker.exists()
        assert r.status_code == 400 and "has no predict()" in r.json()["error"]
    finally:
        server.stop()


def test_a_pickle_arriving_by_s3_poll_does_not_run(tmp_path: Path) -> None:
    moto = MotoServer().start()
    try:
        s3 = moto.client()
        s3.create_bucket(Bucket="models")
        start_marker = tmp_path / "ran-at-start"
        s3.put_object(Bucket="models", Key="m/early/1/model.joblib", Body=evil_pickle(start_marker))
        server = ServerProcess(
            Path("unused"),
            extra_args=[
                "--s3-endpoint-url",
                moto.url,
                "--model-control-mode",
                "poll",
                "--repository-poll-secs",
                "1",
                "--model-cache-dir",
                str(tmp_path / "cache"),
            ],
            env=dict(CREDENTIALS),
            log_path=tmp_path / "server.log",
        )
        server.repository = "s3://models/m"  # type: ignore[assignment]  # a URI, not a folder
        server.start(until="/v2/health/live")  # 'early' is no model (strict readiness)
        try:
            # Present at start: the operator's own file, loaded (--allow-pickle startup).
            wait_for(start_marker.exists, "the start-up load")  # the server is live before
            assert start_marker.exists()
            marker = tmp_path / "ran-by-poll"
            s3.put_object(Bucket="models", Key="m/late/1/model.joblib", Body=evil_pickle(marker))

            def late_reason() -> str:
                return next((e["reason"] for e in index(server) if e["name"] == "late"), "")

            wait_for(lambda: "--allow-pickle" in late_reason(), "the poll to refuse it")
            assert "arrived in the repository after start" in late_reason()
            assert not marker.exists()
        finally:
            server.stop()
    finally:
        moto.stop()


def test_tensorflow_graph_reading_files_is_refused(explicit: ServerProcess, tmp_path: Path) -> None:
    tf: Any = pytest.importorskip("tensorflow")

    class ReadsFiles(tf.Module):  # type: ignore[misc]
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])  # type: ignore[untyped-decorator]
        def serve(self, x: Any) -> Any:
            secret = tf.io.read_file("/etc/hostname")
            return {"y": x + tf.cast(tf.strings.length(secret), tf.float32)}

    folder = tmp_path / "reader"
    module = ReadsFiles()
    tf.saved_model.save(module, str(folder / "1" / "model.savedmodel"), signatures=module.serve)
    r = HTTP.put(
        f"{explicit.http_url}/v2/repository/models/reader",
        content=pack(folder),
        headers={"content-type": "application/gzip"},
        timeout=120,
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert "ReadFile" in error and "--allow-unsafe-ops" in error, error


def test_health_of_the_refusing_server(explicit: ServerProcess) -> None:
    assert httpx.get(f"{explicit.http_url}/v2/health/ready", timeout=60).status_code == 200
