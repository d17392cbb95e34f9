"""Triton's trace and log settings APIs with unmodified tritonclient (HTTP and gRPC, on both gRPC
servers): values round-trip and a change takes effect on the next request or log line."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess

M = "half_plus_two"
STARTUP_TRACE = {
    "trace_level": ["TIMESTAMPS"],
    "trace_rate": "1",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "opentelemetry",
}


@pytest.fixture(scope="module", params=["native", "grpcio"])
def traced(
    request: pytest.FixtureRequest, demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("settings") / "models"
    shutil.copytree(demo_repo / M, root / M)
    logs = tmp_path_factory.mktemp("logs")
    args = ["--trace-exporter", "console", "--grpc-server", request.param]
    args += ["--model-control-mode", "explicit", "--load-model", M]
    args += ["--log-file", str(logs / "engine.log")]
    # Spans leave the exporter's batch within 50 ms, not the default 5 s.
    server = ServerProcess(root, extra_args=args, env={"OTEL_BSP_SCHEDULE_DELAY": "50"}).start()
    server.logs_dir = logs  # type: ignore[attr-defined]
    yield server
    server.stop()


def _infer(server: ServerProcess, request_id: str) -> None:
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    x = triton_grpc.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[2.0]], dtype=np.float32))
    result = client.infer(M, [x], request_id=request_id)
    assert result.as_numpy("y").tolist() == [[3.0]]


def _traced_ids(server: ServerProcess, sentinel: str) -> list[str]:
    """The request ids of every span exported up to the sentinel's (traced for sure)."""
    deadline = time.monotonic() + 60
    while sentinel not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    found = []
    for line in server.log().splitlines():
        if '"inferd.request_id":' in line:
            found.append(line.split('"inferd.request_id": "')[1].split('"')[0])
    assert sentinel in found
    return found


def test_trace_settings_round_trip_and_sample(traced: ServerProcess) -> None:
    http = triton_http.InferenceServerClient(traced.http_address)
    rpc = triton_grpc.InferenceServerClient(traced.grpc_address)
    assert http.get_trace_settings() == STARTUP_TRACE
    assert http.get_trace_settings(model_name=M) == STARTUP_TRACE
    tag = traced.grpc_port
    # Globally off; the model on, one request in 2, for 2 traces at most (over gRPC).
    assert http.update_trace_settings(settings={"trace_level": ["OFF"]})["trace_level"] == ["OFF"]
    answer = rpc.update_trace_settings(
        model_name=M,
        settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "2"},
    )
    assert {k: list(v.value) for k, v in answer.settings.items()} == {
        **{k: [v] if isinstance(v, str) else v for k, v in STARTUP_TRACE.items()},
        "trace_rate": ["2"],
        "trace_count": ["2"],
    }
    assert rpc.get_trace_settings(as_json=True)["settings"]["trace_level"] == {"value": ["OFF"]}
    for i in range(1, 7):
        _infer(traced, f"r{tag}-{i}")
    assert http.get_trace_settings(model_name=M)["trace_count"] == "0"  # both traces taken
    # Clearing the model's keys falls back to the global settings (off).
    cleared = http.update_trace_settings(
        model_name=M, settings={"trace_level": None, "trace_rate": None, "trace_count": None}
    )
    assert cleared["trace_level"] == ["OFF"]
    _infer(traced, f"r{tag}-off")
    # Global back to the startup value (None): every request traced.
    assert http.update_trace_settings(settings={"trace_level": None}) == STARTUP_TRACE
    _infer(traced, f"r{tag}-end")
    ids = [i for i in _traced_ids(traced, f"r{tag}-end") if i.startswith(f"r{tag}-")]
    assert ids == [f"r{tag}-2", f"r{tag}-4", f"r{tag}-end"]


def test_trace_settings_refuse_bad_values(traced: ServerProcess) -> None:
    http = triton_http.InferenceServerClient(traced.http_address)
    rpc = triton_grpc.InferenceServerClient(traced.grpc_address)
    bad = {
        "trace_level": (["TENSORS"], "'TENSORS' is not supported"),
        "trace_rate": ("0", "must be at least 1"),
        "trace_count": ("many", "must be an integer"),
        "trace_file": ("/tmp/t.json", "cannot be changed"),
        "sampling": ("1", "unknown trace setting 'sampling'"),
    }
    for key, (value, fragment) in bad.items():
        with pytest.raises(InferenceServerException, match=fragment):
            http.update_trace_settings(settings={key: value})
        with pytest.raises(InferenceServerException, match=fragment) as info:
            rpc.update_trace_settings(settings={key: value})
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="unknown model: 'nope'"):
        http.get_trace_settings(model_name="nope")
    assert http.get_trace_settings() == STARTUP_TRACE  # nothing half applied


def test_log_settings_round_trip_and_take_effect(traced: ServerProcess) -> None:
    http = triton_http.InferenceServerClient(traced.http_address)
    rpc = triton_grpc.InferenceServerClient(traced.grpc_address)
    logs: Path = traced.logs_dir  # type: ignore[attr-defined]
    first = str(logs / "engine.log")
    assert http.get_log_settings() == {
        "log_file": first,
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "text",
    }
    # Info lines off: an unload is not logged.
    assert http.update_log_settings({"log_info": False})["log_info"] is False
    http.unload_model(M)
    http.load_model(M)
    assert "unloaded model" not in (logs / "engine.log").read_text()
    # Over gRPC: info on, JSON lines, into another file.
    second = str(logs / f"second-{traced.grpc_port}.log")
    answer = rpc.update_log_settings(
        {"log_info": True, "log_format": "json", "log_file": second, "log_verbose_level": 1},
        as_json=True,
    )
    assert answer["settings"] == {
        "log_file": {"string_param": second},
        "log_info": {"bool_param": True},
        "log_warning": {"bool_param": True},
        "log_error": {"bool_param": True},
        "log_verbose_level": {"uint32_param": 1},
        "log_format": {"string_param": "json"},
    }
    http.unload_model(M)
    http.load_model(M)
    lines = [json.loads(line) for line in Path(second).read_text().splitlines()]
    assert {"level": "INFO", "message": f"unloaded model '{M}'"}.items() <= next(
        line for line in lines if line["message"].startswith("unloaded")
    ).items()
    assert "unloaded model" not in (logs / "engine.log").read_text()
    with pytest.raises(InferenceServerException, match="must be of type bool, got str"):
        http.update_log_settings({"log_info": "yes"})
    with pytest.raises(InferenceServerException, match="'log_format' must be one of"):
        rpc.update_log_settings({"log_format": "xml"})
    back = {"log_file": first, "log_format": "text", "log_verbose_level": 0}
    assert http.update_log_settings(back)["log_format"] == "text"
