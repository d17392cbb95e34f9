"""A server of several serving processes says its start-up lines once: "server ready", where it
listens, the page's address and the warning about serving without authentication come from the
first worker; each other worker says only that it takes connections."""

from __future__ import annotations

from pathlib import Path

import httpx

from inferd.demo.models import write_demo_repository
from tests.support import ServerProcess, wait_for


def test_the_start_up_lines_come_once_for_the_server(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_demo_repository(root, models=["half_plus_two"])
    # A non-loopback address (all of them), so that the warning applies.
    args = ["--http-workers", "3", "--http-address", "0.0.0.0"]
    server = ServerProcess(root, extra_args=args)
    server.start()
    try:
        wait_for(lambda: "server ready" in server.log(), "the first worker's readiness line")
        log = server.log()
        for n in (1, 2):
            assert log.count(f"worker {n} takes connections") == 1, log
        assert log.count("server ready; models ready: half_plus_two") == 1, log
        assert log.count("listening: HTTP") == 1, log
        assert log.count("listening: gRPC") == 1, log
        assert log.count("dashboard: http://localhost:") == 1, log
        assert log.count("serving without authentication on 0.0.0.0:") == 1, log
        for _ in range(6):  # each worker serves, over new connections
            r = httpx.post(
                f"{server.http_url}/v2/models/half_plus_two/infer",
                json={"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}]},
                timeout=30,
            )
            assert r.json()["outputs"][0]["data"] == [2.5]
    finally:
        server.stop()
