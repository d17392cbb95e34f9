"""Two servers polling one ``s3://`` repository converge: an upload, a label change and a
traffic split made through one appear on the other after its poll, because each is written
into the bucket (the model folder, its ``routing.json``), not kept in one server's memory."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.lifecycle_support import (
    HALF_PLUS_THREE,
    HALF_PLUS_TWO,
    HTTP,
    infer,
    states,
)
from tests.e2e.s3_support import CREDENTIALS, MotoServer
from tests.support import ServerProcess, wait_for

BUCKET = "shared"
M = "canary"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list[ServerProcess]]]:
    store = MotoServer().start()
    s3: Any = store.client()
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=f"{M}/config.pbtxt", Body=b"version_policy { all {} }\n")
    s3.put_object(Bucket=BUCKET, Key=f"{M}/1/model.onnx", Body=HALF_PLUS_TWO)
    s3.put_object(Bucket=BUCKET, Key=f"{M}/2/model.onnx", Body=HALF_PLUS_THREE)
    servers = []
    try:
        for node in ("a", "b"):
            root = tmp_path_factory.mktemp(f"node-{node}")
            args = [
                "--s3-endpoint-url",
                store.url,
                "--model-control-mode",
                "poll",
                "--repository-poll-secs",
                "1",
                "--model-cache-dir",
                str(root / "cache"),
            ]
            server = ServerProcess(root, extra_args=args, env=dict(CREDENTIALS))
            server.repository = f"s3://{BUCKET}"  # type: ignore[assignment]  # not a folder
            server.log_path = root / "server.log"
            servers.append(server.start())
        yield s3, servers
    finally:
        for server in servers:
            server.stop()
        store.stop()


def _routing(server: ServerProcess, change: dict[str, Any] | None = None) -> dict[str, Any]:
    if change is None:
        r = HTTP.get(f"{server.http_url}/v2/models/{M}/routing")
    else:
        r = HTTP.post(f"{server.http_url}/v2/repository/models/{M}/routing", json=change)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    doc.pop("shadow_stats")
    return doc


def _version(server: ServerProcess, **extra: Any) -> str:
    r = infer(server, M, [1.0], **extra)
    assert r.status_code == 200, r.text
    return str(r.json()["model_version"])


def test_an_upload_through_one_node_serves_on_the_other(
    replicas: tuple[Any, list[ServerProcess]],
) -> None:
    s3, (a, b) = replicas
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("1/model.onnx")
        info.size = len(HALF_PLUS_THREE)
        tar.addfile(info, io.BytesIO(HALF_PLUS_THREE))
    r = HTTP.put(f"{a.http_url}/v2/repository/models/pushed", content=buffer.getvalue())
    assert r.status_code == 200, r.text
    assert infer(a, "pushed", [1.0]).json()["outputs"][0]["data"] == [3.5]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="pushed/")["Contents"]]
    assert keys == ["pushed/.inferd-provenance.json", "pushed/1/model.onnx"]
    wait_for(lambda: states(b, "pushed") == {"1": "READY"}, "the upload on the other node")
    assert infer(b, "pushed", [1.0]).json()["outputs"][0]["data"] == [3.5]
    bad = HTTP.put(f"{a.http_url}/v2/repository/models/broken", content=_tar_of(b"not onnx"))
    assert bad.status_code == 400 and "did not load" in bad.json()["error"]
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="broken/")["KeyCount"] == 0


def _tar_of(model: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("1/model.onnx")
        info.size = len(model)
        tar.addfile(info, io.BytesIO(model))
    return buffer.getvalue()


def test_labels_and_splits_set_on_one_node_route_on_the_other(
    replicas: tuple[Any, list[ServerProcess]],
) -> None:
    s3, (a, b) = replicas
    r = HTTP.post(
        f"{a.http_url}/v2/repository/models/{M}/labels", json={"labels": {"stable": 1, "canary": 2}}
    )
    assert r.status_code == 200, r.text
    wait_for(lambda: _routing(b)["labels"] == {"canary": 2, "stable": 1}, "the labels on b")
    assert _version(b, parameters={"version_label": "canary"}) == "2"
    assert _version(b, parameters={"version_label": "stable"}) == "1"

    assert _routing(a, {"traffic_split": {"stable": 100}})["traffic_split"] == {"stable": 100.0}
    wait_for(lambda: _routing(b)["traffic_split"] == {"stable": 100.0}, "the split on b")
    assert {_version(b, id=uuid.uuid4().hex) for _ in range(20)} == {"1"}
    shadow = {"label": "canary", "fraction": 0.5, "tolerance": 0.0}
    _routing(a, {"traffic_split": {"canary": 100}, "shadow": shadow})
    wait_for(lambda: _routing(b) == _routing(a), "the same routing on both nodes")
    assert {_version(b, id=uuid.uuid4().hex) for _ in range(20)} == {"2"}

    stored = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{M}/routing.json")["Body"].read())
    assert stored == {
        "labels": {"canary": 2, "stable": 1},
        "shadow": shadow,
        "traffic_split": {"canary": 100.0},
    }
    for server in (a, b):  # routing changes reload no version
        assert server.log().count(f"loaded model '{M}' version") == 2
