"""Files sent through the network keep that origin: a later load never runs them as code.

An upload that loads as ONNX but also carries a Python model and a pickle (``1/model.py``,
``1/model.joblib``, and ``2/model.py`` in a version its config does not serve) is accepted:
nothing of it runs. A later load call whose ``config`` parameter turns the model into a Python
or scikit-learn model must not run those files either, even with ``--allow-python-models
always`` and ``--allow-pickle always``: running code sent through the API needs an admin token.
The origin is kept in the model folder (``.inferd-provenance.json``), so it holds after a
restart of the server, through an S3 bucket to another server, and for a TorchServe archive
downloaded from a URL; a file the operator rewrites on disk is the operator's again. Servers
run the default layout (a model host and two frontends: ``--http-workers 3``).
"""

from __future__ import annotations

import functools
import io
import json
import re
import tarfile
import threading
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path

import httpx
import pytest

from tests.e2e.lifecycle_support import HALF_PLUS_TWO, HTTP, index, infer
from tests.e2e.s3_support import CREDENTIALS, MotoServer
from tests.e2e.test_security_code import evil_pickle, python_model
from tests.e2e.torchserve_support import Ports, torchserve_store
from tests.support import ServerProcess

__all__ = ["torchserve_store"]

pytest.importorskip("joblib")

PROVENANCE_FILE = ".inferd-provenance.json"
ALWAYS = ["--allow-python-models", "always", "--allow-pickle", "always"]
LAYOUT = ["--model-control-mode", "explicit", "--http-workers", "3"]
# The upload's own config: ONNX, version 1 only (version 2 holds nothing but a model.py).
ONNX_CONFIG = b'backend: "onnxruntime"\nversion_policy: { specific: { versions: [1] } }\n'
TENSOR = {"data_type": "TYPE_FP32", "dims": [1]}
PYTHON = {
    "backend": "python",
    "max_batch_size": 8,
    "input": [{"name": "X", **TENSOR}],
    "output": [{"name": "Y", **TENSOR}],
}
# The attacks: only a ``config`` parameter, no files.
AS_PYTHON = {**PYTHON, "version_policy": {"all": {}}}
AS_SKLEARN = {
    "backend": "sklearn",
    "max_batch_size": 8,
    "version_policy": {"specific": {"versions": [1]}},
}
# The same in a model process: the grants travel with the worker's recipe.
IN_PROCESS = {**AS_SKLEARN, "parameters": {"process_instances": {"string_value": "true"}}}
# Long enough for a load with three serving processes on a busy host.
LONG = httpx.Timeout(120.0)


def archive(markers: Path) -> bytes:
    """The upload: a real ONNX model, and code that writes a marker file when it runs."""
    files = {
        "config.pbtxt": ONNX_CONFIG,
        "1/model.onnx": HALF_PLUS_TWO,
        "1/model.py": python_model(markers / "ran-python-1").encode(),
        "1/model.joblib": evil_pickle(markers / "ran-pickle"),
        "2/model.py": python_model(markers / "ran-python-2").encode(),
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def server(root: Path, *extra: str) -> ServerProcess:
    return ServerProcess(root, extra_args=[*LAYOUT, *ALWAYS, *extra]).start(timeout_s=180)


def upload(srv: ServerProcess, name: str, markers: Path, token: str = "") -> None:
    headers = {"content-type": "application/gzip"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    url = f"{srv.http_url}/v2/repository/models/{name}"
    r = HTTP.put(url, content=archive(markers), headers=headers, timeout=LONG)
    assert r.status_code == 200, r.text
    r = infer(srv, name, [4.0])
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [4.0]  # 0.5 * 4 + 2: the ONNX model serves


def load(
    srv: ServerProcess, name: str, config: dict[str, object], token: str = ""
) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    url = f"{srv.http_url}/v2/repository/models/{name}/load"
    body = {"parameters": {"config": json.dumps(config)}}
    return HTTP.post(url, json=body, headers=headers, timeout=LONG)


def no_marker(markers: Path) -> None:
    assert sorted(p.name for p in markers.iterdir()) == [], "uploaded code ran"


def refused_python(r: httpx.Response) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "model.py is a Python model" in error, error
    assert "sent through the repository API" in error, error
    assert "--admin-token" in error and "--allow-python-models" in error, error


def refused_pickle(r: httpx.Response) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "model.joblib is a pickle" in error, error
    assert "sent through the repository API" in error, error
    assert "--admin-token" in error and "--allow-pickle" in error, error


def still_onnx(srv: ServerProcess, name: str) -> None:
    r = infer(srv, name, [2.0])
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [3.0]


def test_a_config_override_does_not_run_uploaded_code(tmp_path: Path) -> None:
    root, markers = tmp_path / "models", tmp_path / "markers"
    root.mkdir()
    markers.mkdir()
    srv = server(root)
    try:
        upload(srv, "trojan", markers)
        no_marker(markers)
        refused_python(load(srv, "trojan", AS_PYTHON))
        refused_pickle(load(srv, "trojan", AS_SKLEARN))
        refused_pickle(load(srv, "trojan", IN_PROCESS))
        no_marker(markers)
        still_onnx(srv, "trojan")  # the refused loads left the serving version alone
        record = json.loads((root / "trojan" / PROVENANCE_FILE).read_text())
        assert {"1/model.py", "1/model.joblib", "2/model.py"} <= set(record["files"])
    finally:
        srv.stop()


def test_the_origin_survives_a_restart(tmp_path: Path) -> None:
    root, markers = tmp_path / "models", tmp_path / "markers"
    root.mkdir()
    markers.mkdir()
    srv = server(root)
    try:
        upload(srv, "trojan", markers)
    finally:
        srv.stop()
    # The model's files are now in the repository at start: they are still the network's.
    srv = server(root, "--load-model", "trojan")
    try:
        still_onnx(srv, "trojan")
        refused_python(load(srv, "trojan", AS_PYTHON))
        refused_pickle(load(srv, "trojan", AS_SKLEARN))
        no_marker(markers)
    finally:
        srv.stop()


def test_a_file_the_operator_rewrites_is_the_operators(tmp_path: Path) -> None:
    sklearn = pytest.importorskip("sklearn.linear_model")
    import joblib

    root, markers = tmp_path / "models", tmp_path / "markers"
    root.mkdir()
    markers.mkdir()
    srv = server(root)
    try:
        upload(srv, "trojan", markers)
        folder = root / "trojan"
        # The operator replaces the pickle with one of their own: it loads.
        estimator = sklearn.LinearRegression().fit([[0.0], [1.0]], [1.0, 3.0])  # y = 2x + 1
        joblib.dump(estimator, folder / "1" / "model.joblib")
        r = load(srv, "trojan", AS_SKLEARN)
        assert r.status_code == 200, r.text
        x = {"name": "input", "shape": [1, 1], "datatype": "FP32", "data": [2.0]}
        r = HTTP.post(f"{srv.http_url}/v2/models/trojan/infer", json={"inputs": [x]})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == pytest.approx([5.0])
        # A Python model can import or read any file of its model: the uploaded ones that
        # are left still make it the network's.
        refused_python(load(srv, "trojan", AS_PYTHON))
        no_marker(markers)
        # Deleting the record is the operator's word that the files are theirs.
        (folder / PROVENANCE_FILE).unlink()
        r = load(srv, "trojan", AS_PYTHON)
        assert r.status_code == 200, r.text
        assert (markers / "ran-python-1").exists() and (markers / "ran-python-2").exists()
    finally:
        srv.stop()


def test_an_admin_may_still_send_code(tmp_path: Path) -> None:
    root, markers = tmp_path / "models", tmp_path / "markers"
    root.mkdir()
    markers.mkdir()
    srv = server(root, "--admin-token", "root-secret")
    try:
        upload(srv, "sent", markers, token="root-secret")
        no_marker(markers)  # the upload loaded as ONNX: nothing ran
        assert load(srv, "sent", AS_PYTHON).status_code == 401
        no_marker(markers)
        r = load(srv, "sent", AS_PYTHON, token="root-secret")
        assert r.status_code == 200, r.text
        assert (markers / "ran-python-1").exists()  # the operator allowed admins to send code
        x = {"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [1.5]}
        url = f"{srv.http_url}/v2/models/sent/versions/1/infer"
        r = HTTP.post(url, json={"inputs": [x]}, headers={"authorization": "Bearer root-secret"})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [3.0]
    finally:
        srv.stop()


def test_the_origin_travels_through_an_s3_bucket(tmp_path: Path) -> None:
    """Uploaded into a bucket, the record goes with the files: a server started later on the
    bucket (a replica, a restart, another cache) refuses to run them."""
    markers = tmp_path / "markers"
    markers.mkdir()
    moto = MotoServer().start()
    servers: list[ServerProcess] = []
    try:
        moto.client().create_bucket(Bucket="models")
        for cache in ("cache-a", "cache-b"):
            srv = ServerProcess(
                Path("unused"),
                extra_args=[
                    *LAYOUT,
                    *ALWAYS,
                    "--s3-endpoint-url",
                    moto.url,
                    "--model-cache-dir",
                    str(tmp_path / cache),
                ],
                env=dict(CREDENTIALS),
                log_path=tmp_path / f"{cache}.log",
            )
            srv.repository = "s3://models/m"  # type: ignore[assignment]  # a URI, not a folder
            servers.append(srv.start(timeout_s=180))
        first, second = servers
        upload(first, "trojan", markers)
        keys = moto.client().list_objects_v2(Bucket="models", Prefix="m/trojan/")["Contents"]
        assert f"m/trojan/{PROVENANCE_FILE}" in [k["Key"] for k in keys]
        refused_pickle(load(first, "trojan", AS_SKLEARN))
        refused_python(load(second, "trojan", AS_PYTHON))
        refused_pickle(load(second, "trojan", AS_SKLEARN))
        no_marker(markers)
    finally:
        for srv in servers:
            srv.stop()
        moto.stop()


def test_the_record_comes_from_the_server_only(tmp_path: Path) -> None:
    """An upload cannot bring a record of its own (one that lists nothing): the server
    writes the record of what arrived."""
    root, markers = tmp_path / "models", tmp_path / "markers"
    root.mkdir()
    markers.mkdir()
    forged = json.dumps({"format": 1, "files": {}}).encode()
    buffer = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(archive(markers))) as src,
        tarfile.open(fileobj=buffer, mode="w:gz") as dst,
    ):
        for member in src:
            dst.addfile(member, src.extractfile(member))
        info = tarfile.TarInfo(PROVENANCE_FILE)
        info.size = len(forged)
        dst.addfile(info, io.BytesIO(forged))
    srv = ServerProcess(root, extra_args=[*LAYOUT, *ALWAYS]).start(timeout_s=180)
    try:
        url = f"{srv.http_url}/v2/repository/models/forged"
        headers = {"content-type": "application/gzip"}
        r = HTTP.put(url, content=buffer.getvalue(), headers=headers, timeout=LONG)
        assert r.status_code == 200, r.text
        refused_pickle(load(srv, "forged", AS_SKLEARN))
        no_marker(markers)
    finally:
        srv.stop()


def test_a_torchserve_archive_downloaded_from_a_url_stays_the_networks(
    tmp_path: Path, torchserve_store: Path
) -> None:
    """Registered from a URL by an admin, the archive is the network's after a restart too:
    a server without an admin token does not run its handler."""
    pytest.importorskip("torch")
    files = HTTPServer(
        ("127.0.0.1", 0), functools.partial(SimpleHTTPRequestHandler, directory=torchserve_store)
    )
    threading.Thread(target=files.serve_forever, daemon=True).start()
    root = tmp_path / "models"
    root.mkdir()
    url = f"http://127.0.0.1:{files.server_port}/echo.mar"
    ports = Ports()
    admin = [*LAYOUT, *ALWAYS, "--model-store", str(tmp_path), "--enable-model-api"]
    admin += ["--admin-token", "root-secret"]
    srv = ServerProcess(
        root,
        extra_args=[*admin, "--allowed-urls", re.escape(url), *ports.args()],
        token="Bearer root-secret",
    ).start(timeout_s=180)
    try:
        r = HTTP.post(
            f"{ports.management_url}/models",
            params={"url": url, "model_name": "fetched", "synchronous": "true"},
            headers={"authorization": "Bearer root-secret"},
            timeout=LONG,
        )
        assert r.status_code == 200, r.text
    finally:
        srv.stop()
        files.shutdown()
    record = json.loads((root / "fetched" / PROVENANCE_FILE).read_text())
    assert list(record["files"]) == ["1/echo.mar"]
    args = [*LAYOUT, *ALWAYS, "--load-model", "fetched", "--strict-readiness=false"]
    srv = ServerProcess(root, extra_args=args).start(timeout_s=180)
    try:
        (entry,) = [e for e in index(srv) if e["name"] == "fetched"]
        assert entry["state"] == "UNAVAILABLE", entry
        assert "echo.mar holds a TorchServe handler" in entry["reason"], entry
        assert "sent through the repository API" in entry["reason"], entry
    finally:
        srv.stop()
