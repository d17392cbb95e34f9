"""``--http-workers 2``: the models live once, in worker 0 (the model host); worker 1 forwards
(``--http-workers-copy-bytes 0``: tiny models too; ``test_workers`` has them copied).

A dynamic batcher forms one batch of requests that came through both workers; every model is
loaded once, and the frontend holds no runtime and no model process; the response cache and a
sequence's state are one per server (a sequence may use a fresh connection per request); a
killed host is replaced, replays the repository changes, and the frontend serves again.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.workers.peers import Peers, WorkerRole
from tests.e2e.lifecycle_support import HALF_PLUS_THREE, HALF_PLUS_TWO, write_version
from tests.support import ServerProcess, wait_for

BATCH = 16  # requests in the one batch; all through one worker has odds 2**-15
PY_ACC = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            total = (pb_utils.get_input_tensor_by_name(r, "ACC_IN").as_numpy()
                     + pb_utils.get_input_tensor_by_name(r, "X").as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", total), pb_utils.Tensor("ACC_OUT", total)]))
        return responses
"""
PY_ACC_CONFIG = """name: "py_acc"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
}
"""


REPEAT_CONFIG = """name: "repeat"
backend: "python"
max_batch_size: 0
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""
REPEAT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(count):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def _config(root: Path, name: str, text: str) -> None:
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{text}')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("host") / "models"
    write_version(root / "shared", 1, HALF_PLUS_TWO)
    # A batch goes out when it holds BATCH requests, or after 60 s: one batch per worker would
    # make the test wait that long, and show two executions.
    _config(
        root,
        "shared",
        f"max_batch_size: {BATCH}\ndynamic_batching {{ preferred_batch_size: [{BATCH}] "
        "max_queue_delay_microseconds: 60000000 }",
    )
    write_version(root / "cached", 1, HALF_PLUS_TWO)
    _config(root, "cached", "max_batch_size: 4\nresponse_cache { enable: true }")
    write_version(root / "other", 1, HALF_PLUS_THREE)
    (root / "py_acc" / "1").mkdir(parents=True)
    (root / "py_acc" / "1" / "model.py").write_text(PY_ACC)
    (root / "py_acc" / "config.pbtxt").write_text(PY_ACC_CONFIG)
    (root / "repeat" / "1").mkdir(parents=True)
    (root / "repeat" / "1" / "model.py").write_text(REPEAT)
    (root / "repeat" / "config.pbtxt").write_text(REPEAT_CONFIG)
    args = ["--http-workers", "2", "--model-control-mode", "explicit", "--cache-size", "100000"]
    args += ["--http-workers-copy-bytes", "0"]  # every model once, tiny ones too
    for name in ("shared", "cached", "py_acc", "repeat"):
        args += ["--load-model", name]
    proc = ServerProcess(root, extra_args=args).start()
    yield proc
    proc.stop()


def _fresh(server: ServerProcess, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request on a new connection (the kernel picks a worker per connection)."""
    with httpx.Client(timeout=90) as client:
        return client.request(method, f"{server.http_url}{path}", **kwargs)


def _x(model: str, values: list[float], **extra: Any) -> dict[str, Any]:
    name, shape = ("X", [1]) if model == "py_acc" else ("x", [len(values), 1])
    body: dict[str, Any] = {
        "inputs": [{"name": name, "shape": shape, "datatype": "FP32", "data": values}]
    }
    return body | extra


def _pids(server: ServerProcess) -> dict[int, int]:
    """The pid of each worker now (the last started)."""
    return {int(i): int(p) for i, p in re.findall(r"worker (\d+) started: pid (\d+)", server.log())}


def _own(server: ServerProcess, index: int, model: str) -> dict[str, Any]:
    """One worker's own statistics of ``model`` (not the totals), asked over its socket."""
    found = re.search(r"run folder (\S+)\)", server.log())
    assert found, server.log()
    peers = Peers(WorkerRole(index, 2, Path(found.group(1))))
    message = {"op": "statistics", "name": model, "version": ""}
    stats: list[dict[str, Any]] = asyncio.run(peers.ask(index, message, 10))
    return stats[0]


def _children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == pid:
                found.append(int(proc.name))
    return found


def test_one_batch_holds_the_requests_of_both_workers(server: ServerProcess) -> None:
    def one(value: float) -> list[float]:
        r = _fresh(server, "POST", "/v2/models/shared/infer", json=_x("shared", [value]))
        assert r.status_code == 200, r.text
        data: list[float] = r.json()["outputs"][0]["data"]
        return data

    with ThreadPoolExecutor(BATCH) as pool:
        answers = list(pool.map(one, [float(i) for i in range(BATCH)]))
    assert answers == [[i * 0.5 + 2.0] for i in range(BATCH)]
    stats = _fresh(server, "GET", "/v2/models/shared/stats").json()["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (BATCH, 1)
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (BATCH, 1)
    ]
    assert stats["inference_stats"]["success"]["count"] == BATCH
    # Requests a frontend sent as one (workers.rows) still count one by one.
    assert stats["inference_stats"]["queue"]["count"] == BATCH
    host, frontend = _own(server, 0, "shared"), _own(server, 1, "shared")
    # Each worker answered some of the requests; the host alone executed them, in one batch.
    served = [s["inference_stats"]["success"]["count"] for s in (host, frontend)]
    assert sum(served) == BATCH and min(served) > 0, served
    assert (host["execution_count"], frontend["execution_count"]) == (1, 0)


def test_each_model_loads_once_and_the_frontend_holds_none(server: ServerProcess) -> None:
    log = server.log()
    for name in ("shared", "cached", "py_acc", "repeat"):
        assert log.count(f"loaded model '{name}' version 1") == 1, log
    pids = _pids(server)
    maps = Path(f"/proc/{pids[1]}/maps").read_text()
    assert "onnxruntime" not in maps  # no runtime in the frontend
    assert _children(pids[1]) == []  # and no model process
    assert _children(pids[0])  # the Python model's worker process is the host's
    rss = {i: int(re.findall(r"VmRSS:\s+(\d+)", Path(f"/proc/{p}/status").read_text())[0])
           for i, p in pids.items()}  # fmt: skip
    assert rss[1] < rss[0]


def test_one_response_cache_for_the_server(server: ServerProcess) -> None:
    for _ in range(10):
        r = _fresh(server, "POST", "/v2/models/cached/infer", json=_x("cached", [4.0]))
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [4.0], r.text
    stats = _fresh(server, "GET", "/v2/models/cached/stats").json()["model_stats"][0]
    infer = stats["inference_stats"]
    assert (infer["cache_miss"]["count"], infer["cache_hit"]["count"]) == (1, 9)
    assert stats["execution_count"] == 1


def test_a_sequence_may_use_a_new_connection_per_request(server: ServerProcess) -> None:
    sums = []
    for step in range(1, 6):
        params = {"sequence_id": 42, "sequence_start": step == 1, "sequence_end": step == 5}
        body = _x("py_acc", [float(step)], parameters=params)
        r = _fresh(server, "POST", "/v2/models/py_acc/infer", json=body)
        assert r.status_code == 200, r.text
        sums.append(r.json()["outputs"][0]["data"][0])
    assert sums == [1.0, 3.0, 6.0, 10.0, 15.0]  # one state, on the host


def test_a_decoupled_model_streams_through_either_worker(server: ServerProcess) -> None:
    for count in range(8):
        url = f"{server.http_url}/v2/models/repeat/generate_stream"
        with (
            httpx.Client(timeout=30) as client,
            client.stream("POST", url, json={"COUNT": count}) as response,
        ):
            assert response.status_code == 200
            events = [
                json.loads(line.removeprefix("data: "))
                for line in response.iter_lines()
                if line.startswith("data: ")
            ]
        assert [e["OUT"] for e in events] == list(range(count))


def test_a_killed_host_is_replaced_and_replays_the_changes(server: ServerProcess) -> None:
    r = _fresh(server, "POST", "/v2/repository/models/other/load")
    assert r.status_code == 200, r.text
    before = _pids(server)
    os.kill(before[0], signal.SIGKILL)
    wait_for(lambda: _pids(server)[0] != before[0], "the host to be restarted")
    wait_for(lambda: server.log().count("worker 1 linked to the model host") == 2, "the relink")

    def everywhere(path: str) -> set[int]:
        return {_fresh(server, "GET", path).status_code for _ in range(40)}

    wait_for(lambda: everywhere("/v2/models/other/ready") == {200}, "'other' on every worker")
    assert everywhere("/v2/models/shared/ready") == {200}
    answers = {
        tuple(_fresh(server, "POST", "/v2/models/other/infer", json=_x("other", [2.0])).json()[
            "outputs"][0]["data"])
        for _ in range(20)
    }  # fmt: skip
    assert answers == {(4.0,)}
    assert _pids(server)[1] == before[1]  # the frontend kept running
    assert "cannot reach the model host" not in _fresh(server, "GET", "/v2/models/other").text


def test_a_host_that_cannot_start_stops_the_frontends_too(tmp_path: Path) -> None:
    # The frontend waits for the host's models; the host cannot bind, so the supervisor stops
    # every worker, and the waiting frontend stops with it.
    (tmp_path / "models").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--model-repository", str(tmp_path / "models"), "--http-workers", "2"]
        args += ["--http-address", "127.0.0.1", "--http-port", str(port), "--grpc-port", "0"]
        done = subprocess.run(
            [sys.executable, "-m", "inferd", "serve", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "RUST_BACKTRACE": "0"},
        )
    assert done.returncode == 2, done.stderr
    assert f"cannot serve HTTP on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
