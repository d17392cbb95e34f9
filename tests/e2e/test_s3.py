"""``s3://`` repositories against a real S3 endpoint on loopback (moto_server).

What users do with ``aws s3 sync`` or ``s3cmd sync``: objects appear and disappear in the
bucket, and a polling server follows, fetching only what changed. A store outage is one
logged failure; the loaded models keep serving, and the server catches up when it returns.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.lifecycle_support import (
    HALF_PLUS_THREE,
    HALF_PLUS_TWO,
    HPT,
    index,
    infer,
    states,
)
from tests.e2e.s3_support import CREDENTIALS, MotoServer
from tests.support import ServerProcess, wait_for

BUCKET = "models"


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    server = MotoServer().start()
    yield server
    server.stop()


def _server(repository: str, moto: MotoServer, root: Path, *extra: str) -> ServerProcess:
    args = [
        "--s3-endpoint-url",
        moto.url,
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "1",
        "--model-cache-dir",
        str(root / "cache"),
        *extra,
    ]
    server = ServerProcess(Path(repository), extra_args=args, log_path=root / "server.log")
    server.repository = repository  # type: ignore[assignment]  # an s3:// URI, not a folder
    return server


def test_a_bucket_prefix_serves_and_follows_changes(moto: MotoServer, tmp_path: Path) -> None:
    s3 = moto.client()
    s3.create_bucket(Bucket=BUCKET)
    prefix = "team/repo"
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/README.txt", Body=b"not a model")
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{HPT}/", Body=b"")  # a console's folder marker
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{HPT}/1/model.onnx", Body=HALF_PLUS_TWO)
    server = _server(f"s3://{BUCKET}/{prefix}", moto, tmp_path)
    server.env = dict(CREDENTIALS)
    server.start()
    try:
        assert infer(server, HPT, [1.0]).json()["outputs"][0]["data"] == [2.5]
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{HPT}/2/model.onnx", Body=HALF_PLUS_THREE)
        wait_for(lambda: states(server, HPT) == {"1": "UNAVAILABLE", "2": "READY"}, "version 2")
        assert infer(server, HPT, [1.0]).json()["outputs"][0]["data"] == [3.5]
        size = len(HALF_PLUS_THREE)
        assert f"fetched 1 file(s) ({size} bytes), 1 unchanged, 0 removed" in server.log()
        cached = tmp_path / "cache"
        s3.delete_object(Bucket=BUCKET, Key=f"{prefix}/{HPT}/1/model.onnx")
        wait_for(lambda: states(server, HPT) == {"2": "READY"}, "version 1 to leave")
        assert [p.parent.name for p in cached.rglob("model.onnx")] == ["2"]

        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/other/1/model.onnx", Body=HALF_PLUS_TWO)
        wait_for(lambda: states(server, "other") == {"1": "READY"}, "a new model")
        s3.delete_object(Bucket=BUCKET, Key=f"{prefix}/other/1/model.onnx")
        wait_for(lambda: "other" not in {e["name"] for e in index(server)}, "the model to go")
        assert "README" not in {e["name"] for e in index(server)}
    finally:
        server.stop()


def _errors(log: str, uri: str) -> list[str]:
    return [line for line in log.splitlines() if " ERROR " in line and uri in line]


def test_an_outage_keeps_serving_and_catches_up(tmp_path: Path) -> None:
    store = MotoServer().start()
    uri = "s3://outage"
    try:
        s3: Any = store.client()
        s3.create_bucket(Bucket="outage")
        s3.put_object(Bucket="outage", Key=f"{HPT}/1/model.onnx", Body=HALF_PLUS_TWO)
        server = _server(uri, store, tmp_path, "--log-verbose", "1")
        server.extra_args = [
            *server.extra_args,
            "--s3-access-key-id",
            CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "--s3-secret-access-key",
            CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "--s3-region",
            "us-east-1",
        ]
        server.start()
        try:
            assert infer(server, HPT, [1.0]).status_code == 200
            store.stop()
            wait_for(lambda: _errors(server.log(), uri), "the outage to be logged")
            wait_for(lambda: server.log().count("still down") >= 3, "three more failed polls")
            for value in (1.0, 2.0, 3.0):
                r = infer(server, HPT, [value])
                assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [value / 2 + 2]
            (line,) = _errors(server.log(), uri)  # one line for the whole outage
            assert "is unreachable" in line and "keep serving" in line

            store.start()  # the same port, an empty store again
            s3 = store.client()
            s3.create_bucket(Bucket="outage")
            s3.put_object(Bucket="outage", Key=f"{HPT}/1/model.onnx", Body=HALF_PLUS_TWO)
            s3.put_object(Bucket="outage", Key="late/1/model.onnx", Body=HALF_PLUS_THREE)
            wait_for(lambda: states(server, "late") == {"1": "READY"}, "the new model")
            assert infer(server, "late", [1.0]).json()["outputs"][0]["data"] == [3.5]
            wait_for(lambda: states(server, HPT) == {"1": "READY"}, f"{HPT} after the outage")
            assert f"model repository '{uri}' answers again" in server.log()
            assert len(_errors(server.log(), uri)) == 1
        finally:
            server.stop()
    finally:
        store.stop()
