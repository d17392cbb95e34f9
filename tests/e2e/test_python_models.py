"""Python models end to end: Triton's form over every protocol, BLS, the native form, crashes,
a model's own venv, finalize on unload, batching, broken models, process instances for echo
and ONNX. One server (explicit control mode, every model loaded at start)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from inferd.demo.models import write_demo_repository
from tests.e2e.lifecycle_support import states
from tests.e2e.python_support import make_venv, write_repository
from tests.support import ServerProcess, pending_requests


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("python")
    return {
        "root": root,
        "repo": root / "models",
        "venv": root / "venv",
        "marker": root / "finalized",
        "log": root / "echo.log",
    }


@pytest.fixture(scope="module")
def server(paths: dict[str, Path]) -> Iterator[ServerProcess]:
    demo = paths["root"] / "demo"
    write_demo_repository(demo, models=["half_plus_two"])  # only the small one: fast
    make_venv(paths["venv"])
    write_repository(paths["repo"], demo, paths["venv"], paths["marker"], paths["log"])
    proc = ServerProcess(
        paths["repo"],
        # some models here fail to load on purpose: readiness is not strict
        [
            "--model-control-mode",
            "explicit",
            "--load-model",
            "*",
            "--cache-size",
            "1000000",
            "--strict-readiness=false",
            # versions written after start (a version swap) are code arriving later
            "--allow-python-models",
        ],
    ).start(timeout_s=180)
    assert proc.proc is not None
    yield proc
    workers = _descendants(proc.proc.pid)  # the zygote, and every worker it forked
    assert proc.stop() == 0
    # No worker outlives the server, and each one finalized its model on the way out.
    _wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in workers))
    assert "add_sub: cleaning up" in proc.log()


def _infer(
    server: ServerProcess, model: str, inputs: list[dict[str, Any]], **kw: Any
) -> httpx.Response:
    body = {"inputs": inputs, **kw}
    return httpx.post(f"{server.http_url}/v2/models/{model}/infer", json=body, timeout=60)


def _fp32(name: str, values: list[float], shape: list[int] | None = None) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": shape or [len(values)], "data": values}


def _outputs(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return {o["name"]: o["data"] for o in response.json()["outputs"]}


def _stats(server: ServerProcess, model: str) -> dict[str, Any]:
    (stats,) = httpx.get(f"{server.http_url}/v2/models/{model}/stats", timeout=60).json()[
        "model_stats"
    ]
    return dict(stats)


ONES = [1.0, 1.0, 1.0, 1.0]


def test_add_sub_over_v2_http_json(server: ServerProcess) -> None:
    r = _infer(server, "add_sub", [_fp32("INPUT0", [1, 2, 3, 4]), _fp32("INPUT1", ONES)])
    assert _outputs(r) == {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}
    only = _infer(
        server,
        "add_sub",
        [_fp32("INPUT0", [1, 2, 3, 4]), _fp32("INPUT1", ONES)],
        outputs=[{"name": "OUTPUT1"}],
    )
    assert _outputs(only) == {"OUTPUT1": [0, 1, 2, 3]}


def test_add_sub_over_v2_http_binary_with_tritonclient(server: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(server.http_address)
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, dtype=np.float32)
    inputs = [
        triton_http.InferInput("INPUT0", [4], "FP32"),
        triton_http.InferInput("INPUT1", [4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=True)
    outputs = [
        triton_http.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")
    ]
    result = client.infer("add_sub", inputs, outputs=outputs)
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()
    metadata = client.get_model_metadata("add_sub")
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]


def test_add_sub_over_v2_grpc(server: ServerProcess) -> None:
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    a = np.array([5, 6, 7, 8], dtype=np.float32)
    inputs = [
        triton_grpc.InferInput("INPUT0", [4], "FP32"),
        triton_grpc.InferInput("INPUT1", [4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("add_sub", inputs)
    assert result.as_numpy("OUTPUT0").tolist() == [10, 12, 14, 16]
    assert result.as_numpy("OUTPUT1").tolist() == [0, 0, 0, 0]
    assert client.is_model_ready("add_sub")


def test_add_sub_over_tf_serving_rest(server: ServerProcess) -> None:
    body = {"inputs": {"INPUT0": [1.0, 2.0, 3.0, 4.0], "INPUT1": [4.0, 3.0, 2.0, 1.0]}}
    r = httpx.post(f"{server.http_url}/v1/models/add_sub:predict", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == {"OUTPUT0": [5, 5, 5, 5], "OUTPUT1": [-3, -1, 1, 3]}


def test_request_details_and_any_bytes_reach_the_model(server: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(server.http_address)
    data = np.array([b"a\x00b", bytes([0xFF, 0xFE, 0x00]), b""], dtype=object)
    tensor = triton_http.InferInput("DATA", [3], "BYTES")
    tensor.set_data_from_numpy(data, binary_data=True)
    outputs = [triton_http.InferRequestedOutput(n, binary_data=True) for n in ("ECHO", "INFO")]
    result = client.infer(
        "introspect", [tensor], outputs=outputs, request_id="req-7", parameters={"answer": 42}
    )
    assert result.as_numpy("ECHO").tolist() == data.tolist()
    info = json.loads(result.as_numpy("INFO")[0])
    assert info["id"] == "req-7"
    assert info["parameters"]["answer"] == 42
    assert info["outputs"] == ["ECHO", "INFO"]
    assert info["args"]["model_name"] == "introspect"
    assert info["args"]["model_version"] == "1"
    assert info["args"]["model_instance_kind"] == "CPU"
    assert info["args"]["model_instance_device_id"] == "0"
    assert info["args"]["model_repository"].endswith("introspect")
    assert info["config_parameters"] == {"custom": {"string_value": "yes"}}
    grpc_client = triton_grpc.InferenceServerClient(server.grpc_address)
    tensor = triton_grpc.InferInput("DATA", [3], "BYTES")
    tensor.set_data_from_numpy(data)
    assert grpc_client.infer("introspect", [tensor]).as_numpy("ECHO").tolist() == data.tolist()


def test_errors_from_execute_are_clean_and_the_worker_lives_on(server: ServerProcess) -> None:
    def call(x: int) -> httpx.Response:
        return _infer(
            server, "failing", [{"name": "X", "datatype": "INT32", "shape": [1], "data": [x]}]
        )

    raised = call(1)
    assert raised.status_code == 500
    assert "ValueError: x must not be 1" in raised.json()["error"]
    assert "model.py line" in raised.json()["error"]
    refused = call(2)
    assert refused.status_code == 400
    assert refused.json()["error"] == "x=2 is not allowed"
    exception = call(3)
    assert exception.status_code == 500 and "three is right out" in exception.json()["error"]
    assert _outputs(call(5)) == {"Y": [6]}
    assert "restart" not in server.log().split("model 'failing'")[-1]


def test_a_crashed_worker_fails_its_request_and_comes_back(server: ServerProcess) -> None:
    def call(x: int) -> httpx.Response:
        return _infer(
            server, "crasher", [{"name": "X", "datatype": "INT32", "shape": [1], "data": [x]}]
        )

    assert _outputs(call(1)) == {"Y": [10]}
    assert _outputs(call(2)) == {"Y": [20]}
    crashed = call(3)
    assert crashed.status_code == 500
    message = crashed.json()["error"]
    assert "model 'crasher/1'" in message and "SIGKILL" in message and "restarted" in message
    assert _outputs(call(4)) == {"Y": [40]}  # a fresh worker
    assert _outputs(call(5)) == {"Y": [50]}
    assert httpx.get(f"{server.http_url}/v2/models/crasher/ready", timeout=60).status_code == 200
    assert _outputs(_infer(server, "add_sub", [_fp32("INPUT0", ONES), _fp32("INPUT1", ONES)]))


def test_bls_calls_an_onnx_model_and_a_python_model(server: ServerProcess) -> None:
    out = _outputs(_infer(server, "bls", [_fp32("X", [4.0])]))
    assert out["Y"] == [4.0]  # half_plus_two(4) = 0.5 * 4 + 2
    assert out["SUM"] == [4.0, 5.0, 6.0, 7.0]  # add_sub(4 * [4], [0, 1, 2, 3])
    assert "no_such_model" in out["ERROR"][0]
    assert _stats(server, "half_plus_two")["inference_count"] >= 1


def test_async_bls_runs_both_calls(server: ServerProcess) -> None:
    out = _outputs(_infer(server, "bls_async", [_fp32("X", [2.0])]))
    assert out["Y"] == [3.0]
    assert out["SUM"] == [2.0, 1.0, 0.0, -1.0]


async def _concurrently(server: ServerProcess, model: str, bodies: list[Any]) -> list[Any]:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as client:
        posts = [client.post(f"/v2/models/{model}/infer", json=b) for b in bodies]
        return list(await asyncio.gather(*posts))


def test_requests_to_a_python_model_are_batched(server: ServerProcess) -> None:
    bodies = [{"inputs": [_fp32("X", [float(i)], [1, 1])]} for i in range(4)]
    responses = asyncio.run(_concurrently(server, "batch_sizes", bodies))
    outs = [_outputs(r) for r in responses]
    assert [o["Y"] for o in outs] == [[0.0], [2.0], [4.0], [6.0]]
    assert [o["N"] for o in outs] == [[4]] * 4  # execute() saw all four requests at once
    stats = _stats(server, "batch_sizes")
    assert stats["inference_count"] == 4 and stats["execution_count"] == 1
    assert [b["batch_size"] for b in stats["batch_stats"]] == [4]


def test_the_native_form_gets_whole_batches(server: ServerProcess) -> None:
    metadata = httpx.get(f"{server.http_url}/v2/models/native", timeout=60).json()
    assert metadata["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 3]}]
    assert [(o["name"], o["datatype"]) for o in metadata["outputs"]] == [
        ("Y", "FP32"),
        ("ROWS", "INT64"),
    ]
    bodies = [{"inputs": [_fp32("X", [i, i, i], [1, 3])]} for i in range(3)]
    bodies.append({"inputs": [_fp32("X", [7, 7, 7], [1, 3])]})
    outs = [_outputs(r) for r in asyncio.run(_concurrently(server, "native", bodies))]
    assert [o["Y"] for o in outs] == [[0, 0, 0], [3, 3, 3], [6, 6, 6], [21, 21, 21]]
    assert [o["ROWS"] for o in outs] == [[4]] * 4
    assert _stats(server, "native")["execution_count"] == 1


def test_the_readmes_native_model_loads_without_a_config(server: ServerProcess) -> None:
    """A version folder holding ``model.py`` is a Python model: the README's ``scale``."""
    metadata = httpx.get(f"{server.http_url}/v2/models/scale", timeout=60).json()
    assert metadata["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 3]}]
    assert _outputs(_infer(server, "scale", [_fp32("X", [1, 2, 3], [1, 3])]))["Y"] == [3, 6, 9]


def test_a_model_runs_in_its_own_venv(server: ServerProcess, paths: dict[str, Path]) -> None:
    where = _outputs(_infer(server, "in_venv", [_fp32("X", [1.0])]))["WHERE"]
    assert where == [str(paths["venv"]), "hello from the venv"]


def test_broken_models_are_unavailable_with_the_reason(server: ServerProcess) -> None:
    index = {
        e["name"]: e
        for e in httpx.post(f"{server.http_url}/v2/repository/index", timeout=60).json()
    }
    assert index["add_sub"]["state"] == "READY"
    for name, reason in (
        ("no_file", "model.py does not exist"),
        ("bad_import", "model.py does not import: ModuleNotFoundError"),
        ("no_class", "defines no class TritonPythonModel"),
    ):
        assert index[name]["state"] == "UNAVAILABLE", index[name]
        assert reason in index[name]["reason"], index[name]
        assert name in index[name]["reason"] or "model.py" in index[name]["reason"]


def test_unload_waits_for_work_then_finalizes(
    server: ServerProcess, paths: dict[str, Path]
) -> None:
    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as client:
            held = asyncio.create_task(  # executes until the gate file exists
                client.post("/v2/models/finalizer/infer", json={"inputs": [_fp32("X", [0.5])]})
            )
            await _until(lambda: pending_requests(server, "finalizer") == 1)
            unload = asyncio.create_task(client.post("/v2/repository/models/finalizer/unload"))
            await _until(lambda: states(server, "finalizer").get("1") == "UNLOADING")
            assert not held.done() and not unload.done()  # the unload waits for the request
            Path(f"{paths['marker']}.gate").touch()
            return await held, await unload

    held, unload = asyncio.run(scenario())
    assert unload.status_code == 200, unload.text
    assert _outputs(held) == {"Y": [0.5]}  # the request in flight was answered
    assert paths["marker"].read_text() == "finalized after 1"
    assert httpx.get(f"{server.http_url}/v2/models/finalizer/ready", timeout=60).status_code != 200


async def _until(check: Any, timeout_s: float = 60.0) -> None:
    """Poll ``check`` (a blocking call: in a thread) until true, off the event loop."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


def test_process_instances_for_the_echo_backend(
    server: ServerProcess, paths: dict[str, Path]
) -> None:
    bodies = [{"id": f"r{i}", "inputs": [_fp32("INPUT0", [i, i], [1, 2])]} for i in range(6)]
    outs = [_outputs(r) for r in asyncio.run(_concurrently(server, "echo_proc", bodies))]
    assert [o["OUTPUT0"] for o in outs] == [[i, i] for i in range(6)]
    lines = [json.loads(line) for line in paths["log"].read_text().splitlines()]
    pids = {line["pid"] for line in lines}
    assert server.proc is not None and server.proc.pid not in pids
    assert sorted(i for line in lines for i in line["request_ids"]) == [f"r{i}" for i in range(6)]


def test_process_instances_for_an_onnx_model(server: ServerProcess) -> None:
    out = _outputs(_infer(server, "onnx_proc", [_fp32("x", [1.0, 2.0], [2, 1])]))
    assert out == {"y": [2.5, 3.0]}
    assert server.proc is not None
    assert len(_descendants(server.proc.pid)) >= 10  # a worker per instance of each such model


def test_a_version_swap_finalizes_the_old_version(
    server: ServerProcess, paths: dict[str, Path]
) -> None:
    def version() -> Any:
        return _outputs(_infer(server, "swapper", [_fp32("X", [0.0])]))["VERSION"]

    assert version() == [1.0]
    new = paths["repo"] / "swapper" / "2"
    new.mkdir()
    source = (paths["repo"] / "swapper" / "1" / "model.py").read_text()
    (new / "model.py").write_text(source.replace("VERSION = 1.0", "VERSION = 2.0"))
    r = httpx.post(f"{server.http_url}/v2/repository/models/swapper/load", timeout=60)
    assert r.status_code == 200, r.text
    assert version() == [2.0]
    _wait_for(lambda: (paths["root"] / "swapper-finalized-1").exists())
    assert not (paths["root"] / "swapper-finalized-2").exists()


def test_warmup_and_the_response_cache_work_for_python_models(server: ServerProcess) -> None:
    assert "warmed up model 'cached_py' version 1: 1 execution(s)" in server.log()
    body = [_fp32("X", [3.0], [1, 1])]
    first, second = _infer(server, "cached_py", body), _infer(server, "cached_py", body)
    assert _outputs(first) == _outputs(second) == {"Y": [6.0], "N": [1]}  # N: one request
    stats = _stats(server, "cached_py")
    assert stats["inference_stats"]["cache_hit"]["count"] == 1
    assert stats["execution_count"] == 1


def test_python_models_are_in_the_metrics(server: ServerProcess) -> None:
    text = httpx.get(f"{server.http_url}/metrics", timeout=60).text
    assert 'inferd_request_success_total{model="add_sub",version="1"}' in text


def _descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (workers are forked by a zygote, its child)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found: list[int] = []
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found += frontier
    return found


def _wait_for(check: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.05)
