"""``--http-workers 2``: two serving processes on one port, one server to every client.

Inference works through the shared HTTP and gRPC ports; metrics, statistics and the
dashboard's traffic are totals over both workers; a load, unload, upload or routing change
made through either worker reaches the other (every answer from many fresh connections
agrees); a killed worker is replaced and replays the changes; SIGTERM drains both.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.utils.shared_memory as shm

from inferd.workers.peers import Peers, WorkerRole
from tests.e2e.lifecycle_support import HALF_PLUS_THREE, HALF_PLUS_TWO, write_version
from tests.support import ServerProcess, wait_for

M = "half_plus_two"
CONNECTIONS = 40  # fresh connections per check: all on one worker has odds 2**-39


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("workers") / "models"
    write_version(root / M, 1, HALF_PLUS_TWO)
    write_version(root / "other", 1, HALF_PLUS_THREE)
    args = ["--http-workers", "2", "--model-control-mode", "explicit", "--load-model", M]
    proc = ServerProcess(root, extra_args=args).start()
    wait_for(lambda: _metric(proc, "inferd_workers") == 2, "both workers")
    yield proc
    proc.stop()


def _fresh(server: ServerProcess, method: str, path: str, **kwargs: object) -> httpx.Response:
    """One request on a new connection (the kernel picks a worker per connection)."""
    with httpx.Client(timeout=30) as client:
        return client.request(method, f"{server.http_url}{path}", **kwargs)  # type: ignore[arg-type]


def _answers(server: ServerProcess, path: str) -> set[int]:
    return {_fresh(server, "GET", path).status_code for _ in range(CONNECTIONS)}


def _metric(server: ServerProcess, name: str, labels: str = "") -> float | None:
    text = _fresh(server, "GET", "/metrics").text
    found = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def _body(value: float) -> dict[str, object]:
    return {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}


def test_inference_and_totals(server: ServerProcess) -> None:
    labels = f'{{model="{M}",version="1"}}'
    before = _metric(server, "inferd_request_success_total", labels) or 0.0
    for i in range(CONNECTIONS):
        r = _fresh(server, "POST", f"/v2/models/{M}/infer", json=_body(float(i)))
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [i * 0.5 + 2.0]
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    x = triton_grpc.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[4.0]], dtype=np.float32))
    assert client.infer(M, [x]).as_numpy("y").tolist() == [[4.0]]
    sent = CONNECTIONS + 1
    assert _metric(server, "inferd_request_success_total", labels) == before + sent
    assert _metric(server, "inferd_workers") == 2
    stats = _fresh(server, "GET", f"/v2/models/{M}/stats").json()["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [(M, "1")]
    assert stats[0]["inference_stats"]["success"]["count"] == before + sent
    assert stats[0]["inference_count"] == before + sent
    grpc_stats = client.get_inference_statistics(M, as_json=True)["model_stats"][0]
    assert int(grpc_stats["inference_stats"]["success"]["count"]) == before + sent
    client.close()


def _own_executions(server: ServerProcess, index: int, model: str) -> int:
    """How many executions of ``model`` worker ``index`` ran itself (its own statistics)."""
    found = re.search(r"run folder (\S+)\)", server.log())
    assert found, server.log()
    peers = Peers(WorkerRole(index, 2, Path(found.group(1))))
    message = {"op": "statistics", "name": model, "version": ""}
    stats: list[dict[str, Any]] = asyncio.run(peers.ask(index, message, 10))
    return int(stats[0]["execution_count"])


def test_a_tiny_unbatched_model_runs_in_every_worker(server: ServerProcess) -> None:
    # half_plus_two is a few hundred bytes, runs on a thread and batches nothing: forwarding it
    # would cost more than running it, so worker 1 runs a copy; the model host loaded it once.
    log = server.log()
    assert log.count(f"loaded model '{M}' version 1") == 1, log
    assert f"worker 1 copied model '{M}' version 1" in log, log
    before = _own_executions(server, 1, M)
    for i in range(CONNECTIONS):
        r = _fresh(server, "POST", f"/v2/models/{M}/infer", json=_body(float(i)))
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [i * 0.5 + 2.0]
    assert _own_executions(server, 1, M) > before  # worker 1 ran some itself


def test_the_dashboard_sees_every_request(server: ServerProcess) -> None:
    sent = _metric(server, "inferd_request_success_total", f'{{model="{M}",version="1"}}')

    def settled() -> bool:
        doc = _fresh(server, "GET", "/v2/dashboard/series").json()
        # Every request here ran alone: one execution of batch size 1 each, on either worker.
        executions = float(doc["models"].get(M, {}).get("batch_sizes", {}).get("1", 0))
        # A second's row is given once every worker has sampled it: up to a second later.
        return executions == sent and bool(doc["server"]["rows"])

    wait_for(settled, f"{sent} executions and a row per second in the dashboard's series")
    doc = _fresh(server, "GET", "/v2/dashboard/series").json()
    rows = doc["server"]["rows"]
    assert rows and all(float(r[0]).is_integer() for r in rows)  # one row per whole second


def test_load_and_unload_reach_every_worker(server: ServerProcess) -> None:
    assert _answers(server, "/v2/models/other/ready") == {404}  # not loaded anywhere
    r = _fresh(server, "POST", "/v2/repository/models/other/load")
    assert r.status_code == 200, r.text
    assert _answers(server, "/v2/models/other/ready") == {200}
    outputs = {
        tuple(
            _fresh(server, "POST", "/v2/models/other/infer", json=_body(2.0)).json()["outputs"][0][
                "data"
            ]
        )
        for _ in range(CONNECTIONS)
    }
    assert outputs == {(4.0,)}
    indexes = {
        tuple((e["name"], e.get("version", ""), e["state"]) for e in r.json())
        for r in (_fresh(server, "POST", "/v2/repository/index") for _ in range(CONNECTIONS))
    }
    assert indexes == {((M, "1", "READY"), ("other", "1", "READY"))}, indexes
    r = _fresh(server, "POST", "/v2/repository/models/other/unload")
    assert r.status_code == 200, r.text
    assert _answers(server, "/v2/models/other/ready") == {400}  # unloaded everywhere


def test_upload_and_routing_reach_every_worker(server: ServerProcess) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for version in (1, 2):
            info = tarfile.TarInfo(f"{version}/model.onnx")
            info.size = len(HALF_PLUS_THREE)
            tar.addfile(info, io.BytesIO(HALF_PLUS_THREE))
    r = _fresh(server, "PUT", "/v2/repository/models/uploaded", content=buffer.getvalue())
    assert r.status_code == 200, r.text
    assert _answers(server, "/v2/models/uploaded/versions/2/ready") == {200}
    r = _fresh(
        server, "POST", "/v2/repository/models/uploaded/labels", json={"labels": {"stable": 2}}
    )
    assert r.status_code == 200, r.text
    for _ in range(CONNECTIONS):
        routing = _fresh(server, "GET", "/v2/models/uploaded/routing").json()
        assert routing["labels"] == {"stable": 2}


def test_shared_memory_regions_reach_every_worker(server: ServerProcess) -> None:
    key = f"/inferd-workers-{os.getpid()}"
    handle = shm.create_shared_memory_region("in", key, 4)
    try:
        shm.set_shared_memory_region(handle, [np.array([[3.0]], dtype=np.float32)])
        body = {"key": key, "offset": 0, "byte_size": 4}
        r = _fresh(server, "POST", "/v2/systemsharedmemory/region/in/register", json=body)
        assert r.status_code == 200, r.text
        request = {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1, 1],
                    "datatype": "FP32",
                    "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 4},
                }
            ]
        }
        outputs = {
            tuple(
                _fresh(server, "POST", f"/v2/models/{M}/infer", json=request).json()["outputs"][0][
                    "data"
                ]
            )
            for _ in range(CONNECTIONS)
        }
        assert outputs == {(3.5,)}  # 3 / 2 + 2, read from the region by either worker
        r = _fresh(server, "POST", "/v2/systemsharedmemory/region/in/unregister")
        assert r.status_code == 200, r.text
        assert _answers(server, "/v2/systemsharedmemory/region/in/status") == {404}
    finally:
        shm.destroy_shared_memory_region(handle)


def test_log_settings_reach_every_worker(server: ServerProcess) -> None:
    r = _fresh(server, "POST", "/v2/logging", json={"log_verbose_level": 1})
    assert r.status_code == 200 and r.json()["log_verbose_level"] == 1, r.text
    levels = {_fresh(server, "GET", "/v2/logging").json()["log_verbose_level"] for _ in range(40)}
    assert levels == {1}
    r = _fresh(server, "POST", "/v2/logging", json={"log_verbose_level": 0})
    assert r.status_code == 200, r.text
    levels = {_fresh(server, "GET", "/v2/logging").json()["log_verbose_level"] for _ in range(40)}
    assert levels == {0}


def test_a_killed_worker_is_replaced_and_catches_up(server: ServerProcess) -> None:
    r = _fresh(server, "POST", "/v2/repository/models/other/load")
    assert r.status_code == 200, r.text
    pids = [int(p) for p in re.findall(r"worker 1 started: pid (\d+)", server.log())]
    assert pids, server.log()
    os.kill(pids[-1], signal.SIGKILL)
    wait_for(lambda: len(re.findall(r"worker 1 started", server.log())) == len(pids) + 1, "restart")
    wait_for(lambda: _metric(server, "inferd_workers") == 2, "the replacement serving")
    assert _answers(server, "/v2/models/other/ready") == {200}  # replayed from the journal
    assert _answers(server, f"/v2/models/{M}/ready") == {200}


def test_sigterm_drains_every_worker(server: ServerProcess) -> None:
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    log = server.log()
    assert log.count("drained in") == 2, log
    assert log.count("server stopped") == 2, log


def test_auto_serves_from_one_process_on_two_cores(tmp_path: Path) -> None:
    """On a machine of two cores the default (auto) is one serving process: no supervisor, no
    frontend, the model run where the request arrived."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores to pin the server to")
    root = tmp_path / "models"
    write_version(root / M, 1, HALF_PLUS_TWO)
    pinned = tmp_path / "python-on-two-cores"  # the interpreter, pinned to two cores
    pinned.write_text(
        f"#!{sys.executable}\nimport os, sys\nos.sched_setaffinity(0, {cores[:2]})\n"
        f"os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"
    )
    pinned.chmod(0o755)
    server = ServerProcess(root, env={"INFERD_HTTP_WORKERS": "auto"}, python=str(pinned))
    server.start()
    try:
        assert server.proc is not None
        answer = httpx.post(f"{server.http_url}/v2/models/{M}/infer", json=_body(3.0), timeout=30)
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [3.5]
        assert psutil.Process(server.proc.pid).children(recursive=True) == []
        assert sorted(psutil.Process(server.proc.pid).cpu_affinity()) == cores[:2]
        assert "HTTP workers" not in server.log()
    finally:
        server.stop()
