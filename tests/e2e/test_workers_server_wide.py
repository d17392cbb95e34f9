"""``--http-workers 3`` (the model host and two frontends): whatever a client observes or sets is
the server's, whichever worker takes its connection.

Every check opens fresh connections (the kernel picks a worker per connection; the ``own``
helpers ask one worker over its socket for what it alone holds, to show the requests did land
on several): the engine and access logs (the last lines, and a follower's ``after`` positions),
statistics and Prometheus metrics, trace and log settings, shared-memory regions (registered
through one connection, used through others, over HTTP and gRPC), sequences (correlation IDs),
the response cache, model control, the repository index, and the dashboard's uptime.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.utils.shared_memory as shm

from inferd.workers.peers import Peers, WorkerRole
from tests.e2e.lifecycle_support import HALF_PLUS_THREE, HALF_PLUS_TWO, write_version
from tests.e2e.test_workers_host import PY_ACC, PY_ACC_CONFIG
from tests.support import ServerProcess, wait_for

WORKERS = 3
M = "half_plus_two"  # tiny: every frontend runs a copy of its own
FRESH = 20  # fresh connections per check: all on one worker has odds 3**-19
TIMEOUT_S = 90.0  # what a request may take on a loaded machine


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("wide") / "models"
    write_version(root / M, 1, HALF_PLUS_TWO)
    write_version(root / "other", 1, HALF_PLUS_THREE)
    write_version(root / "cached", 1, HALF_PLUS_TWO)
    (root / "cached" / "config.pbtxt").write_text(
        'name: "cached"\nmax_batch_size: 4\nresponse_cache { enable: true }'
    )
    (root / "py_acc" / "1").mkdir(parents=True)
    (root / "py_acc" / "1" / "model.py").write_text(PY_ACC)
    # Two instances: a slot for each of two sequences at once (a third would wait for one);
    # a sequence idle for a minute is released (the default, 1 s, is a loaded machine's pause).
    idle = "sequence_batching {\n  max_sequence_idle_microseconds: 60000000"
    config = PY_ACC_CONFIG.replace("sequence_batching {", idle)
    (root / "py_acc" / "config.pbtxt").write_text(f"{config}instance_group [ {{ count: 2 }} ]\n")
    args = ["--http-workers", str(WORKERS), "--model-control-mode", "explicit"]
    args += ["--access-log", "--trace-exporter", "console", "--cache-size", "100000"]
    for name in (M, "cached", "py_acc"):
        args += ["--load-model", name]
    proc = ServerProcess(root, extra_args=args).start()
    yield proc
    proc.stop()


def _fresh(server: ServerProcess, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request on a new connection (the kernel picks a worker per connection)."""
    with httpx.Client(timeout=TIMEOUT_S) as client:
        return client.request(method, f"{server.http_url}{path}", **kwargs)


def _json(server: ServerProcess, method: str, path: str, **kwargs: Any) -> Any:
    r = _fresh(server, method, path, **kwargs)
    assert r.status_code == 200, r.text
    return r.json()


def _body(model: str, value: float, **extra: Any) -> dict[str, Any]:
    name, shape = ("X", [1]) if model == "py_acc" else ("x", [1, 1])
    tensor = {"name": name, "shape": shape, "datatype": "FP32", "data": [value]}
    return {"inputs": [tensor], **extra}


def _run_dir(server: ServerProcess) -> Path:
    found = re.search(r"run folder (\S+)\)", server.log())
    assert found, server.log()
    return Path(found.group(1))


def _own(server: ServerProcess, index: int, message: dict[str, Any]) -> Any:
    """What worker ``index`` alone answers ``message`` (asked over its socket)."""
    peers = Peers(WorkerRole(index, WORKERS, _run_dir(server)))
    return asyncio.run(peers.ask(index, message, TIMEOUT_S))


def _own_lines(server: ServerProcess, index: int, kind: str) -> list[str]:
    message = {"op": "logs", "kind": kind, "after": 0, "upto": None, "count": 1000}
    return [line for _, line in _own(server, index, message)]


def _tagged(lines: list[str], tag: str) -> list[str]:
    """The request ids carrying ``tag``, in the order of the lines."""
    return re.findall(rf"request_id=({re.escape(tag)}-\d+)", "\n".join(lines))


def _infer_tagged(server: ServerProcess, tag: str, count: int) -> list[str]:
    ids = [f"{tag}-{i:02d}" for i in range(count)]
    for i, request_id in enumerate(ids):
        r = _fresh(
            server,
            "POST",
            f"/v2/models/{M}/infer",
            json=_body(M, float(i)),
            headers={"x-request-id": request_id},
        )
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [i * 0.5 + 2.0], r.text
    return ids


def test_the_access_log_holds_every_workers_lines_in_order(server: ServerProcess) -> None:
    tag = f"wide-{uuid.uuid4().hex[:8]}"
    ids = _infer_tagged(server, tag, FRESH)
    # The requests landed on several workers: each keeps only its own lines.
    own = [_tagged(_own_lines(server, i, "access"), tag) for i in range(WORKERS)]
    assert sorted(found for part in own for found in part) == ids
    assert sum(1 for found in own if found) >= 2, own
    for _ in range(10):  # and the log, from any worker, holds them all, in order
        doc = _json(server, "GET", "/v2/logs", params={"kind": "access", "lines": 1000})
        assert _tagged(doc["lines"], tag) == ids


def test_the_engine_log_holds_every_workers_lines(server: ServerProcess) -> None:
    # The supervisor starts each worker; each listens; the host alone loads the models.
    for _ in range(10):
        lines = _json(server, "GET", "/v2/logs", params={"kind": "engine", "lines": 1000})["lines"]
        text = "\n".join(lines)
        assert f"starting {WORKERS} workers on one port" in text, text
        assert len(re.findall(r"worker \d started: pid", text)) == WORKERS, text
        # The model host says it listens for the server; each frontend that it takes connections.
        assert text.count("listening: HTTP") == 1, text
        assert len(re.findall(r"worker \d takes connections", text)) == WORKERS - 1, text
        assert text.count(f"loaded model '{M}' version 1") == 1, text
        assert text.count(f"copied model '{M}' version 1") == WORKERS - 1, text


def test_a_follower_sees_each_line_once_in_order(server: ServerProcess) -> None:
    tag = f"follow-{uuid.uuid4().hex[:8]}"
    after = _json(server, "GET", "/v2/logs", params={"kind": "access", "after": 0})["next"]
    seen: list[str] = []

    def poll() -> bool:
        nonlocal after
        params = {"kind": "access", "lines": 1000, "after": after}
        doc = _json(server, "GET", "/v2/logs", params=params)
        assert doc["next"] >= after
        seen.extend(doc["lines"])
        after = doc["next"]
        return True

    ids: list[str] = []
    for i in range(FRESH // 2):
        ids += _infer_tagged(server, f"{tag}-{i}", 2)
        poll()

    def followed() -> list[str]:
        return re.findall(rf"request_id=({re.escape(tag)}-\d+-\d+)", "\n".join(seen))

    wait_for(lambda: poll() and len(followed()) >= len(ids), "every line followed")
    assert followed() == ids  # each once, in the order they were served


def test_statistics_and_metrics_are_totals(server: ServerProcess) -> None:
    def count() -> int:
        stats = _json(server, "GET", f"/v2/models/{M}/stats")["model_stats"][0]
        return int(stats["inference_stats"]["success"]["count"])

    def metric() -> float:
        text = _fresh(server, "GET", "/metrics").text
        name = f'inferd_request_success_total{{model="{M}",version="1"}}'
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    before, before_metric = count(), metric()
    _infer_tagged(server, "stats", FRESH)
    own = [_own(server, i, {"op": "statistics", "name": M, "version": ""}) for i in range(WORKERS)]
    ran = [int(stats[0]["inference_stats"]["success"]["count"]) if stats else 0 for stats in own]
    assert sum(1 for n in ran if n) >= 2, ran  # several workers ran some (copies and host)
    assert {count() for _ in range(10)} == {before + FRESH}
    for _ in range(5):  # every model's statistics at once: the same totals
        every = _json(server, "GET", "/v2/models/stats")["model_stats"]
        mine = [s for s in every if s["name"] == M]
        assert [s["inference_stats"]["success"]["count"] for s in mine] == [before + FRESH]
    assert {metric() for _ in range(10)} == {before_metric + FRESH}
    for _ in range(5):  # gRPC: a new client is a new connection
        client = triton_grpc.InferenceServerClient(server.grpc_address)
        stats = client.get_inference_statistics(M, as_json=True)["model_stats"][0]
        assert int(stats["inference_stats"]["success"]["count"]) == before + FRESH
        client.close()


def test_trace_and_log_settings_are_the_servers(server: ServerProcess) -> None:
    path = f"/v2/models/{M}/trace/setting"
    changes = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "30"}
    assert _json(server, "POST", path, json=changes)["trace_count"] == "30"
    _infer_tagged(server, "traced", 12)
    # One count for the server: 12 of the 30 traces taken, whichever worker ran the request.
    settings = [_json(server, "GET", path) for _ in range(FRESH)]
    assert {(s["trace_level"][0], s["trace_count"]) for s in settings} == {("TIMESTAMPS", "18")}
    done = _json(server, "POST", path, json={"trace_level": None, "trace_count": None})
    assert done["trace_level"] == ["TIMESTAMPS"]  # the global level again (an exporter is set)
    r = _fresh(server, "POST", "/v2/trace/setting", json={"trace_rate": "7"})
    assert r.status_code == 200 and r.json()["trace_rate"] == "7", r.text
    assert {_json(server, "GET", "/v2/trace/setting")["trace_rate"] for _ in range(FRESH)} == {"7"}
    r = _fresh(server, "POST", "/v2/trace/setting", json={"trace_rate": None})
    assert r.status_code == 200 and r.json()["trace_rate"] == "1", r.text
    for level in (1, 0):
        r = _fresh(server, "POST", "/v2/logging", json={"log_verbose_level": level})
        assert r.status_code == 200 and r.json()["log_verbose_level"] == level, r.text
        levels = {_json(server, "GET", "/v2/logging")["log_verbose_level"] for _ in range(FRESH)}
        assert levels == {level}


def _grpc_x(value: float) -> triton_grpc.InferInput:
    x = triton_grpc.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return x


def test_shared_memory_registered_through_one_connection_serves_every_other(
    server: ServerProcess,
) -> None:
    key_in, key_out = f"/inferd-wide-in-{os.getpid()}", f"/inferd-wide-out-{os.getpid()}"
    region_in = shm.create_shared_memory_region("wide_in", key_in, 4)
    region_out = shm.create_shared_memory_region("wide_out", key_out, 4)
    try:
        shm.set_shared_memory_region(region_in, [np.array([[3.0]], dtype=np.float32)])
        # HTTP: registered once, read by whichever worker takes each request.
        body = {"key": key_in, "offset": 0, "byte_size": 4}
        r = _fresh(server, "POST", "/v2/systemsharedmemory/region/wide_in/register", json=body)
        assert r.status_code == 200, r.text
        params = {"shared_memory_region": "wide_in", "shared_memory_byte_size": 4}
        request = {
            "inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "parameters": params}]
        }
        outputs = {
            tuple(
                _json(server, "POST", f"/v2/models/{M}/infer", json=request)["outputs"][0]["data"]
            )
            for _ in range(FRESH)
        }
        assert outputs == {(3.5,)}
        # gRPC: the output region registered through one client, used through new ones.
        first = triton_grpc.InferenceServerClient(server.grpc_address)
        first.register_system_shared_memory("wide_out", key_out, 4)
        first.close()
        for i in range(FRESH // 2):
            client = triton_grpc.InferenceServerClient(server.grpc_address)
            names = {r.name for r in client.get_system_shared_memory_status().regions.values()}
            assert {"wide_in", "wide_out"} <= names
            x = triton_grpc.InferInput("x", [1, 1], "FP32")
            x.set_shared_memory("wide_in", 4)
            y = triton_grpc.InferRequestedOutput("y")
            y.set_shared_memory("wide_out", 4)
            shm.set_shared_memory_region(region_in, [np.array([[float(i)]], dtype=np.float32)])
            client.infer(M, [x], outputs=[y])
            got = shm.get_contents_as_numpy(region_out, np.float32, [1, 1])
            assert got.tolist() == [[i * 0.5 + 2.0]]
            client.close()
        last = triton_grpc.InferenceServerClient(server.grpc_address)
        last.unregister_system_shared_memory()
        last.close()
        for _ in range(FRESH):
            client = triton_grpc.InferenceServerClient(server.grpc_address)
            assert not client.get_system_shared_memory_status().regions
            client.close()
        statuses = {
            _fresh(server, "GET", "/v2/systemsharedmemory/region/wide_in/status").status_code
            for _ in range(FRESH)
        }
        assert statuses == {404}
    finally:
        shm.destroy_shared_memory_region(region_in)
        shm.destroy_shared_memory_region(region_out)


def test_interleaved_sequences_over_fresh_connections(server: ServerProcess) -> None:
    sums: dict[Any, list[float]] = {7: [], "wide-seq": []}
    for step in range(1, 6):
        for corr in sums:  # two sequences at once, each request on a new connection
            params = {"sequence_id": corr, "sequence_start": step == 1, "sequence_end": step == 5}
            body = _body("py_acc", float(step), parameters=params)
            out = _json(server, "POST", "/v2/models/py_acc/infer", json=body)["outputs"]
            sums[corr].append(out[0]["data"][0])
    assert sums == {7: [1.0, 3.0, 6.0, 10.0, 15.0], "wide-seq": [1.0, 3.0, 6.0, 10.0, 15.0]}
    totals = []
    for step in range(1, 5):  # gRPC: a new client per request
        client = triton_grpc.InferenceServerClient(server.grpc_address)
        x = triton_grpc.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([10.0 * step], dtype=np.float32))
        result = client.infer(
            "py_acc", [x], sequence_id=99, sequence_start=step == 1, sequence_end=step == 4
        )
        totals.append(float(result.as_numpy("SUM")[0]))
        client.close()
    assert totals == [10.0, 30.0, 60.0, 100.0]


def test_one_response_cache_for_the_server(server: ServerProcess) -> None:
    for _ in range(FRESH):
        out = _json(server, "POST", "/v2/models/cached/infer", json=_body("cached", 6.0))
        assert out["outputs"][0]["data"] == [5.0]
    for _ in range(10):
        stats = _json(server, "GET", "/v2/models/cached/stats")["model_stats"][0]
        infer = stats["inference_stats"]
        assert (infer["cache_miss"]["count"], infer["cache_hit"]["count"]) == (1, FRESH - 1)
        assert stats["execution_count"] == 1


def test_model_control_and_the_index_are_the_servers(server: ServerProcess) -> None:
    def ready() -> set[int]:
        return {_fresh(server, "GET", "/v2/models/other/ready").status_code for _ in range(FRESH)}

    def indexes() -> set[tuple[tuple[str, str, str], ...]]:
        return {
            tuple((e["name"], e.get("version", ""), e["state"]) for e in doc)
            for doc in (_json(server, "POST", "/v2/repository/index") for _ in range(10))
        }

    assert ready() == {404}
    assert _fresh(server, "POST", "/v2/repository/models/other/load").status_code == 200
    assert ready() == {200}
    outputs = {
        tuple(
            _json(server, "POST", "/v2/models/other/infer", json=_body(M, 2.0))["outputs"][0][
                "data"
            ]
        )
        for _ in range(FRESH)
    }
    assert outputs == {(4.0,)}
    loaded = {(M, "1", "READY"), ("cached", "1", "READY"), ("py_acc", "1", "READY")}
    assert indexes() == {tuple(sorted(loaded | {("other", "1", "READY")}))}
    for _ in range(5):  # gRPC's index, through new clients
        client = triton_grpc.InferenceServerClient(server.grpc_address)
        models = client.get_model_repository_index(as_json=True)["models"]
        assert {(m["name"], m.get("state", "")) for m in models} >= {("other", "READY")}
        client.close()
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    client.unload_model("other")  # through gRPC this time
    client.close()
    assert ready() == {400}
    unloaded = {e for index in indexes() for e in index if e[0] == "other"}
    assert unloaded == {("other", "1", "UNAVAILABLE")}, unloaded


def test_the_servers_uptime_survives_a_workers_restart(server: ServerProcess) -> None:
    # Last in the module: a frontend is killed and replaced.
    pids = {int(i): int(p) for i, p in re.findall(r"worker (\d+) started: pid (\d+)", server.log())}
    starts = server.log().count("worker 2 started")
    listens = server.log().count("worker 2 takes connections")
    killed_s = time.time()
    os.kill(pids[2], signal.SIGKILL)
    wait_for(lambda: server.log().count("worker 2 started") > starts, "worker 2 restarted")
    wait_for(
        lambda: server.log().count("worker 2 takes connections") > listens, "worker 2 listening"
    )
    for _ in range(FRESH):
        uptime_s = _json(server, "GET", "/v2/dashboard/models")["server"]["uptime_s"]
        # The server started before the kill, whichever worker answers (the replacement too).
        assert time.time() - uptime_s <= killed_s, uptime_s
