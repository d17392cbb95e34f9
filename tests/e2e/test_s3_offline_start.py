"""A node that cannot reach its s3:// repository at start serves what its cache holds.

A pod restarted during a store outage keeps its cache volume: it loads the models a previous
run fetched, says so in its log, and catches up (poll mode) once the store answers.
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.lifecycle_support import HALF_PLUS_THREE, HALF_PLUS_TWO, HPT, infer, states
from tests.e2e.s3_support import CREDENTIALS, MotoServer
from tests.support import ServerProcess, wait_for

URI = "s3://offline"


def _server(store: MotoServer, root: Path, name: str) -> ServerProcess:
    args = [
        "--s3-endpoint-url",
        store.url,
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "1",
        "--model-cache-dir",
        str(root / "cache"),  # the same cache for both runs, like a pod's volume
    ]
    server = ServerProcess(Path(URI), args, env=dict(CREDENTIALS), log_path=root / f"{name}.log")
    server.repository = URI  # type: ignore[assignment]  # an s3:// URI, not a folder
    return server


def test_a_node_started_during_an_outage_serves_its_cache(tmp_path: Path) -> None:
    store = MotoServer().start()
    try:
        s3 = store.client()
        s3.create_bucket(Bucket="offline")
        s3.put_object(Bucket="offline", Key=f"{HPT}/1/model.onnx", Body=HALF_PLUS_TWO)
        first = _server(store, tmp_path, "first").start()
        try:
            assert infer(first, HPT, [1.0]).json()["outputs"][0]["data"] == [2.5]
        finally:
            first.stop()

        store.stop()
        second = _server(store, tmp_path, "second").start()
        try:
            assert infer(second, HPT, [1.0]).json()["outputs"][0]["data"] == [2.5]
            log = second.log()
            assert f"model repository '{URI}' is unreachable" in log
            assert (
                f"model repository '{URI}' is unreachable: serving 1 model(s) from its local "
                f"cache until it answers ({HPT})"
            ) in log

            store.start()  # the store is back (empty, as moto restarts), with a new version
            s3 = store.client()
            s3.create_bucket(Bucket="offline")
            s3.put_object(Bucket="offline", Key=f"{HPT}/1/model.onnx", Body=HALF_PLUS_TWO)
            s3.put_object(Bucket="offline", Key=f"{HPT}/2/model.onnx", Body=HALF_PLUS_THREE)
            wait_for(lambda: states(second, HPT).get("2") == "READY", "version 2 after the outage")
            assert infer(second, HPT, [1.0]).json()["outputs"][0]["data"] == [3.5]
        finally:
            second.stop()
    finally:
        store.stop()
