"""What every framework backend's end-to-end test checks: one model served over v2 HTTP, gRPC
and TF Serving REST gives the framework's own answers, and a dynamic batcher batches it."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from tests.support import ServerProcess

BATCHING = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 300000 }\n"


def write_config(root: Path, name: str, config: str) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')


def version_dir(root: Path, name: str) -> Path:
    path = root / name / "1"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _v2_datatype(array: np.ndarray) -> str:
    if array.dtype == object:
        return "BYTES"
    return {
        "float32": "FP32",
        "float64": "FP64",
        "int64": "INT64",
        "int32": "INT32",
        "bool": "BOOL",
        "uint8": "UINT8",
    }[array.dtype.name]


def infer_v2_http(server: ServerProcess, model: str, inputs: dict[str, np.ndarray]) -> Any:
    client = triton_http.InferenceServerClient(server.http_address)
    tensors = []
    for name, array in inputs.items():
        tensor = triton_http.InferInput(name, list(array.shape), _v2_datatype(array))
        tensor.set_data_from_numpy(array, binary_data=True)
        tensors.append(tensor)
    return client.infer(model, tensors)


def infer_grpc(server: ServerProcess, model: str, inputs: dict[str, np.ndarray]) -> Any:
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    tensors = []
    for name, array in inputs.items():
        tensor = triton_grpc.InferInput(name, list(array.shape), _v2_datatype(array))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return client.infer(model, tensors)


def _json(array: np.ndarray) -> Any:
    if array.dtype == object:
        return [{"b64": base64.b64encode(v).decode()} for v in array.reshape(-1)]
    return array.tolist()


def infer_tfserving(
    server: ServerProcess, model: str, inputs: dict[str, np.ndarray]
) -> dict[str, Any]:
    """TF Serving REST, columnar: ``{"inputs": {...}}`` -> ``{"outputs": ...}``."""
    body = {"inputs": {name: _json(array) for name, array in inputs.items()}}
    r = httpx.post(f"{server.http_url}/v1/models/{model}:predict", json=body, timeout=60)
    assert r.status_code == 200, r.text
    outputs: dict[str, Any] = r.json()["outputs"]
    return outputs


def assert_same(got: Any, expected: np.ndarray, *, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Values equal to the framework's own, whatever the protocol's shape for them."""
    array = np.asarray(got)
    if expected.dtype == object or array.dtype == object:
        assert [bytes(v) for v in array.reshape(-1)] == [bytes(v) for v in expected.reshape(-1)]
        return
    assert array.size == expected.size, (array.shape, expected.shape)
    array = array.reshape(expected.shape)
    if expected.dtype.kind in "iub":
        np.testing.assert_array_equal(array, expected)
    else:
        np.testing.assert_allclose(array, expected, rtol=rtol, atol=atol)


def check_all_protocols(
    server: ServerProcess,
    model: str,
    inputs: dict[str, np.ndarray],
    expected: dict[str, np.ndarray],
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> None:
    """The model's answers over v2 HTTP (binary), gRPC and TF Serving REST equal ``expected``."""
    http_result = infer_v2_http(server, model, inputs)
    grpc_result = infer_grpc(server, model, inputs)
    for name, want in expected.items():
        assert_same(http_result.as_numpy(name), want, rtol=rtol, atol=atol)
        assert_same(grpc_result.as_numpy(name), want, rtol=rtol, atol=atol)
    tf_inputs = {n: a for n, a in inputs.items() if a.dtype != object}
    if len(tf_inputs) == len(inputs):
        tf_outputs = infer_tfserving(server, model, inputs)
        if len(expected) == 1 and not isinstance(tf_outputs, dict):
            tf_outputs = {next(iter(expected)): tf_outputs}
        for name, want in expected.items():
            if want.dtype != object:
                assert_same(tf_outputs[name], want, rtol=rtol, atol=atol)


async def _post_rows(server: ServerProcess, model: str, bodies: list[dict[str, Any]]) -> list[Any]:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as client:
        posts = [client.post(f"/v2/models/{model}/infer", json=b) for b in bodies]
        return list(await asyncio.gather(*posts))


def check_batching(
    server: ServerProcess,
    model: str,
    name: str,
    rows: np.ndarray,
    output: str,
    expected: np.ndarray,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> dict[str, Any]:
    """One request per row, all at once: each gets its own answer, in fewer executions."""
    datatype = _v2_datatype(rows)
    bodies = [
        {
            "inputs": [
                {
                    "name": name,
                    "shape": [1, *row.shape],
                    "datatype": datatype,
                    "data": row.reshape(-1).tolist(),
                }
            ],
            "outputs": [{"name": output}],
        }
        for row in rows
    ]
    responses = asyncio.run(_post_rows(server, model, bodies))
    for response, want in zip(responses, expected, strict=True):
        assert response.status_code == 200, response.text
        (out,) = response.json()["outputs"]
        assert out["shape"][0] == 1
        assert_same(np.asarray(out["data"]), np.asarray(want)[None, ...], rtol=rtol, atol=atol)
    r = httpx.get(f"{server.http_url}/v2/models/{model}/stats", timeout=60)
    assert r.status_code == 200, r.text
    (stats,) = r.json()["model_stats"]
    assert stats["inference_count"] == len(rows)
    assert 1 <= stats["execution_count"] < len(rows)
    return dict(stats)


def unavailable_reason(server: ServerProcess, model: str) -> str:
    """The reason a model failed to load, as every request for it reports it."""
    r = httpx.get(f"{server.http_url}/v2/models/{model}/ready", timeout=60)
    assert r.status_code == 400, r.text
    r = httpx.get(f"{server.http_url}/v2/models/{model}", timeout=60)
    assert r.status_code in (400, 503), r.text
    error: str = r.json()["error"]
    return error
