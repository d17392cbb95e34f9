"""``--strict-readiness``: the server is ready only when every model that should load is READY
(HTTP ``/v2/health/ready``, gRPC ServerReady and the health service), or, with
``--strict-readiness=false``, as soon as startup loading is done."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import httpx
import pytest
import tritonclient.grpc as triton_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.e2e.lifecycle_support import HTTP, states
from tests.echo_support import BATCHED as ECHO
from tests.support import ServerProcess, wait_for


def _repository(root: Path) -> Path:
    (root / "good" / "1").mkdir(parents=True)
    (root / "good" / "config.pbtxt").write_text(ECHO)
    (root / "bad" / "1").mkdir(parents=True)
    (root / "bad" / "config.pbtxt").write_text('backend: "echo"\n')  # no inputs: fails to load
    return root


def _ready(server: ServerProcess) -> tuple[int, bool, int]:
    """(HTTP status, gRPC ServerReady, gRPC health status of the server)."""
    status = HTTP.get(f"{server.http_url}/v2/health/ready").status_code
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        grpc_ready = client.is_server_ready()
    with grpc.insecure_channel(server.grpc_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        served = health.Check(health_pb2.HealthCheckRequest(service="")).status
    return status, grpc_ready, served


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.parametrize("strict", [True, False])
def test_readiness_with_a_model_that_fails(tmp_path: Path, strict: bool) -> None:
    root = _repository(tmp_path / "models")
    args = ["--model-control-mode", "poll", "--repository-poll-secs", "1"]
    server = ServerProcess(root, extra_args=[*args, f"--strict-readiness={str(strict).lower()}"])
    server.start(until="/v2/health/live")
    try:
        wait_for(lambda: states(server, "bad") == {"1": "UNAVAILABLE"}, "the failed load")
        wait_for(lambda: states(server, "good") == {"1": "READY"}, "the good model")
        if strict:
            assert _ready(server) == (503, False, NOT_SERVING)
            assert HTTP.get(f"{server.http_url}/v2/health/ready").json() == {"ready": False}
        else:
            assert _ready(server) == (200, True, SERVING)
        (root / "bad" / "config.pbtxt").write_text(ECHO)  # fixed: it loads on the next poll
        wait_for(lambda: states(server, "bad") == {"1": "READY"}, "the fixed model")
        # With several workers a frontend has the host's verdict with its next status (each
        # second), maybe after the table that showed the model READY on another worker.
        wait_for(lambda: _ready(server) == (200, True, SERVING), "every port ready")
    finally:
        server.stop()


def test_a_failed_explicit_load_does_not_make_the_server_unready(tmp_path: Path) -> None:
    root = _repository(tmp_path / "models")
    args = ["--model-control-mode", "explicit", "--load-model", "good"]
    server = ServerProcess(root, extra_args=args).start()
    try:
        r = httpx.post(f"{server.http_url}/v2/repository/models/bad/load", timeout=60)
        assert r.status_code == 400 and "failed to load 'bad'" in r.json()["error"]
        assert _ready(server) == (200, True, SERVING)
    finally:
        server.stop()


@pytest.mark.parametrize("strict", [True, False])
def test_the_log_says_what_the_health_endpoint_says(tmp_path: Path, strict: bool) -> None:
    """The log says "server ready" only when /v2/health/ready answers 200, and names the
    models that failed either way."""
    root = _repository(tmp_path / "models")
    server = ServerProcess(root, extra_args=[f"--strict-readiness={str(strict).lower()}"])
    server.start(until="/v2/health/live")
    try:
        wait_for(lambda: "models that failed to load: bad (" in server.log(), "the startup line")
        status = HTTP.get(f"{server.http_url}/v2/health/ready").status_code
    finally:
        server.stop()
    log = server.log()
    if strict:
        assert status == 503 and "server ready" not in log
        assert (
            "server not ready (/v2/health/ready answers 503): models that failed to load: bad ("
            in log
        )
        assert "; models ready: good" in log
    else:
        assert status == 200
        assert "server ready; models ready: good; models that failed to load: bad (" in log


SLOW = ECHO + (
    'parameters { key: "gate_file" value: { string_value: "%s" } }\n'
    'model_warmup [{ name: "w" batch_size: 1 inputs { key: "INPUT0" value: '
    "{ data_type: TYPE_FP32 dims: [2] zero_data: true } } }]\n"
)


def _slow_repository(root: Path) -> Path:
    """a_slow's warmup waits until ``root.parent / "gate"`` exists; b_waiting loads after it (in
    name order)."""
    for name, config in (("a_slow", SLOW % (root.parent / "gate")), ("b_waiting", ECHO)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    return root


def test_models_waiting_their_turn_show_loading(tmp_path: Path) -> None:
    server = ServerProcess(_slow_repository(tmp_path / "models"))
    server.start(until="/v2/health/live")
    try:
        wait_for(lambda: states(server, "a_slow") == {"1": "LOADING"}, "a_slow loading")
        entries = HTTP.post(f"{server.http_url}/v2/repository/index").json()
        waiting = [e for e in entries if e["name"] == "b_waiting"]
        assert waiting == [{"name": "b_waiting", "version": "", "state": "LOADING", "reason": ""}]
        assert HTTP.get(f"{server.http_url}/v2/health/ready").status_code == 503
        (tmp_path / "gate").touch()  # a_slow's warmup ends
        wait_for(lambda: states(server, "b_waiting") == {"1": "READY"}, "b_waiting")
        wait_for(lambda: "server ready; models ready: a_slow, b_waiting" in server.log(), "log")
    finally:
        server.stop()


def test_no_server_ready_while_stopping(tmp_path: Path) -> None:
    """A SIGTERM during startup loading: the log never says the server became ready, not even
    once the loading it waited for ends."""
    server = ServerProcess(_slow_repository(tmp_path / "models"))
    server.start(until="/v2/health/live")
    assert server.proc is not None
    try:
        wait_for(lambda: states(server, "a_slow") == {"1": "LOADING"}, "a_slow loading")
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "drain" in server.log(), "the drain to start")
        (tmp_path / "gate").touch()  # a_slow's warmup ends
        assert server.proc.wait(timeout=60) == 0
    finally:
        server.stop()
    log = server.log()
    assert "drain" in log and "server ready" not in log and "server not ready" not in log
