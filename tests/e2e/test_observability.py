"""Metrics, statistics, access and engine logs, tracing: exact figures after known requests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import ServerProcess, free_port

X = {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}
BATCH = {"name": "x", "shape": [4, 1], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture(scope="module")
def observed(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A fresh server that has seen exactly: 3 single-row successes, 1 batch of 4 rows,
    2 failed requests on half_plus_two, and 1 request for an unknown model."""
    logs = tmp_path_factory.mktemp("logs")
    root = tmp_path_factory.mktemp("obs") / "models"
    shutil.copytree(demo_repo / "half_plus_two", root / "half_plus_two")
    metrics_port = free_port()
    server = ServerProcess(
        root,
        extra_args=[
            "--access-log-file",
            str(logs / "access.log"),
            "--log-file",
            str(logs / "engine.log"),
            "--node-name",
            "node-a",
            "--metrics-port",
            str(metrics_port),
            "--allow-unauthenticated-admin",
        ],
    ).start()
    server.metrics_port = metrics_port  # type: ignore[attr-defined]
    server.logs_dir = logs  # type: ignore[attr-defined]
    url = f"{server.http_url}/v2/models/half_plus_two/infer"
    for i in range(3):
        r = httpx.post(url, json={"inputs": [X]}, headers={"X-Request-ID": f"rid-{i}"}, timeout=60)
        assert r.headers["x-request-id"] == f"rid-{i}"
    assert httpx.post(url, json={"id": "batch-1", "inputs": [BATCH]}, timeout=60).status_code == 200
    assert (
        httpx.post(url, json={"inputs": [{**X, "datatype": "FP64"}]}, timeout=60).status_code == 400
    )
    assert httpx.post(url, json={"inputs": [{**X, "name": "z"}]}, timeout=60).status_code == 400
    assert (
        httpx.post(
            f"{server.http_url}/v2/models/nope/infer", json={"inputs": [X]}, timeout=60
        ).status_code
        == 404
    )
    yield server
    server.stop()


def test_prometheus_counts(observed: ServerProcess) -> None:
    text = httpx.get(f"{observed.http_url}/metrics", timeout=60).text
    s = _samples(text)
    mv = {"model": "half_plus_two", "version": "1"}
    assert _value(s, "inferd_request_success_total", **mv) == 4
    assert _value(s, "inferd_request_failure_total", **mv) == 2
    assert _value(s, "inferd_inference_total", **mv) == 7
    assert _value(s, "inferd_execution_total", **mv) == 4
    assert _value(s, "inferd_request_duration_seconds_count", **mv) == 4
    assert _value(s, "inferd_compute_infer_duration_seconds_count", **mv) == 4
    assert _value(s, "inferd_batch_size_count", **mv) == 4
    assert _value(s, "inferd_batch_size_sum", **mv) == 7
    assert _value(s, "inferd_batch_size_bucket", le="1", **mv) == 3
    assert _value(s, "inferd_batch_size_bucket", le="4", **mv) == 4
    assert _value(s, "inferd_model_ready", **mv) == 1
    assert _value(s, "inferd_pending_requests", **mv) == 0
    assert _value(s, "inferd_model_load_duration_seconds", **mv) > 0
    infer = {"protocol": "http", "endpoint": "V2Http.infer"}
    assert _value(s, "inferd_endpoint_requests_total", status="200", **infer) == 4
    assert _value(s, "inferd_endpoint_requests_total", status="400", **infer) == 2
    assert _value(s, "inferd_endpoint_requests_total", status="404", **infer) == 1
    assert _value(s, "process_resident_memory_bytes") > 0
    assert _value(s, "process_open_fds") > 0
    assert 'model="nope"' not in text  # an unknown model never becomes a label value
    port = observed.metrics_port  # type: ignore[attr-defined]
    other = _samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=60).text)
    assert _value(other, "inferd_request_success_total", **mv) == 4


def test_statistics_json(observed: ServerProcess) -> None:
    (stats,) = httpx.get(f"{observed.http_url}/v2/models/half_plus_two/stats", timeout=60).json()[
        "model_stats"
    ]
    assert stats["inference_count"] == 7
    assert stats["execution_count"] == 4
    assert stats["inference_stats"]["success"]["count"] == 4
    assert stats["inference_stats"]["fail"]["count"] == 2
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (1, 3),
        (4, 1),
    ]


def _access_lines(observed: ServerProcess) -> list[dict[str, str]]:
    path = observed.logs_dir / "access.log"  # type: ignore[attr-defined]
    lines = []
    for line in path.read_text().splitlines():
        lines.append(dict(part.split("=", 1) for part in line.split(" ")))
    return lines


def test_access_log_lines(observed: ServerProcess) -> None:
    lines = [e for e in _access_lines(observed) if e["path"].endswith("/infer")]
    by_id = {e["request_id"]: e for e in lines}
    first = by_id["rid-0"]
    assert first["node"] == "node-a"
    assert (first["protocol"], first["method"]) == ("http", "POST")
    assert first["path"] == "/v2/models/half_plus_two/infer"
    assert (first["model"], first["version"], first["status"]) == ("half_plus_two", "1", "200")
    assert float(first["latency_ms"]) > 0
    assert int(first["bytes_in"]) == len(json.dumps({"inputs": [X]}, separators=(",", ":")))
    assert int(first["bytes_out"]) > 0
    assert first["client"].startswith("127.0.0.1")
    assert by_id["batch-1"]["status"] == "200"  # the v2 id becomes the request id
    statuses = sorted(e["status"] for e in lines)
    assert statuses == ["200", "200", "200", "200", "400", "400", "404"]
    generated = [e["request_id"] for e in lines if e["status"] != "200"]
    assert len(set(generated)) == 3 and all(g != "-" for g in generated)


def test_logs_endpoint(observed: ServerProcess) -> None:
    r = httpx.get(f"{observed.http_url}/v2/logs", params={"kind": "access", "lines": 2}, timeout=60)
    assert r.status_code == 200
    assert len(r.json()["lines"]) == 2
    engine = httpx.get(
        f"{observed.http_url}/v2/logs", params={"kind": "engine"}, timeout=60
    ).json()["lines"]
    assert any("loaded model 'half_plus_two' version 1" in line for line in engine)
    r = httpx.get(f"{observed.http_url}/v2/logs", params={"kind": "debug"}, timeout=60)
    assert r.status_code == 400
    engine_file = (observed.logs_dir / "engine.log").read_text()  # type: ignore[attr-defined]
    assert "server ready" in engine_file


def test_real_prometheus_scrapes_inferd(observed: ServerProcess, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's prometheus is not installed (.ci/run installs it)")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: inferd\n"
        f"    static_configs:\n      - targets: ['{observed.http_address}']\n"
    )
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        query = 'inferd_request_success_total{model="half_plus_two"}'
        deadline = time.monotonic() + 60
        result: list[Any] = []
        while time.monotonic() < deadline and not result:
            try:
                r = httpx.get(
                    f"http://127.0.0.1:{port}/api/v1/query", params={"query": query}, timeout=60
                )
                result = r.json()["data"]["result"]
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.5)
        assert result, "prometheus never scraped inferd"
        assert float(result[0]["value"][1]) == 4
        assert result[0]["metric"]["version"] == "1"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_traces_continue_the_callers_trace(demo_repo: Path, tmp_path: Path) -> None:
    root = tmp_path / "models"
    shutil.copytree(demo_repo / "half_plus_two", root / "half_plus_two")
    (root / "half_plus_two" / "config.pbtxt").write_text(
        'name: "half_plus_two"\nmax_batch_size: 4\ndynamic_batching { }\n'
    )
    server = ServerProcess(root, extra_args=["--trace-exporter", "console"]).start()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    try:
        r = httpx.post(
            f"{server.http_url}/v2/models/half_plus_two/infer",
            json={"inputs": [X]},
            headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
            timeout=60,
        )
        assert r.status_code == 200
    finally:
        assert server.stop() is not None
    log = server.log()
    assert f'"trace_id": "0x{trace_id}"' in log
    for name in ('"name": "POST V2Http.infer"', '"name": "queue"', '"name": "compute"'):
        assert name in log
    assert '"parent_id": "0x00f067aa0ba902b7"' in log


def test_json_engine_log_and_rotation(tmp_path: Path) -> None:
    from inferd.observability.logging import Logs

    logs = Logs(log_format="json", log_file=str(tmp_path / "e.log"), max_bytes=300, backup_count=2)
    import logging

    for i in range(20):
        logging.getLogger("inferd.test").info("line %d", i)
    lines = (tmp_path / "e.log").read_text().splitlines()
    entry = json.loads(lines[-1])
    assert entry["message"] == "line 19"
    assert entry["level"] == "INFO"
    assert os.path.exists(tmp_path / "e.log.1")  # rotated by size
    assert logs.tail("engine", 1) == [lines[-1]]


def test_grpc_statistics_and_endpoint_metrics(observed: ServerProcess) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(observed.grpc_address)
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[3.0]], dtype=np.float32))
    assert client.infer("half_plus_two", [x]).as_numpy("y").tolist() == [[3.5]]
    stats = client.get_inference_statistics("half_plus_two", as_json=True)["model_stats"][0]
    http = httpx.get(f"{observed.http_url}/v2/models/half_plus_two/stats", timeout=60).json()
    assert int(stats["inference_count"]) == http["model_stats"][0]["inference_count"] == 8
    assert int(stats["execution_count"]) == 5
    assert int(stats["inference_stats"]["success"]["count"]) == 5
    assert int(stats["inference_stats"]["fail"]["count"]) == 2
    s = _samples(httpx.get(f"{observed.http_url}/metrics", timeout=60).text)
    grpc_infer = {"protocol": "grpc", "endpoint": "ModelInfer", "status": "OK"}
    assert _value(s, "inferd_endpoint_requests_total", **grpc_infer) == 1
    grpc_lines = [e for e in _access_lines(observed) if e["protocol"] == "grpc"]
    infer = [e for e in grpc_lines if e["method"] == "ModelInfer"]
    assert len(infer) == 1
    assert (infer[0]["model"], infer[0]["version"], infer[0]["status"]) == (
        "half_plus_two",
        "1",
        "OK",
    )
    assert int(infer[0]["bytes_in"]) > 0 and int(infer[0]["bytes_out"]) > 0
