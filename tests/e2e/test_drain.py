"""``inferd serve`` on SIGTERM: not ready at once, requests in flight and queued finish, exit 0.

A gated echo model (one instance; its executions wait until a file exists) holds requests
running and queued while the server is told to stop, for as long as the test needs, however
busy the host; a drain that runs out of ``--drain-timeout-s`` stops anyway.
"""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.support import ServerProcess, pending_requests, wait_for

SLOW = """
name: "slow"
backend: "echo"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
instance_group [{ count: 1 kind: KIND_CPU }]
parameters [
  { key: "gate_file" value: { string_value: "%s" } },
  { key: "request_level" value: { string_value: "true" } }
]
"""


def _repository(root: Path) -> Path:
    """A repository whose model's executions wait until ``root / "gate"`` exists."""
    repo = root / "repo"
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(SLOW % (root / "gate"))
    return repo


def _infer(url: str, value: float) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [value]}]}
    return httpx.post(f"{url}/v2/models/slow/infer", json=body, timeout=30)


def _ready(url: str) -> httpx.Response:
    return httpx.get(f"{url}/v2/health/ready", timeout=30)


DRAINING = "draining: not ready any more"


def _not_ready(server: ServerProcess) -> httpx.Response | None:
    """A readiness answer once every serving process drains (None before). The supervisor
    passes SIGTERM on to each process, and each stops being ready when its own handler runs:
    one 503 says that one process drains, not that the next connection, which the kernel may
    give another, is refused too. So each process's own engine log is asked over its socket
    (one that no longer answers has drained and stopped)."""
    message = {"op": "logs", "kind": "engine", "after": 0, "upto": None, "count": 1000}
    lines = server.ask_each_worker(message)
    if not all(own is None or any(DRAINING in line for _, line in own) for own in lines):
        return None
    answer = _ready(server.http_url)
    return answer if answer.status_code == 503 else None


def test_sigterm_finishes_running_and_queued_requests_then_exits_0(tmp_path: Path) -> None:
    server = ServerProcess(_repository(tmp_path)).start()
    assert server.proc is not None
    try:
        with ThreadPoolExecutor(5) as pool:
            calls = [pool.submit(_infer, server.http_url, float(i)) for i in range(4)]
            wait_for(lambda: pending_requests(server) == 4, "four requests in flight")
            server.proc.send_signal(signal.SIGTERM)
            # Not ready while the four are still held (one running, three queued) ...
            ready = wait_for(lambda: _not_ready(server), "every serving process draining")
            late = pool.submit(_infer, server.http_url, 9.0)  # ... and one more, as a
            wait_for(lambda: pending_requests(server) == 5, "the late request")  # balancer's last
            assert not any(c.done() for c in calls)
            (tmp_path / "gate").touch()
            answers = [c.result() for c in calls]
        assert ready.status_code == 503 and ready.json() == {"ready": False}
        assert [r.status_code for r in answers] == [200] * 4
        assert [r.json()["outputs"][0]["data"] for r in answers] == [[0.0], [1.0], [2.0], [3.0]]
        assert late.result().status_code == 200
        assert late.result().json()["outputs"][0]["data"] == [9.0]
        assert server.proc.wait(timeout=30) == 0
        log = server.log()
        assert f"{DRAINING}; " in log and "waiting at most 30 s" in log
        assert "drained in " in log and "server stopped" in log
    finally:
        server.stop()


def test_a_drain_stops_at_its_timeout_and_exits_soon_after(tmp_path: Path) -> None:
    # The request is held (its gate never opens): the drain gives up after 1 s, the stop
    # after 3 s more.
    server = ServerProcess(_repository(tmp_path), ["--drain-timeout-s", "1"]).start()
    assert server.proc is not None
    try:
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(_infer, server.http_url, 1.0)
            wait_for(lambda: pending_requests(server) == 1, "a request in flight")
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(timeout=30) == 0
            try:
                outcome = str(call.result().status_code)
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
        log = server.log()
        assert "drain timeout (1 s, --drain-timeout-s): stopping with 1 request(s) in flight" in log
        assert "1 request(s) still running 3 s after the drain timeout: exiting now" in log
        assert outcome in ("RemoteProtocolError", "ReadError"), outcome  # dropped, not answered
    finally:
        server.stop()


def test_a_second_sigterm_stops_at_once(tmp_path: Path) -> None:
    server = ServerProcess(_repository(tmp_path)).start()
    assert server.proc is not None
    try:
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "draining" in server.log(), "the drain to start")
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
        assert "second stop signal: stopping now, 0 request(s) in flight" in server.log()
    finally:
        server.stop()
