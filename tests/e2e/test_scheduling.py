"""Dynamic batching, priorities, queue policy, timeouts, warmup, instances and the cache.

Each behaviour is proven by counts from the statistics API and by the values each caller
gets back, never by timing. A gated echo model (one row per batch) keeps its single instance
busy until the test opens the gate, so that later requests really wait in the queue; the test
sends each next request once the server counts the previous one in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support import ServerProcess, wait_for

HPT = "half_plus_two"
ROW = np.ones((1, 1), dtype=np.float32).tobytes()
# A JSON body, or one pre-encoded (bytes, headers) so that sending costs the client nothing.
Body = dict[str, Any] | tuple[bytes, dict[str, str]]


def _gated(gate: Path, queue: str) -> str:
    """An echo model whose executions wait until ``gate`` exists, one row per batch; each
    execution's request ids are appended to ``gate`` + ``.executions`` (``_executed``: the
    request-level form of the echo backend sees them)."""
    return (
        'backend: "echo"\nmax_batch_size: 1\n'
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
        "instance_group [{ count: 1 kind: KIND_CPU }]\n"
        f"dynamic_batching {{ {queue} }}\n"
        f'parameters {{ key: "gate_file" value: {{ string_value: "{gate}" }} }}\n'
        f'parameters {{ key: "log_file" value: {{ string_value: "{gate}.executions" }} }}\n'
        'parameters { key: "request_level" value: { string_value: "true" } }\n'
    )


def _executed(server: ServerProcess, model: str) -> list[str]:
    """The request ids of a gated model's executions, in the order the model ran them."""
    log = server.repository.parent / f"{model}.gate.executions"
    lines = log.read_text().splitlines() if log.exists() else []
    return [i for line in lines for i in json.loads(line)["request_ids"]]


GATED = {
    "slow": "priority_levels: 2 default_priority_level: 2 "
    "default_queue_policy { max_queue_size: 3 }",
    "slow_full": "default_queue_policy { max_queue_size: 3 }",
    "slow_timeout": "default_queue_policy { default_timeout_microseconds: 20000 "
    "allow_timeout_override: true }",
    "slow_timeout_default": "default_queue_policy { default_timeout_microseconds: 20000 "
    "allow_timeout_override: true }",
    "slow_delay": "default_queue_policy { default_timeout_microseconds: 20000 "
    "timeout_action: DELAY }",
}


def _model(root: Path, name: str, source: Path, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    os.link(source, root / name / "1" / "model.onnx")
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')


@pytest.fixture(scope="module")
def sched_server(
    demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("sched") / "models"
    hpt = demo_repo / HPT / "1" / "model.onnx"
    digits = demo_repo / "digits" / "1" / "model.onnx"
    # A batch goes when it reaches its preferred size, however the requests are spread in time:
    # the queue delay (a minute) is only the bound of a test gone wrong.
    batching = (
        "dynamic_batching { max_queue_delay_microseconds: 60000000 preferred_batch_size: %s }"
    )
    _model(root, "batched", hpt, "max_batch_size: 8\n" + batching % "[4]")
    _model(root, "digits_batched", digits, "max_batch_size: 16\n" + batching % "[2]")
    for name, queue in GATED.items():
        (root / name / "1").mkdir(parents=True)
        gate = root.parent / f"{name}.gate"
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n' + _gated(gate, queue))
    _model(
        root,
        "warm",
        hpt,
        'max_batch_size: 4\nmodel_warmup [{ name: "zeros" batch_size: 2 count: 3 '
        'inputs { key: "x" value: { data_type: TYPE_FP32 dims: [1] zero_data: true } } }]',
    )
    _model(
        root,
        "warm_broken",
        hpt,
        'max_batch_size: 4\nmodel_warmup [{ name: "file" batch_size: 1 '
        'inputs { key: "x" value: { data_type: TYPE_FP32 dims: [1] input_data_file: "nope" } } }]',
    )
    # A gated echo model: its first execution holds the only instance for as long as the test
    # needs, longer than any wait before a queued request starts watching its client
    # (protocols.transport.watch.WATCH_AFTER_S).
    (root / "held" / "1").mkdir(parents=True)
    held = _gated(root.parent / "held.gate", "")
    (root / "held" / "config.pbtxt").write_text(f'name: "held"\n{held}')
    _model(root, "cached", hpt, "max_batch_size: 4\nresponse_cache { enable: true }")
    _model(root, "two", hpt, "max_batch_size: 4\ninstance_group [{ count: 2, kind: KIND_CPU }]")
    # warm_broken fails to load on purpose: ready means "startup is done", not "all READY".
    args = ["--cache-size", "100000", "--strict-readiness=false"]
    server = ServerProcess(root, extra_args=args).start()
    yield server
    server.stop()


def _x(values: list[float], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "x", "shape": [len(values), 1], "datatype": "FP32", "data": values}]
    }
    body.update(extra)
    return body


def _row(request_id: str = "", **params: Any) -> tuple[bytes, dict[str, str]]:
    """One row for a gated model as a binary tensor (the binary tensor data extension)."""
    tensor: dict[str, object] = {"name": "INPUT0", "shape": [1, 1], "datatype": "FP32"}
    tensor["parameters"] = {"binary_data_size": len(ROW)}
    header: dict[str, Any] = {"inputs": [tensor]}
    if request_id:
        header["id"] = request_id
    if params:
        header["parameters"] = params
    head = json.dumps(header).encode()
    return head + ROW, {"Inference-Header-Content-Length": str(len(head))}


def _kwargs(body: Body) -> dict[str, Any]:
    if isinstance(body, dict):
        return {"json": body}
    return {"content": body[0], "headers": body[1]}


def _post(server: ServerProcess, model: str, body: Body) -> httpx.Response:
    return httpx.post(f"{server.http_url}/v2/models/{model}/infer", timeout=60, **_kwargs(body))


def _stats(server: ServerProcess, model: str) -> dict[str, Any]:
    r = httpx.get(f"{server.http_url}/v2/models/{model}/stats", timeout=60)
    assert r.status_code == 200, r.text
    (stats,) = r.json()["model_stats"]
    return dict(stats)


async def _post_all(
    server: ServerProcess, model: str, bodies: Sequence[Body], gap_s: float = 0.0
) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as client:
        tasks = []
        for body in bodies:
            post = client.post(f"/v2/models/{model}/infer", **_kwargs(body))
            tasks.append(asyncio.create_task(post))
            await asyncio.sleep(gap_s)
        return list(await asyncio.gather(*tasks))


def test_requests_are_batched_and_split(sched_server: ServerProcess) -> None:
    bodies = [_x([1.0]), _x([2.0, 3.0]), _x([10.0])]
    responses = asyncio.run(_post_all(sched_server, "batched", bodies))
    outs = [r.json()["outputs"][0] for r in responses]
    assert [o["data"] for o in outs] == [[2.5], [3.0, 3.5], [7.0]]
    assert [o["shape"] for o in outs] == [[1, 1], [2, 1], [1, 1]]
    stats = _stats(sched_server, "batched")
    assert stats["execution_count"] == 1  # three requests, one execution of 4 rows
    assert stats["inference_count"] == 4
    assert [b["batch_size"] for b in stats["batch_stats"]] == [4]
    assert stats["inference_stats"]["success"]["count"] == 3


def test_only_compatible_requests_share_a_batch(
    sched_server: ServerProcess, demo_repo: Path
) -> None:
    row = np.zeros(64).tolist()
    bodies = []
    for output in ("label", "probabilities", "label", "probabilities"):
        bodies.append(
            {
                "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": row}],
                "outputs": [{"name": output}],
            }
        )
    responses = asyncio.run(_post_all(sched_server, "digits_batched", bodies))
    names = [[o["name"] for o in r.json()["outputs"]] for r in responses]
    assert names == [["label"], ["probabilities"], ["label"], ["probabilities"]]
    stats = _stats(sched_server, "digits_batched")
    assert stats["execution_count"] == 2
    assert sorted(b["batch_size"] for b in stats["batch_stats"]) == [2]
    assert stats["batch_stats"][0]["compute_infer"]["count"] == 2


def _in_flight(server: ServerProcess, model: str) -> int:
    """The server's count of the model's requests in flight (queued or executing)."""
    text = httpx.get(f"{server.http_url}/metrics", timeout=60).text
    prefix = f'inferd_pending_requests{{model="{model}",'
    lines = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return int(float(lines[0].rsplit(" ", 1)[1])) if lines else 0


async def _gated_run(
    server: ServerProcess, model: str, bodies: Sequence[Body], until: str = "sent"
) -> list[httpx.Response]:
    """Send ``bodies`` one by one, each once the one before is counted in flight by the server
    (the first executes and holds the gate, the next wait in the queue) or was answered (a full
    queue refuses at once); then open the gate: at once (``until="sent"``), once the last request
    was answered (``"answered"``: it timed out in the queue), or 0.2 s later (``"delayed"``: past
    a 20 ms queue timeout whose action is to keep waiting). The answers, in the order sent."""
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as client:

        async def send(body: Body) -> httpx.Response:
            return await client.post(f"/v2/models/{model}/infer", **_kwargs(body))

        tasks: list[asyncio.Task[httpx.Response]] = []
        for i, body in enumerate(bodies):
            in_flight = _in_flight(server, model)
            tasks.append(asyncio.create_task(send(body)))
            # Bounds a test gone wrong: each count is a /metrics scrape over every serving
            # process, which takes seconds on a loaded host (the gate waits 120 s too).
            deadline = time.monotonic() + 100
            while not tasks[-1].done() and _in_flight(server, model) <= in_flight:
                assert time.monotonic() < deadline, f"{model}: request {i} never arrived"
                await asyncio.sleep(0.01)
        if until == "answered":
            await asyncio.wait_for(asyncio.shield(tasks[-1]), 30)
        elif until == "delayed":
            await asyncio.sleep(0.2)
        (server.repository.parent / f"{model}.gate").touch()
        answers = list(await asyncio.gather(*tasks))
    return answers


def test_priorities_jump_the_queue(sched_server: ServerProcess) -> None:
    # first, low, low, high; the order the model ran them (answers may come back in another:
    # with several workers each travels back through the frontend that took its connection)
    bodies = [_row("r0"), _row("r1"), _row("r2"), _row("r3", priority=1)]
    answers = asyncio.run(_gated_run(sched_server, "slow", bodies))
    assert [r.status_code for r in answers] == [200] * 4
    assert _executed(sched_server, "slow") == ["r0", "r3", "r1", "r2"]


def test_bad_priority_and_timeout_parameters(sched_server: ServerProcess) -> None:
    url = f"{sched_server.http_url}/v2/models"
    r = _post(sched_server, "slow", _row(priority=3))
    assert r.status_code == 400
    assert "priority 3 is out of range 1..2" in r.json()["error"]
    r = _post(sched_server, "slow", _row(timeout="soon"))
    assert r.status_code == 400
    assert "parameter 'timeout' must be a non-negative integer" in r.json()["error"]
    r = httpx.post(f"{url}/batched/infer", json=_x([1.0], parameters={"priority": 1}), timeout=60)
    assert r.status_code == 400
    assert "has no priority levels" in r.json()["error"]
    r = httpx.post(f"{url}/two/infer", json=_x([1.0], parameters={"timeout": -1}), timeout=60)
    assert r.status_code == 400


def test_full_queue_rejects_at_once(sched_server: ServerProcess) -> None:
    answers = asyncio.run(_gated_run(sched_server, "slow_full", [_row()] * 7))
    codes = [r.status_code for r in answers]
    # One runs (the batcher may hold one more, taken off the queue for the instance's next
    # batch), three wait in the queue: the rest are refused while the gate is still closed.
    assert codes[:4] == [200] * 4 and set(codes[4:]) <= {200, 503}, codes
    assert codes.count(503) >= 2 and codes[-1] == 503, codes
    for r in answers:
        if r.status_code == 503:
            assert "queue of model 'slow_full/1' is full (max_queue_size 3" in r.json()["error"]


def test_queue_timeout_reject_and_delay(sched_server: ServerProcess) -> None:
    # The second request waits past its 20 ms in the queue while the first holds the gate.
    answers = asyncio.run(_gated_run(sched_server, "slow_timeout", [_row()] * 2, "answered"))
    assert [r.status_code for r in answers] == [200, 504]
    assert "timed out after 20000 us in the queue" in answers[1].json()["error"]
    # A request may ask for a shorter timeout than the default only; 0 keeps the default.
    bodies = [_row(), _row(timeout=0)]
    answers = asyncio.run(_gated_run(sched_server, "slow_timeout_default", bodies, "answered"))
    assert [r.status_code for r in answers] == [200, 504]
    # DELAY: past its timeout the request stays queued and runs.
    answers = asyncio.run(_gated_run(sched_server, "slow_delay", [_row()] * 2, "delayed"))
    assert [r.status_code for r in answers] == [200, 200]
    assert _stats(sched_server, "slow_delay")["execution_count"] == 2


def test_disconnected_client_is_dropped_from_the_queue(sched_server: ServerProcess) -> None:
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    ).encode()
    request = (
        f"POST /v2/models/held/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    before = _stats(sched_server, "held")["execution_count"]
    with socket.create_connection(("127.0.0.1", sched_server.http_port)) as first:
        first.sendall(request)  # keeps the only instance busy until the gate opens
        wait_for(lambda: _in_flight(sched_server, "held") == 1, "the first request executing")
        with socket.create_connection(("127.0.0.1", sched_server.http_port)) as gone:
            gone.sendall(request)  # waits in the queue ...
            wait_for(lambda: _in_flight(sched_server, "held") == 2, "the second one queued")
        # ... and its client hangs up: the server drops it while the first still executes.
        wait_for(lambda: _in_flight(sched_server, "held") == 1, "the second one dropped")
        (sched_server.repository.parent / "held.gate").touch()
        first.settimeout(60)
        answer = first.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b'"data":[1.0]' in answer
    wait_for(lambda: _in_flight(sched_server, "held") == 0, "the first request answered")
    after = _stats(sched_server, "held")
    assert after["execution_count"] == before + 1  # the abandoned request never ran
    assert after["inference_stats"]["success"]["count"] == 1


def test_warmup_runs_before_ready(sched_server: ServerProcess) -> None:
    assert "warmed up model 'warm' version 1: 3 execution(s)" in sched_server.log()
    assert _stats(sched_server, "warm")["execution_count"] == 0  # warmup is not traffic
    r = httpx.post(f"{sched_server.http_url}/v2/models/warm/infer", json=_x([2.0]), timeout=60)
    assert r.json()["outputs"][0]["data"] == [3.0]
    index = {
        e["name"]: e
        for e in httpx.post(f"{sched_server.http_url}/v2/repository/index", timeout=60).json()
    }
    assert index["warm_broken"]["state"] == "UNAVAILABLE"
    assert "cannot read input_data_file" in index["warm_broken"]["reason"]


def test_cache_hit_returns_same_bytes_without_executing(sched_server: ServerProcess) -> None:
    url = f"{sched_server.http_url}/v2/models/cached/infer"
    first = httpx.post(url, json=_x([7.0, 8.0]), timeout=60)
    second = httpx.post(url, json=_x([7.0, 8.0]), timeout=60)
    other = httpx.post(url, json=_x([7.0, 9.0]), timeout=60)
    assert first.content == second.content
    assert other.json()["outputs"][0]["data"] == [5.5, 6.5]
    stats = _stats(sched_server, "cached")
    assert stats["execution_count"] == 2
    assert stats["inference_stats"]["cache_hit"]["count"] == 1
    assert stats["inference_stats"]["cache_miss"]["count"] == 2


def test_instance_groups(sched_server: ServerProcess) -> None:
    assert "loaded model 'two' version 1 (onnxruntime, 2 instance(s))" in sched_server.log()
    bodies = [_x([float(i)]) for i in range(12)]
    responses = asyncio.run(_post_all(sched_server, "two", bodies))
    assert [r.json()["outputs"][0]["data"][0] for r in responses] == [
        0.5 * i + 2 for i in range(12)
    ]
    config = httpx.get(f"{sched_server.http_url}/v2/models/two/config", timeout=60).json()
    assert config["instance_group"][0]["count"] == 2


def test_statistics_shape(sched_server: ServerProcess) -> None:
    r = httpx.get(f"{sched_server.http_url}/v2/models/stats", timeout=60)
    names = {s["name"] for s in r.json()["model_stats"]}
    assert {"batched", "cached", "slow", "two"} <= names
    one = httpx.get(
        f"{sched_server.http_url}/v2/models/batched/versions/1/stats", timeout=60
    ).json()
    stat = one["model_stats"][0]
    assert set(stat["inference_stats"]) == {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    }
    assert stat["last_inference"] > 0
