"""Faults of an S3 store that must not take the service down, against a
real endpoint on loopback (moto_server): a bucket recreated empty is a store fault, not an
order to unload everything; a store that hangs (SIGSTOP) blocks neither inference nor the
repository index, which answers from the last listing and says when that was."""

from __future__ import annotations

import os
import re
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from tests.e2e.lifecycle_support import (
    HALF_PLUS_THREE,
    HALF_PLUS_TWO,
    HPT,
    HTTP,
    Traffic,
    index,
    infer,
)
from tests.e2e.s3_support import CREDENTIALS, MotoServer
from tests.support import ServerProcess, wait_for

SYNCED = "inferd-repository-synced-at"
LAST_SYNC = "inferd_repository_last_sync_timestamp_seconds"


def _server(store: MotoServer, root: Path, bucket: str, *extra: str) -> ServerProcess:
    root.mkdir(parents=True, exist_ok=True)
    args = ["--s3-endpoint-url", store.url, "--model-cache-dir", str(root / "cache"), *extra]
    server = ServerProcess(root, extra_args=args, env=dict(CREDENTIALS))
    server.repository = f"s3://{bucket}"  # type: ignore[assignment]  # not a folder
    server.log_path = root / "server.log"
    return server


def _status(server: ServerProcess) -> dict[str, Any]:
    r = HTTP.get(f"{server.http_url}/v2/repository/status", timeout=60)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _reasons(server: ServerProcess) -> dict[str, str]:
    return {e["name"]: e["reason"] for e in index(server)}


def _one_sync_time(server: ServerProcess) -> bool:
    """Every serving process says the same last listing time (each asked over its own
    socket): a frontend has the model host's with the host's next status report, so right
    after the host's last listing it may still say the one before."""
    texts = server.ask_each_worker({"op": "metrics"})
    found = [re.search(rf"^{LAST_SYNC} (\S+)$", text or "", re.M) for text in texts]
    return all(found) and len({f.group(1) for f in found if f}) <= 1


def test_a_bucket_recreated_empty_keeps_serving_until_the_grace(tmp_path: Path) -> None:
    store = MotoServer().start()
    server = _server(
        store,
        tmp_path,
        "faulty",
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "1",
        "--repository-unload-grace-s",
        "12",
    )
    try:
        s3: Any = store.client()
        s3.create_bucket(Bucket="faulty")
        s3.put_object(Bucket="faulty", Key=f"{HPT}/1/model.onnx", Body=HALF_PLUS_TWO)
        s3.put_object(Bucket="faulty", Key="other/1/model.onnx", Body=HALF_PLUS_THREE)
        server.start()
        traffic = Traffic(server, [HPT, "other"]).start()
        try:
            wait_for(lambda: traffic.answers[200] >= 50, "traffic to flow")
            # Both at once: a poll between two single deletes would see one model of two
            # go (not more than the guard's share), which is an operator's change.
            keys = [{"Key": f"{HPT}/1/model.onnx"}, {"Key": "other/1/model.onnx"}]
            s3.delete_objects(Bucket="faulty", Delete={"Objects": keys})
            s3.delete_bucket(Bucket="faulty")
            # A poll finds no bucket: an outage (the store is not ok) ...
            wait_for(lambda: not _status(server)["stores"][0]["ok"], "a poll to see the outage")
            s3.create_bucket(Bucket="faulty")  # ... then an empty one: a store fault
            held = wait_for(
                lambda: all("store fault" in r for r in _reasons(server).values()), "the fault"
            )
            wait_for(lambda: traffic.answers[200] >= 200, "more traffic during the fault")
        finally:
            answers = traffic.stop()
        assert dict(answers) == {200: answers[200]}, traffic.failures
        assert held and set(_reasons(server)) == {HPT, "other"}

        def both_held() -> bool:
            """The status once it says so: with several workers, a frontend has the model
            host's status with its next report (each second), maybe after the index. The store
            is ok again once a poll has listed the recreated bucket; a poll that ran between
            the two deletes may already have held both, before the outage, so the fault can
            show before that poll does."""
            status = _status(server)
            names = {h["name"] for h in status["held"]}
            ok = status["stores"][0]["ok"]
            return names == {HPT, "other"} and status["store_faults"] == 1 and ok

        wait_for(both_held, "the status to hold both, the store answering again")
        metrics = HTTP.get(f"{server.http_url}/metrics").text
        assert "inferd_repository_held_models 2.0" in metrics
        assert "inferd_repository_store_faults_total 1.0" in metrics
        assert "lists 0 of the 2 models loaded from it" in server.log()
        print(f"\nempty-bucket fault: {answers[200]} requests served, 0 failed")

        s3.put_object(Bucket="faulty", Key=f"{HPT}/1/model.onnx", Body=HALF_PLUS_TWO)
        wait_for(lambda: _reasons(server).get(HPT) == "", f"{HPT} to be back")
        wait_for(lambda: "other" not in _reasons(server), "the grace to end", timeout_s=40)
        assert "model 'other' is still missing from model repository" in server.log()
        assert infer(server, "other", [1.0]).status_code == 404
        assert infer(server, HPT, [1.0]).json()["outputs"][0]["data"] == [2.5]
        assert server.log().count(f"loaded model '{HPT}' version 1") == 1  # never reloaded
    finally:
        server.stop()
        store.stop()


def _index_latencies_ms(server: ServerProcess, count: int) -> list[float]:
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        r = HTTP.post(f"{server.http_url}/v2/repository/index", json={}, timeout=60)
        latencies.append((time.perf_counter() - started) * 1000)
        assert r.status_code == 200 and {e["name"] for e in r.json()} == {HPT}, r.text
    return latencies


def test_a_hung_store_blocks_neither_inference_nor_the_index(tmp_path: Path) -> None:
    store = MotoServer().start()
    s3: Any = store.client()
    s3.create_bucket(Bucket="hung")
    s3.put_object(Bucket="hung", Key=f"{HPT}/1/model.onnx", Body=HALF_PLUS_TWO)
    poll = _server(
        store,
        tmp_path / "poll",
        "hung",
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "1",
    )
    explicit = _server(
        store,
        tmp_path / "explicit",
        "hung",
        "--model-control-mode",
        "explicit",
        "--load-model",
        HPT,
    )
    assert store.proc is not None
    try:
        for server in (poll, explicit):
            server.start()
        assert HTTP.post(f"{poll.http_url}/v2/repository/index").headers[SYNCED].endswith("Z")
        traffic = Traffic(poll, [HPT]).start()
        os.kill(store.proc.pid, signal.SIGSTOP)
        try:
            stuck = wait_for(lambda: _status(poll)["synced_age_s"] >= 3, "a poll to hang")
            wait_for(lambda: _one_sync_time(poll), "every serving process to have the host's")
            frozen = HTTP.post(f"{poll.http_url}/v2/repository/index").headers[SYNCED]
            figures = [(s, _index_latencies_ms(s, 20)) for s in (poll, explicit)]
            assert HTTP.post(f"{poll.http_url}/v2/repository/index").headers[SYNCED] == frozen
            r = infer(explicit, HPT, [3.0])
            assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [3.5]
        finally:
            answers = traffic.stop()
            os.kill(store.proc.pid, signal.SIGCONT)
        assert stuck and dict(answers) == {200: answers[200]}, traffic.failures
        wait_for(lambda: _status(poll)["synced_age_s"] < 2, "polls to resume", timeout_s=40)
        for server, latencies in figures:
            mode = "poll" if server is poll else "explicit"
            print(
                f"\nhung store, {mode} mode: index median {statistics.median(latencies):.1f} ms, "
                f"max {max(latencies):.1f} ms over {len(latencies)}"
            )
        print(f"hung store: {answers[200]} inference requests served, 0 failed")
    finally:
        for server in (poll, explicit):
            server.stop()
        store.stop()
