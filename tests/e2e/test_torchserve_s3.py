"""TorchServe archives with an S3 model repository (a real S3 endpoint on loopback): a
registration is written into the bucket, an ``s3://`` url is registered from it."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.e2e.s3_support import CREDENTIALS, MotoServer
from tests.e2e.torchserve_support import Ports, torchserve_store
from tests.support import ServerProcess

__all__ = ["torchserve_store"]

BUCKET = "torchserve-models"
INPUT = b'{"x": [1, 2, 3, 4]}'


def test_registrations_live_in_the_bucket(torchserve_store: Path, tmp_path: Path) -> None:
    moto = MotoServer().start()
    try:
        s3 = moto.client()
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(
            Bucket=BUCKET,
            Key="archives/echo.mar",
            Body=(torchserve_store / "echo.mar").read_bytes(),
        )
        ports = Ports()
        server = ServerProcess(
            Path("unused"),
            [
                "--s3-endpoint-url",
                moto.url,
                "--model-cache-dir",
                str(tmp_path / "cache"),
                "--model-store",
                str(torchserve_store),
                "--enable-model-api",
                # an archive fetched from S3 arrived after start (inferd.security.trust)
                "--allow-python-models",
                "always",
                *ports.args(),
            ],
            env=dict(CREDENTIALS),
            log_path=tmp_path / "server.log",
        )
        server.repository = f"s3://{BUCKET}/repo"  # type: ignore[assignment]  # not a folder
        server.start(timeout_s=120)
        try:
            management = ports.management_url
            local = httpx.post(f"{management}/models?url=linear.mar", timeout=120)
            assert local.status_code == 200, local.text
            remote = httpx.post(
                f"{management}/models?url=s3://{BUCKET}/archives/echo.mar", timeout=120
            )
            assert remote.status_code == 200, remote.text
            keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
            assert {
                "repo/linear/config.pbtxt",
                "repo/linear/1/linear.mar",
                "repo/linear/1/torchserve.json",
                "repo/echo/1/echo.mar",
            } <= keys
            answer = httpx.put(
                f"{ports.inference_url}/predictions/linear", content=INPUT, timeout=60
            )
            assert answer.json() == {"y": [2.0, 6.0]}
            echoed = httpx.post(f"{ports.inference_url}/predictions/echo", content=b"x", timeout=60)
            assert echoed.status_code == 200
            described = httpx.get(f"{management}/models/echo", timeout=60).json()[0]
            assert described["modelUrl"] == f"s3://{BUCKET}/archives/echo.mar"
            assert httpx.delete(f"{management}/models/echo", timeout=120).status_code == 200
            keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
            assert not any(k.startswith("repo/echo/") for k in keys)
        finally:
            server.stop()
    finally:
        moto.stop()
