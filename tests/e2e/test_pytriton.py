"""inferd.pytriton: PyTriton's Triton, decorators and clients on an in-process inferd server,
called through real sockets by inferd.pytriton's ModelClient and AsyncioModelClient (HTTP and
gRPC) and by tritonclient."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http

from inferd.pytriton.client import (
    AsyncioModelClient,
    DecoupledModelClient,
    ModelClient,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientValueError,
)
from inferd.pytriton.decorators import (
    batch,
    fill_optionals,
    first_value,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
)
from inferd.pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from inferd.pytriton.triton import Triton, TritonConfig
from tests.support import free_port

TIMEOUT_S = 60.0
F32 = np.float32


@batch
def _add_sub(**inputs: np.ndarray) -> dict[str, np.ndarray]:
    a, b = inputs.values()
    return {"add": a + b, "sub": a - b}


@sample
def _scale(x: np.ndarray) -> dict[str, np.ndarray]:  # a model without batching
    return {"y": x * 2}


@batch
@group_by_values("factor")
def _grouped(x: np.ndarray, factor: np.ndarray) -> dict[str, np.ndarray]:
    # Every group holds one factor: the function sees it once.
    assert len(np.unique(factor)) == 1
    return {"y": x * factor[0]}


PADDED_SIZES: list[int] = []


@batch
@pad_batch
def _padded(x: np.ndarray) -> dict[str, np.ndarray]:
    PADDED_SIZES.append(len(x))
    # As in PyTriton, @batch checks the rows against the requests': the padding is dropped.
    return {"y": x[:3] + 1}


@batch
@first_value("power")
def _power(x: np.ndarray, power: Any) -> dict[str, np.ndarray]:
    assert np.isscalar(power) or np.ndim(power) == 0
    return {"y": x**power}


@fill_optionals(offset=np.array([10.0], F32))
@batch
@triton_context
def _offset(x: np.ndarray, offset: np.ndarray, triton_context: Any) -> dict[str, np.ndarray]:
    config = triton_context.model_configs[_offset]
    rows = np.full((len(x), 1), config.max_batch_size, np.int32)
    return {"y": x + offset, "max_batch": rows}


class Tagged:
    """A callable object with a decorated method: one per instance."""

    def __init__(self, tag: int) -> None:
        self.tag = tag

    @batch
    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        return {"tag": np.full((len(x), 1), self.tag, np.int32)}


@batch
def _wrong_dtype(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x.astype(np.float64)}


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    config = TritonConfig(
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
        http_port=free_port(),
        grpc_port=free_port(),
    )
    x = [Tensor(name="x", dtype=F32, shape=(-1,))]
    y = [Tensor(name="y", dtype=F32, shape=(-1,))]
    with Triton(config=config) as server:
        server.bind(
            "AddSub",
            _add_sub,
            [Tensor(dtype=F32, shape=(-1,)), Tensor(dtype=F32, shape=(-1,))],
            [
                Tensor(name="add", dtype=F32, shape=(-1,)),
                Tensor(name="sub", dtype=F32, shape=(-1,)),
            ],
            config=ModelConfig(
                max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=500)
            ),
            strict=True,
        )
        server.bind("Scale", _scale, x, y, config=ModelConfig(batching=False))
        server.bind(
            "Grouped",
            _grouped,
            [*x, Tensor(name="factor", dtype=F32, shape=(1,))],
            y,
            config=ModelConfig(max_batch_size=16),
        )
        server.bind(
            "Padded",
            _padded,
            x,
            y,
            config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=[4])),
        )
        server.bind(
            "Power",
            _power,
            [*x, Tensor(name="power", dtype=F32, shape=(1,))],
            y,
            config=ModelConfig(max_batch_size=8),
        )
        server.bind(
            "Offset",
            _offset,
            [*x, Tensor(name="offset", dtype=F32, shape=(1,), optional=True)],
            [*y, Tensor(name="max_batch", dtype=np.int32, shape=(1,))],
            config=ModelConfig(max_batch_size=8),
        )
        server.bind(
            "Tagged",
            [Tagged(0), Tagged(1)],
            x,
            [Tensor(name="tag", dtype=np.int32, shape=(1,))],
            config=ModelConfig(max_batch_size=8),
        )
        server.bind("Strict", _wrong_dtype, x, y, config=ModelConfig(max_batch_size=8), strict=True)
        yield server


def _urls(triton: Triton) -> list[str]:
    return [f"http://127.0.0.1:{triton.http_port}", f"grpc://127.0.0.1:{triton.grpc_port}"]


def test_model_client_infer_batch_and_sample_over_http_and_grpc(triton: Triton) -> None:
    a = np.array([[1.0, 2.0], [3.0, 4.0]], F32)
    b = np.array([[0.5, 0.5], [1.0, 1.0]], F32)
    for url in _urls(triton):
        with ModelClient(url, "AddSub", init_timeout_s=TIMEOUT_S) as client:
            result = client.infer_batch(a, b)
            np.testing.assert_array_equal(result["add"], a + b)
            np.testing.assert_array_equal(result["sub"], a - b)
            one = client.infer_sample(INPUT_1=a[0], INPUT_2=b[0])
            np.testing.assert_array_equal(one["add"], a[0] + b[0])
            assert [s.name for s in client.model_config.inputs or ()] == ["INPUT_1", "INPUT_2"]
            assert client.model_config.max_batch_size == 64


def test_tritonclient_sees_the_bound_model_as_triton_would(triton: Triton) -> None:
    client = triton_http.InferenceServerClient(
        f"127.0.0.1:{triton.http_port}", network_timeout=TIMEOUT_S
    )
    config = client.get_model_config("AddSub")
    assert config["max_batch_size"] == 64
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    inputs = []
    for name in ("INPUT_1", "INPUT_2"):
        tensor = triton_http.InferInput(name, [1, 3], "FP32")
        tensor.set_data_from_numpy(np.full((1, 3), 2.0, F32))
        inputs.append(tensor)
    result = client.infer("AddSub", inputs)
    np.testing.assert_array_equal(result.as_numpy("add"), np.full((1, 3), 4.0, F32))


def test_a_sample_model_without_batching(triton: Triton) -> None:
    with ModelClient(f"grpc://127.0.0.1:{triton.grpc_port}", "Scale") as client:
        result = client.infer_sample(np.array([1.0, 3.0], F32))
        np.testing.assert_array_equal(result["y"], np.array([2.0, 6.0], F32))
        assert not client.is_batching_supported
        with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
            client.infer_batch(np.array([1.0], F32))


def test_group_by_values_pad_batch_and_first_value(triton: Triton) -> None:
    url = f"http://127.0.0.1:{triton.http_port}"
    with ModelClient(url, "Grouped") as client:
        x = np.array([[1.0], [1.0], [1.0], [1.0]], F32)
        factor = np.array([[2.0], [3.0], [2.0], [5.0]], F32)
        result = client.infer_batch(x=x, factor=factor)
        np.testing.assert_array_equal(result["y"], np.array([[2.0], [3.0], [2.0], [5.0]], F32))
    PADDED_SIZES.clear()
    with ModelClient(url, "Padded") as client:
        result = client.infer_batch(x=np.array([[1.0], [2.0], [3.0]], F32))
        np.testing.assert_array_equal(result["y"], np.array([[2.0], [3.0], [4.0]], F32))
    assert PADDED_SIZES == [4]  # padded up to the preferred batch size
    with ModelClient(url, "Power") as client:
        x = np.array([[2.0], [3.0]], F32)
        result = client.infer_batch(x=x, power=np.array([[2.0], [2.0]], F32))
        np.testing.assert_array_equal(result["y"], x**2)
        with pytest.raises(PyTritonClientInferenceServerError, match="are not equal"):
            client.infer_batch(x=x, power=np.array([[2.0], [3.0]], F32))


def test_fill_optionals_and_triton_context(triton: Triton) -> None:
    with ModelClient(f"grpc://127.0.0.1:{triton.grpc_port}", "Offset") as client:
        x = np.array([[1.0], [2.0]], F32)
        result = client.infer_batch(x=x)
        np.testing.assert_array_equal(result["y"], x + 10)
        np.testing.assert_array_equal(result["max_batch"], np.array([[8], [8]], np.int32))
        given = client.infer_batch(x=x, offset=np.array([[1.0], [1.0]], F32))
        np.testing.assert_array_equal(given["y"], x + 1)


def test_a_list_of_callables_serves_one_instance_each(triton: Triton) -> None:
    url = f"http://127.0.0.1:{triton.http_port}"
    seen: set[int] = set()
    lock = threading.Lock()

    def call() -> None:
        with ModelClient(url, "Tagged") as client:
            for _ in range(20):
                tag = int(client.infer_sample(x=np.array([1.0], F32))["tag"][0])
                with lock:
                    seen.add(tag)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert seen <= {0, 1}
    assert triton.server.model_config("Tagged").instance_group[0].count == 2


def test_strict_mode_rejects_an_output_of_another_dtype(triton: Triton) -> None:
    with ModelClient(f"http://127.0.0.1:{triton.http_port}", "Strict") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="float64, declared float32"):
            client.infer_batch(x=np.array([[1.0]], F32))
        with ModelClient(f"http://127.0.0.1:{triton.http_port}", "AddSub") as other:
            assert other.infer_sample(np.array([1.0], F32), np.array([1.0], F32))["add"][0] == 2.0


def test_asyncio_model_client_over_http_and_grpc(triton: Triton) -> None:
    async def run(url: str) -> dict[str, np.ndarray]:
        async with AsyncioModelClient(url, "AddSub", inference_timeout_s=TIMEOUT_S) as client:
            answers = await asyncio.gather(
                *(
                    client.infer_sample(np.array([float(i)], F32), np.array([1.0], F32))
                    for i in range(8)
                )
            )
            assert [float(a["add"][0]) for a in answers] == [float(i + 1) for i in range(8)]
            return await client.infer_batch(np.ones((2, 1), F32), np.ones((2, 1), F32))

    for url in _urls(triton):
        result = asyncio.run(run(url))
        np.testing.assert_array_equal(result["sub"], np.zeros((2, 1), F32))


def test_a_model_bound_while_serving_loads_at_once(triton: Triton) -> None:
    @batch
    def negate(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"y": -x}

    triton.bind(
        "Negate",
        negate,
        [Tensor(name="x", dtype=F32, shape=(-1,))],
        [Tensor(name="y", dtype=F32, shape=(-1,))],
    )
    with ModelClient(f"grpc://127.0.0.1:{triton.grpc_port}", "Negate") as client:
        np.testing.assert_array_equal(client.infer_sample(x=np.array([2.0], F32))["y"], [-2.0])


def test_a_decoupled_function_streams_its_responses_over_grpc(triton: Triton) -> None:
    @batch
    def count(n: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
        for i in range(int(n.max())):
            yield {"i": np.full((len(n), 1), i, np.int32)}

    triton.bind(
        "Count",
        count,
        [Tensor(name="n", dtype=np.int32, shape=(1,))],
        [Tensor(name="i", dtype=np.int32, shape=(1,))],
        config=ModelConfig(max_batch_size=8, decoupled=True),
    )
    url = f"grpc://127.0.0.1:{triton.grpc_port}"
    with DecoupledModelClient(url, "Count", inference_timeout_s=TIMEOUT_S) as client:
        parts = list(client.infer_sample(n=np.array([3], np.int32)))
        assert [int(p["i"][0]) for p in parts] == [0, 1, 2]
        batches = list(client.infer_batch(n=np.array([[2], [2]], np.int32)))
        assert [p["i"].ravel().tolist() for p in batches] == [[0, 0], [1, 1]]
    with (
        ModelClient(url, "Count") as plain,
        pytest.raises(PyTritonClientInferenceServerError, match="decoupled"),
    ):
        plain.infer_sample(n=np.array([1], np.int32))
    with pytest.raises(PyTritonClientValueError, match="grpc"):
        DecoupledModelClient(f"http://127.0.0.1:{triton.http_port}", "Count")


def test_a_raw_function_gets_requests_with_their_parameters(triton: Triton) -> None:
    from inferd.pytriton.proxy.types import Request

    def scale(requests: list[Request]) -> list[dict[str, np.ndarray]]:
        assert all(isinstance(r, Request) for r in requests)
        return [{"y": r["x"] * float(str(r.parameters.get("factor", 1)))} for r in requests]

    triton.bind(
        "RawScale",
        scale,
        [Tensor(name="x", dtype=F32, shape=(-1,))],
        [Tensor(name="y", dtype=F32, shape=(-1,))],
    )
    with ModelClient(f"http://127.0.0.1:{triton.http_port}", "RawScale") as client:
        result = client.infer_sample(x=np.array([1.0, 2.0], F32), parameters={"factor": 3})
        np.testing.assert_array_equal(result["y"], np.array([3.0, 6.0], F32))
