"""S3 store faults, measured: a bucket recreated empty under load, then a store that hangs.

A moto_server on loopback holds two tiny ONNX models; one inferd polls it every second. Four
clients send requests the whole time. (1) The bucket is deleted and, 1.5 s later, recreated
empty; requests go on for ``--fault-s`` more seconds (under the grace period of 60 s by
default). (2) The bucket is filled again, moto_server is then frozen with SIGSTOP, and the
repository index is called ``--index-calls`` times with curl (10 s timeout each) while the
requests go on. Prints requests served and failed for each fault, and the index latencies.
Only Triton-compatible routes are used, so the same script measures any inferd version:

    PYTHONPATH=src .venv/bin/python benchmarks/s3_faults.py
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e.lifecycle_support import HALF_PLUS_THREE, HALF_PLUS_TWO, Traffic, wait_for
from tests.e2e.s3_support import CREDENTIALS, MotoServer
from tests.support import ServerProcess

MODELS = {"half_plus_two/1/model.onnx": HALF_PLUS_TWO, "other/1/model.onnx": HALF_PLUS_THREE}


def _fill(s3: Any) -> None:
    for key, body in MODELS.items():
        s3.put_object(Bucket="models", Key=key, Body=body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault-s", type=float, default=8.0)
    parser.add_argument("--index-calls", type=int, default=5)
    args = parser.parse_args()
    store = MotoServer().start()
    root = Path(tempfile.mkdtemp(prefix="s3-faults-"))
    server = ServerProcess(
        root,
        extra_args=[
            "--s3-endpoint-url",
            store.url,
            "--model-control-mode",
            "poll",
            "--repository-poll-secs",
            "1",
            "--model-cache-dir",
            str(root / "cache"),
        ],
        env=dict(CREDENTIALS),
    )
    server.repository = "s3://models"  # type: ignore[assignment]  # not a folder
    server.log_path = root / "server.log"
    assert store.proc is not None
    try:
        s3: Any = store.client()
        s3.create_bucket(Bucket="models")
        _fill(s3)
        server.start()
        traffic = Traffic(server, ["half_plus_two", "other"]).start()
        wait_for(lambda: traffic.answers[200] >= 50, "traffic")
        for key in MODELS:
            s3.delete_object(Bucket="models", Key=key)
        s3.delete_bucket(Bucket="models")
        time.sleep(1.5)
        s3.create_bucket(Bucket="models")
        time.sleep(args.fault_s)
        answers = traffic.stop()
        failed = sum(n for status, n in answers.items() if status != 200)
        print(f"empty bucket: {answers[200]} requests served, {failed} failed {dict(answers)}")

        _fill(s3)
        up = [200, 200]

        def both_up() -> bool:
            codes = [
                httpx.get(f"{server.http_url}/v2/models/{m}/ready").status_code
                for m in ("half_plus_two", "other")
            ]
            return codes == up

        wait_for(both_up, "the models to serve again", timeout_s=90)
        traffic = Traffic(server, ["half_plus_two", "other"]).start()
        os.kill(store.proc.pid, signal.SIGSTOP)
        latencies_ms: list[float] = []
        timeouts = 0
        try:
            time.sleep(3)  # a poll is hung by now
            for _ in range(args.index_calls):
                # curl in its own process: the traffic thread here would skew a local timer
                done = subprocess.run(
                    [
                        "curl",
                        "-s",
                        "-o",
                        "/dev/null",
                        "-m",
                        "10",
                        "-w",
                        "%{time_total}",
                        "-X",
                        "POST",
                        f"{server.http_url}/v2/repository/index",
                    ],
                    capture_output=True,
                    text=True,
                )
                timeouts += done.returncode != 0
                latencies_ms.append(float(done.stdout) * 1000)
        finally:
            answers = traffic.stop()
            os.kill(store.proc.pid, signal.SIGCONT)
        failed = sum(n for status, n in answers.items() if status != 200)
        print(
            f"hung store: {answers[200]} requests served, {failed} failed; index: "
            f"{args.index_calls - timeouts} of {args.index_calls} answered, median "
            f"{statistics.median(latencies_ms):.1f} ms, max {max(latencies_ms):.1f} ms "
            "(10 s client timeout)"
        )
    finally:
        server.stop()
        store.stop()


if __name__ == "__main__":
    main()
